"""Shapes of ingest that once made one client stall the engine for every run (issue 35,
class 3), against a real sidecar, with another run's ingest timed while they run.

- ``checkpoint_flood``: one run reports a checkpoint at every step, ``batch`` steps and
  their checkpoints a request (the ledger re-judged every entry on each add: 46.5 s for
  the last 1,000 of 20,000);
- ``walk_back``: a run of ``steps`` x ``ranks`` is resumed again and again, each new
  attempt (a new token) starting one step earlier (the resume replayed the run's whole
  history: seconds a 250-byte record);
- ``ranks_at_rate``: ``ranks`` ranks post their own step records, one a request, every
  rank at ``rate`` steps a second (a per-record pass over every rank: 5 ms a record at 256
  ranks, over a second of sidecar CPU a training step).

Each returns an ``AttackReport``: every attack request's records and seconds (the engine's
time for it, as the attacker is the only one sending much), the sidecar's CPU over the
attack, and the ingest latency of a ``Victim``, another run posting one step record every
``interval`` s meanwhile. bench/chaos.py ``--sections cpu`` prints them; the tests assert
the operation counts behind them (tests/pipeline/test_cpu_bounds.py).

Example::

    with SidecarProcess(tmp) as sc:
        print(checkpoint_flood(sc.url, sc.proc.pid, checkpoints=2000, batch=500).line())
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import psutil

TIMEOUT = 600.0


@dataclass
class Latencies:
    """Request latencies, in seconds."""

    seconds: list[float] = field(default_factory=list)

    def pct(self, p: float) -> float:
        if not self.seconds:
            return float("nan")
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    def line(self) -> str:
        if not self.seconds:
            return "no requests"
        return (f"p50 {1e3 * self.pct(50):.0f} ms, p99 {1e3 * self.pct(99):.0f} ms, "
                f"max {1e3 * max(self.seconds):.0f} ms ({len(self.seconds)} requests)")


class Victim:
    """Another run's ingest during an attack: one step record every ``interval`` s, each
    POST timed (a request that fails counts as its time to failure)."""

    def __init__(self, url: str, run_id: str = "victim", interval: float = 0.05) -> None:
        self.url, self.run_id, self.interval = url, run_id, interval
        self.latencies = Latencies()
        self.failures = 0
        self._step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Victim:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(timeout=TIMEOUT) as http:
            while not self._stop.is_set():
                self._step += 1
                t0 = time.perf_counter()
                try:
                    r = http.post(self.url + "/v1/records", json={"records": [
                        {"kind": "step", "run_id": self.run_id, "step": self._step,
                         "time": time.time(), "loss": 2.0, "step_time": 0.05}]})
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                took = time.perf_counter() - t0
                self.latencies.seconds.append(took)
                self.failures += not ok
                self._stop.wait(max(self.interval - took, 0.0))


@dataclass
class AttackReport:
    name: str
    requests: list[tuple[int, float]] = field(default_factory=list)  # (records, seconds)
    victim: Latencies = field(default_factory=Latencies)
    cpu_seconds: float = 0.0  # the sidecar's, over the attack
    wall_seconds: float = 0.0
    note: str = ""

    @property
    def records(self) -> int:
        return sum(n for n, _ in self.requests)

    @property
    def worst_per_record_ms(self) -> float:
        return max((1e3 * s / n for n, s in self.requests if n), default=float("nan"))

    def line(self) -> str:
        n, s = max(self.requests, key=lambda r: r[1]) if self.requests else (0, 0.0)
        last_n, last_s = self.requests[-1] if self.requests else (0, 0.0)
        return (f"{self.name}: {len(self.requests)} requests, {self.records} records; worst "
                f"per-record {self.worst_per_record_ms:.2f} ms; slowest request {s:.2f} s "
                f"({n} records), last {last_s:.2f} s ({last_n}); sidecar CPU "
                f"{self.cpu_seconds:.1f} s over {self.wall_seconds:.1f} s"
                f"{'; ' + self.note if self.note else ''}; other run's ingest meanwhile: "
                f"{self.victim.line()}")


def _post(http: httpx.Client, url: str, records: list[dict]) -> float:
    t0 = time.perf_counter()
    r = http.post(url + "/v1/records", json={"records": records})
    took = time.perf_counter() - t0
    if r.status_code != 200 or r.json().get("rejected"):
        raise RuntimeError(f"attack request refused: {r.status_code} {r.text[:300]}")
    return took


def _cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _step(run_id: str, step: int, rank: int = 0, attempt: str | None = None,
          t: float | None = None) -> dict:
    rec = {"kind": "step", "run_id": run_id, "rank": rank, "step": step,
           "time": t if t is not None else 1_000_000.0 + step, "loss": 2.0,
           "grad_norm": 1.0, "step_time": 0.3, "data_time": 0.01, "compute_time": 0.2,
           "sync_wait_time": 0.09}
    if attempt is not None:
        rec["attempt"] = attempt
    return rec


def checkpoint_flood(url: str, pid: int, checkpoints: int = 20_000, batch: int = 1000,
                     interval: float = 0.05) -> AttackReport:
    """One run saves at every step: ``batch`` steps and their checkpoints a request."""
    report = AttackReport(f"checkpoint flood ({checkpoints:,} checkpoints, {batch:,} a "
                          "request with their steps)")
    cpu0, t0 = _cpu(pid), time.perf_counter()
    with httpx.Client(timeout=TIMEOUT) as http, Victim(url, interval=interval) as victim:
        for first in range(1, checkpoints + 1, batch):
            records: list[dict] = []
            for s in range(first, min(first + batch, checkpoints + 1)):
                records.append(_step("flood", s))
                records.append({"kind": "checkpoint", "run_id": "flood", "step": s,
                                "time": 1_000_000.0 + s + 0.5, "path": f"/ckpt/step-{s}.pt"})
            report.requests.append((len(records), _post(http, url, records)))
    report.victim = victim.latencies
    report.cpu_seconds, report.wall_seconds = _cpu(pid) - cpu0, time.perf_counter() - t0
    return report


def walk_back(url: str, pid: int, steps: int = 2000, ranks: int = 8, walks: int = 50,
              batch: int = 2000, interval: float = 0.05) -> AttackReport:
    """A run of ``steps`` x ``ranks`` (sent first, not timed), then ``walks`` new attempts,
    each a single record one step earlier than the last, after the attempt before ended."""
    report = AttackReport(f"walk-back resumes ({walks} attempts, one step back each, on "
                          f"{steps:,} steps x {ranks} ranks)")
    with httpx.Client(timeout=TIMEOUT) as http:
        http.post(url + "/v1/records", json={"records": [
            {"kind": "run", "run_id": "walk", "rank": r, "attempt": "a0"}
            for r in range(ranks)]}).raise_for_status()
        history = [_step("walk", s, r, "a0") for s in range(1, steps + 1)
                   for r in range(ranks)]
        for i in range(0, len(history), batch):
            _post(http, url, history[i:i + batch])
        cpu0, t0 = _cpu(pid), time.perf_counter()
        with Victim(url, interval=interval) as victim:
            for k in range(1, walks + 1):
                # The attempt before ends (a relaunch follows its process's end: a new
                # attempt does not replace a live one); the resume is what is timed.
                _post(http, url, [{"kind": "end", "run_id": "walk", "step": steps - k + 1,
                                   "time": time.time(), "status": "failed",
                                   "attempt": f"walk-{k - 1}" if k > 1 else "a0"}])
                report.requests.append((1, _post(http, url, [
                    _step("walk", steps - k, 0, f"walk-{k}", t=time.time())])))
    report.victim = victim.latencies
    report.cpu_seconds, report.wall_seconds = _cpu(pid) - cpu0, time.perf_counter() - t0
    first = report.requests[0][1] if report.requests else float("nan")
    mean = statistics.mean(s for _, s in report.requests) if report.requests else float("nan")
    report.note = f"first resume {first:.2f} s, mean {mean:.2f} s"
    return report


def ranks_at_rate(url: str, pid: int, ranks: int = 256, steps: int = 30, rate: float = 1.0,
                  warmup: int = 25, interval: float = 0.05,
                  gpu: dict | None = None) -> AttackReport:
    """``ranks`` ranks each post their step record, one a request, all at once every
    1/``rate`` s; ``warmup`` steps first (windows fill), then ``steps`` timed. ``gpu``: the
    records' GPU readings (default: every GPU at its power cap, as H100s run)."""
    gpu = gpu if gpu is not None else {"throttle_power": 1, "utilization": 0.97}
    report = AttackReport(f"{ranks} ranks at {rate:g} step/s ({steps} steps timed after "
                          f"{warmup})")
    run = f"ranks-{ranks}"
    with httpx.Client(timeout=TIMEOUT) as setup:
        for first in range(0, ranks, 128):  # max_new_ranks_per_request is 256
            setup.post(url + "/v1/records", json={"records": [
                {"kind": "run", "run_id": run, "rank": r,
                 "labels": {"hostname": f"node-{r // 8}"}, "hardware": {"world_size": ranks}}
                for r in range(first, min(first + 128, ranks))]}).raise_for_status()
    local = threading.local()

    def send(rank: int, step: int) -> float:
        http = getattr(local, "http", None)
        if http is None:
            http = local.http = httpx.Client(timeout=TIMEOUT)
        rec = _step(run, step, rank, t=time.time())
        rec["gpu"] = gpu
        return _post(http, url, [rec])

    cpu0 = t0 = slowest = 0.0
    victim = Victim(url, interval=interval)
    with ThreadPoolExecutor(max_workers=min(ranks, 64)) as pool:
        for step in range(1, warmup + steps + 1):
            if step == warmup + 1:
                cpu0, t0 = _cpu(pid), time.perf_counter()
                victim.__enter__()
            began = time.perf_counter()
            took = list(pool.map(lambda r, s=step: send(r, s), range(ranks)))
            burst = time.perf_counter() - began
            if step > warmup:  # the step's records, served one after another
                report.requests.append((ranks, burst))
                slowest = max(slowest, *took)
            time.sleep(max(1.0 / rate - burst, 0.0))  # the load's rate
    victim.__exit__()
    report.victim = victim.latencies
    report.cpu_seconds, report.wall_seconds = _cpu(pid) - cpu0, time.perf_counter() - t0
    report.note = (f"sidecar CPU {1e3 * report.cpu_seconds / steps:.0f} ms a training step, "
                   f"{1e6 * report.cpu_seconds / max(report.records, 1):.0f} us a record; "
                   f"slowest rank's request {1e3 * slowest:.0f} ms (a 'request' above is "
                   "one step: every rank's record)")
    return report
