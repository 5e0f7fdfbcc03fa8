"""Sustained load: many concurrent runs posting per-layer steps at a fixed rate, while the
sidecar's memory, files, threads, ingest latency and /metrics render time are sampled.

Open loop: every run posts a batch on its own schedule whatever the latency was, as
trainers do; a slow sidecar shows as latency, not as a lower offered rate.

Example::

    report = soak(sidecar.url, sidecar.proc.pid, seconds=600, runs=50, rate=400)
    print(report.table())
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field

import httpx

from monitor_agent.records import wire
from tests.reliability.process_probe import Footprint, ProcessProbe

LAYER_STATS = ("grad_norm", "grad_mean", "grad_std", "grad_max_abs", "grad_zero_frac",
               "param_norm", "update_norm")
NDJSON_GZIP = {"content-type": "application/x-ndjson", "content-encoding": "gzip"}


def step_record(run_id: str, step: int, layers: int) -> dict:
    """A GPT-shaped step: scalars plus ``layers`` tensors x 7 statistics."""
    rec = {"kind": "step", "run_id": run_id, "step": step, "time": time.time(),
           "loss": 3.0 - 1e-4 * step, "lr": 3e-4, "grad_norm": 1.0, "param_norm": 50.0,
           "update_norm": 0.01, "tokens": 8192, "samples": 16, "step_time": 0.2,
           "tokens_per_second": 40960.0}
    if layers:
        rec["layers"] = {f"h.{i}.weight": {s: 1e-3 * (i + 1) + 1e-5 * j
                                           for j, s in enumerate(LAYER_STATS)}
                         for i in range(layers)}
    return rec


def batch_body(run_id: str, first_step: int, count: int, layers: int) -> bytes:
    lines = (wire.dumps(step_record(run_id, s, layers)) for s in range(first_step, first_step + count))
    return gzip.compress(b"\n".join(lines), 1)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Window:
    """What one sampling window saw."""

    footprint: Footprint
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    render_ms: float


@dataclass
class SoakReport:
    runs: int
    offered_rate: float
    windows: list[Window] = field(default_factory=list)
    sent_records: int = 0
    errors: int = 0

    def table(self) -> str:
        head = (f"{'t(s)':>6} {'rss MiB':>8} {'fds':>5} {'thr':>4} {'reqs':>6} {'err':>4} "
                f"{'p50 ms':>7} {'p99 ms':>7} {'/metrics max ms':>15}")
        t0 = self.windows[0].footprint.at if self.windows else 0.0
        rows = [f"{w.footprint.at - t0:>6.0f} {w.footprint.rss_mib:>8.1f} "
                f"{w.footprint.open_files:>5} {w.footprint.threads:>4} {w.requests:>6} "
                f"{w.errors:>4} {w.p50_ms:>7.1f} {w.p99_ms:>7.1f} {w.render_ms:>15.1f}"
                for w in self.windows]
        return "\n".join([head, *rows])


class _Load:
    """The shared tallies of the posting threads (one lock, appended per request)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors = 0
        self.sent = 0

    def take(self) -> tuple[list[float], int]:
        with self.lock:
            lat, err = self.latencies, self.errors
            self.latencies, self.errors = [], 0
            return lat, err


def _run_poster(url: str, run_id: str, interval: float, batch: int, layers: int,
                stop: threading.Event, load: _Load, phase: float) -> None:
    step, due = 1, time.monotonic() + phase
    with httpx.Client(timeout=30) as http:
        while not stop.wait(max(0.0, due - time.monotonic())):
            body = batch_body(run_id, step, batch, layers)
            t0 = time.perf_counter()
            try:
                ok = http.post(url + "/v1/records", content=body,
                               headers=NDJSON_GZIP).status_code == 200
            except httpx.HTTPError:
                ok = False
            elapsed = time.perf_counter() - t0
            with load.lock:
                load.latencies.append(elapsed)
                load.errors += 0 if ok else 1
                load.sent += batch if ok else 0
            step += batch
            due += interval


def _render_ms(http: httpx.Client, url: str) -> float:
    t0 = time.perf_counter()
    http.get(url + "/metrics").raise_for_status()
    return 1e3 * (time.perf_counter() - t0)


def soak(url: str, pid: int, seconds: float, runs: int = 50, rate: float = 400.0,
         layers: int = 148, batch: int = 10, window: float = 30.0, scrape_every: float = 5.0) -> SoakReport:
    """Offer ``rate`` records/s spread over ``runs`` runs for ``seconds``; sample per window."""
    report = SoakReport(runs=runs, offered_rate=rate)
    interval = batch * runs / rate  # seconds between two batches of one run
    stop, load, probe = threading.Event(), _Load(), ProcessProbe(pid)
    threads = [threading.Thread(target=_run_poster, daemon=True, args=(
        url, f"soak-{i}", interval, batch, layers, stop, load, interval * i / runs))
        for i in range(runs)]
    for t in threads:
        t.start()
    end = time.monotonic() + seconds
    with httpx.Client(timeout=30) as http:
        while time.monotonic() < end:
            window_end = min(end, time.monotonic() + window)
            renders = []
            while time.monotonic() < window_end:  # scrape like Prometheus would, every 5 s
                # scrape like Prometheus
                time.sleep(min(scrape_every, max(0.0, window_end - time.monotonic())))
                renders.append(_render_ms(http, url))
            lat, err = load.take()
            report.windows.append(Window(probe.sample(), len(lat), err,
                                         1e3 * percentile(lat, 0.5), 1e3 * percentile(lat, 0.99),
                                         max(renders)))
    stop.set()
    for t in threads:
        t.join(35)
    report.sent_records = load.sent
    report.errors = sum(w.errors for w in report.windows)
    return report
