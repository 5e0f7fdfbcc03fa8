"""Notification endpoints failing for a while (Slack 429 + Retry-After, PagerDuty 500s,
timeouts, refused connections) while runs keep ingesting and paging; then recovery.

Example::

    report = notify_outage(tmp_path, outage_seconds=120, runs=20)
    print(report.summary())
"""

from __future__ import annotations

import contextlib
import random
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.receivers import Receiver, Reply
from tests.reliability.soak import percentile
from tests.sidecar_process import SidecarProcess

PD_KEY = "outage-routing-key-77aa000000000"


class Gate:
    """A TCP forwarder in front of a receiver; ``close()`` makes connections be refused.

    Example::

        with Gate(pd.url) as gate:
            gate.close(); ...; gate.open()
    """

    def __init__(self, target_url: str) -> None:
        host, port = target_url.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.port = _port_outside_ephemeral_range()
        self.url = f"http://127.0.0.1:{self.port}"
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []  # cut on close, as a dead host would

    def __enter__(self) -> Gate:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        lsock = socket.socket()
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", self.port))
        lsock.listen(64)
        self._listener = lsock
        threading.Thread(target=self._accept, args=(lsock,), daemon=True).start()

    def close(self) -> None:
        if self._listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would leave the
            # socket listening until that call returned.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        # Open keep-alive connections would hold the port and keep the outage from biting.
        conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, lsock: socket.socket) -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._conns += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _port_outside_ephemeral_range() -> int:
    """A free port the kernel never hands out as a source port.

    While the gate is closed the sidecar keeps connecting to it; with a port from the
    ephemeral range the kernel may pick that very port as a connection's source, the
    connection meets itself (TCP simultaneous open), and the gate cannot reopen.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for port in random.sample(range(max(1024, low - 12000), low), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@dataclass
class OutageReport:
    alerts: int
    baseline_ms: list[float] = field(default_factory=list)
    outage_ms: list[float] = field(default_factory=list)
    failed_attempts: int = 0
    pages: Counter = field(default_factory=Counter)  # dedup_key -> accepted triggers
    slack_firing: int = 0
    max_pending: float = 0.0
    not_delivered: int = 0  # the outbox's own count of notifications it gave up on

    @property
    def duplicated(self) -> int:
        return sum(n - 1 for n in self.pages.values() if n > 1)

    def summary(self) -> str:
        return (f"ingest p50/p99 {percentile(self.baseline_ms, .5):.1f}/"
                f"{percentile(self.baseline_ms, .99):.1f} ms healthy vs "
                f"{percentile(self.outage_ms, .5):.1f}/{percentile(self.outage_ms, .99):.1f} ms "
                f"during the outage; {self.failed_attempts} failed delivery attempts; alerts "
                f"{self.alerts}, paged after recovery {len(self.pages)}, duplicated "
                f"{self.duplicated}, slack firing messages {self.slack_firing}; outbox peak "
                f"{self.max_pending:.0f} pending; given up {self.not_delivered}")


def _config(tmp: Path, slack_url: str, pd_url: str, extra: str) -> Path:
    config = tmp / "outage.yaml"
    config.write_text(
        "tick_interval_seconds: 0.2\n"
        "alerting:\n  group_wait_seconds: 0.05\n"
        f"  slack: {{webhook_url: '{slack_url}/services/T0/B0/outage', "
        "min_interval_seconds: 0, timeout_seconds: 1}\n"
        f"  pagerduty: {{routing_key: {PD_KEY}, url: '{pd_url}/v2/enqueue', "
        "timeout_seconds: 1}\n" + extra
    )
    return config


def _post_run(http: httpx.Client, url: str, run_id: str, nan: bool) -> float:
    recs = [{"kind": "step", "run_id": run_id, "step": s, "time": 1000.0 + s,
             "loss": "NaN" if nan and s == 5 else 2.0, "grad_norm": 1.0} for s in range(1, 6)]
    t0 = time.perf_counter()
    http.post(url + "/v1/records", json={"records": recs}).raise_for_status()
    return 1e3 * (time.perf_counter() - t0)


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def notify_outage(tmp: Path, outage_seconds: float = 120.0, runs: int = 20,
                  extra_config: str = "") -> OutageReport:
    """Healthy ingest, then ``outage_seconds`` of failing receivers while ``runs`` runs page."""
    report = OutageReport(alerts=runs)
    with Receiver("slack") as slack, Receiver("pagerduty") as pd, Gate(pd.url) as gate:
        sc = SidecarProcess(tmp / "outage", config=_config(tmp, slack.url, gate.url, extra_config),
                            env={"MONITOR_AGENT_LOG_LEVEL": "info"}).start()
        try:
            with httpx.Client(timeout=30) as http:
                report.baseline_ms = [_post_run(http, sc.url, f"ok-{i}", False) for i in range(50)]
                _outage(report, http, sc, slack, pd, gate, outage_seconds, runs)
                _recover(report, http, sc, slack, pd, gate, runs)
        finally:
            sc.stop()
        report.log = sc.log()  # type: ignore[attr-defined]
    return report


def _outage(report, http, sc, slack, pd, gate, seconds, runs) -> None:
    many = int(seconds * 50) + 100
    slack.script(*[Reply(429, "rate_limited", retry_after=1)] * many)
    pd.script(*[Reply(500, {"status": "error"})] * 3, *[Reply(500, delay=2.0)] * 3,
              *[Reply(500, {"status": "error"})] * many)
    end, started = time.monotonic() + seconds, time.monotonic()
    for i in range(runs):  # spread the pages over the outage
        report.outage_ms.append(_post_run(http, sc.url, f"nan-{i}", True))
        time.sleep(seconds / runs / 3)  # the pages spread over the outage
    while time.monotonic() < end:
        if time.monotonic() - started > seconds / 2 and gate._listener is not None:
            gate.close()  # the second half: connections refused
        report.outage_ms.append(_post_run(http, sc.url, f"ok-{len(report.outage_ms)}", False))
        text = http.get(sc.url + "/metrics").text
        report.max_pending = max(report.max_pending, _metric(text, "monitor_agent_outbox_pending"))
        time.sleep(0.2)  # traffic during the outage, sampled
    report.failed_attempts = len(slack.requests) + len(pd.requests)


def _recover(report, http, sc, slack, pd, gate, runs) -> None:
    slack._script.clear()
    pd._script.clear()
    gate.open()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = http.get(sc.url + "/metrics").text
        if _metric(text, "monitor_agent_outbox_pending") == 0:
            break
        time.sleep(0.5)  # a report, not a check: the caller judges it
    time.sleep(1.0)  # a late duplicate would show up now
    for r in pd.accepted():
        if r.json["event_action"] == "trigger":
            report.pages[r.json["dedup_key"]] += 1
    report.slack_firing = sum("FIRING" in r.json["text"] for r in slack.accepted())
    text = http.get(sc.url + "/metrics").text
    report.not_delivered = int(sum(_metric(text, "monitor_agent_notifications_total",
                                           f'{{channel="{c}",outcome="failed"}}')
                                   for c in ("slack", "pagerduty")))
