"""The peer door and the leader link under attack (issue 48), on real sidecar processes.

- ``page_latency``: a real two-node run (node 0's sidecar leads, node 1's follows it) whose
  node 1 goes NaN, while node 1's sidecar also follows ``dead`` leaders that never answer
  (listening sockets that accept nothing: every post to one waits ``post_timeout_seconds``)
  and, with ``flood``, a client floods the leader's peer door with exchanges of made-up
  runs under the write token (what any job holds). Reports the seconds from node 1's NaN
  to the leader's page, each of ``trials`` times.
- ``malformed_flood``: an honest client posts a step every ``interval`` s to a leader while
  another floods its peer door with exchanges whose one finding is malformed
  (``"layer": ["a"]``, ``log_only``) under the link's credential (the write token where the sidecar has
  no other). Reports the share of the honest requests refused and what the flood got.

bench/chaos.py ``--sections peer`` prints both; run it on two checkouts for before and
after (both use only what either version accepts: ``leader_hosts`` lists every leader
both with and without its port).

Example::

    print(page_latency(tmp, dead=20, flood=True).line())
    print(malformed_flood(tmp, seconds=30).line())
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.receivers import Receiver
from tests.sidecar_process import SidecarProcess, free_port

TOKEN = "peer-chaos-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUIET = {"MONITOR_AGENT_LOG_LEVEL": "warning"}


def link_credential() -> str:
    """The leader link's credential of a sidecar whose write token is ``TOKEN`` and that
    sets no peer_token (settings.py ``peer_token_value``); what a sidecar from before the
    link had its own credential took is the write token itself (``page_latency`` sends
    that, ``malformed_flood`` asks the sidecar which one it takes)."""
    return hmac.new(TOKEN.encode(), b"monitor-agent leader link v1", hashlib.sha256).hexdigest()


@contextlib.contextmanager
def black_holes(n: int) -> Iterator[list[int]]:
    """``n`` loopback ports that take connections and never answer."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(1024)
            socks.append(s)
        yield [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _config(path: Path, slack: Receiver, name: str, cluster: str = "") -> Path:
    path.write_text(
        "tick_interval_seconds: 0.5\n"
        f"token: {TOKEN}\n"
        "alerting:\n  group_wait_seconds: 0.05\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/{name}', "
        "min_interval_seconds: 0}\n" + cluster)
    return path


def _step(run: str, step: int, rank: int, nan: bool = False) -> dict:
    return {"kind": "step", "run_id": run, "rank": rank, "step": step, "time": time.time(),
            "attempt": f"{run}-{rank}", "loss": "NaN" if nan else 2.0,
            "grad_norm": "NaN" if nan else 1.0}


def _post(http: httpx.Client, url: str, records: list[dict]) -> int:
    return http.post(url + "/v1/records", json={"records": records}, headers=AUTH).status_code


@dataclass
class LatencyReport:
    dead: int
    flood: bool
    latencies: list[float] = field(default_factory=list)  # s; inf: no page within the wait
    flood_answers: dict[int, int] = field(default_factory=dict)  # status -> exchanges

    def line(self) -> str:
        shown = ", ".join("none" if x == float("inf") else f"{x:.1f}" for x in self.latencies)
        finite = [x for x in self.latencies if x != float("inf")]
        median = f"{statistics.median(finite):.1f} s" if finite else "none"
        flood = (f"; peer-door flood answered {dict(sorted(self.flood_answers.items()))}"
                 if self.flood else "")
        return (f"2-node run's NaN page with {self.dead} dead leaders"
                f"{' and a peer-door flood' if self.flood else ''}: median {median} "
                f"({shown}){flood}")


def page_latency(tmp: Path, dead: int = 20, flood: bool = True, trials: int = 3,
                 wait: float = 90.0) -> LatencyReport:
    report = LatencyReport(dead, flood)
    lead_port = free_port()
    with Receiver("slack") as slack, black_holes(dead) as holes:
        listed = ["127.0.0.1", "localhost", f"localhost:{lead_port}",
                  *(f"127.0.0.1:{p}" for p in holes)]
        lead = SidecarProcess(tmp / "lead", _config(tmp / "lead.yaml", slack, "lead"),
                              env=QUIET, port=lead_port)
        node = SidecarProcess(tmp / "node", _config(
            tmp / "node.yaml", slack, "node", f"cluster: {{leader_hosts: {listed}}}\n"),
            env=QUIET)
        stop = threading.Event()
        try:
            lead.start()
            node.start()
            with httpx.Client(timeout=60) as http:
                for i, port in enumerate(holes):  # runs whose leaders never answer
                    _post(http, node.url, [{"kind": "run", "run_id": f"dead-{i}", "rank": 2,
                                            "attempt": f"dead-{i}-2", "cluster": {
                                                "node_rank": 1, "nodes": 2,
                                                "leader_url": f"http://127.0.0.1:{port}"}},
                                           _step(f"dead-{i}", 1, 2)])
                flooder = threading.Thread(target=_flood_door, daemon=True,
                                           args=(lead.url, stop, report.flood_answers))
                if flood:
                    flooder.start()
                for trial in range(trials):
                    report.latencies.append(_one_nan(http, lead.url, node.url, slack,
                                                     f"job-{trial}", lead_port, wait))
                stop.set()
                if flood:
                    flooder.join(10)
        finally:
            stop.set()
            node.stop()
            lead.stop()
    return report


def _one_nan(http: httpx.Client, lead: str, node: str, slack: Receiver, run: str,
             lead_port: int, wait: float) -> float:
    """A 2x2 run trains 20 steps; at step 21 node 1's ranks go NaN, node 0's do not (their
    step 21 comes too, so the leader need not wait for them): what the leader pages it
    knows from node 1's digests only. Seconds from node 1's NaN to the leader's page."""
    cluster = {"nodes": 2, "local_world_size": 2, "leader_url": f"http://localhost:{lead_port}"}
    _post(http, lead, [{"kind": "run", "run_id": run, "rank": r, "attempt": f"{run}-{r}",
                        "cluster": {**cluster, "node_rank": 0}} for r in (0, 1)])
    _post(http, node, [{"kind": "run", "run_id": run, "rank": r, "attempt": f"{run}-{r}",
                        "cluster": {**cluster, "node_rank": 1}} for r in (2, 3)])
    for s in range(1, 21):
        _post(http, lead, [_step(run, s, r) for r in (0, 1)])
        _post(http, node, [_step(run, s, r) for r in (2, 3)])
    before = len(slack.requests)
    t0 = time.monotonic()
    _post(http, node, [_step(run, 21, r, nan=True) for r in (2, 3)])
    _post(http, lead, [_step(run, 21, r) for r in (0, 1)])
    deadline = t0 + wait
    while time.monotonic() < deadline:
        if any(f"run {run}:" in str((r.json or {}).get("text", "")) and "FIRING" in str(
                (r.json or {}).get("text", "")) for r in slack.requests[before:]):
            return time.monotonic() - t0
        time.sleep(0.05)
    return float("inf")


def _flood_door(lead: str, stop: threading.Event, answers: dict[int, int]) -> None:
    """Exchanges of made-up runs, 20 digests each, under the write token, from 4 threads."""
    def one(k: int) -> None:
        n = 0
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                run = f"flood-{k}-{n}"
                body = {"sidecar": f"flood-{k}", "runs": [{"run_id": run, "node": 1,
                                                           "ranks": [2], "known_action": 0}],
                        "records": [_step(run, s, 2) for s in range(1, 21)], "findings": []}
                try:
                    status = http.post(lead + "/v1/peer/digests", json=body,
                                       headers=AUTH).status_code
                except httpx.HTTPError:
                    status = 0
                answers[status] = answers.get(status, 0) + 1
                n += 1
                stop.wait(0.05)  # 20 exchanges a second a thread

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@dataclass
class FloodReport:
    honest: dict[int, int] = field(default_factory=dict)  # status -> honest requests
    flood: dict[int, int] = field(default_factory=dict)  # status -> malformed exchanges
    ready_failures: int = 0  # /readyz answers other than 200 seen meanwhile

    @property
    def refused_share(self) -> float:
        total = sum(self.honest.values())
        return (total - self.honest.get(200, 0)) / total if total else float("nan")

    def line(self) -> str:
        total = sum(self.honest.values())
        return (f"malformed-finding flood at the peer door: honest ingest refused "
                f"{total - self.honest.get(200, 0)} of {total} ({self.refused_share:.0%}), "
                f"answers {dict(sorted(self.honest.items()))}; /readyz not ready "
                f"{self.ready_failures} times; the flood got {dict(sorted(self.flood.items()))}")


def malformed_flood(tmp: Path, seconds: float = 40.0, interval: float = 0.25,
                    flood_interval: float = 0.1) -> FloodReport:
    report = FloodReport()
    with Receiver("slack") as slack:
        lead = SidecarProcess(tmp / "mal", _config(tmp / "mal.yaml", slack, "mal"), env=QUIET)
        stop = threading.Event()
        try:
            lead.start()
            with httpx.Client(timeout=30) as http:
                # The sidecar leads a two-node run (its own node 0 ranks).
                _post(http, lead.url, [{"kind": "run", "run_id": "led", "rank": r,
                                        "attempt": f"led-{r}", "cluster": {
                                            "node_rank": 0, "nodes": 2}} for r in (0, 1)])
                peer = link_credential()
                probe = http.post(lead.url + "/v1/peer/digests", json={
                    "sidecar": "probe", "runs": [], "records": [], "findings": []},
                    headers={"Authorization": f"Bearer {peer}"})
                if probe.status_code == 401:  # a sidecar with no credential of the link's own
                    peer = TOKEN
                flooder = threading.Thread(target=_malformed, daemon=True, args=(
                    lead.url, peer, stop, report.flood, flood_interval))
                flooder.start()
                end, step = time.monotonic() + seconds, 1
                while time.monotonic() < end:
                    t = time.monotonic()
                    try:
                        status = _post(http, lead.url, [_step("honest", step, 0)])
                    except httpx.HTTPError:
                        status = 0
                    report.honest[status] = report.honest.get(status, 0) + 1
                    step += status == 200
                    if http.get(lead.url + "/readyz").status_code != 200:
                        report.ready_failures += 1
                    time.sleep(max(interval - (time.monotonic() - t), 0.0))
                stop.set()
                flooder.join(10)
        finally:
            stop.set()
            lead.stop()
    return report


def _malformed(lead: str, credential: str, stop: threading.Event, answers: dict[int, int],
               interval: float) -> None:
    # log_only: recorded, not paged, so nothing before the store meets the bad layer.
    finding = {"type": "nan_inf", "severity": "critical", "run_id": "led", "step": 1,
               "rank": 2, "message": "m", "layer": ["a"], "log_only": True}
    body = {"sidecar": "node-1", "runs": [{"run_id": "led", "node": 1, "ranks": [2],
                                           "known_action": 0}],
            "records": [], "findings": [{"flags": 0, "finding": finding}]}
    with httpx.Client(timeout=30) as http:
        while not stop.wait(interval):
            try:
                status = http.post(lead + "/v1/peer/digests", json=body, headers={
                    "Authorization": f"Bearer {credential}"}).status_code
            except httpx.HTTPError:
                status = 0
            answers[status] = answers.get(status, 0) + 1
