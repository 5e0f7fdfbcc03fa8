"""A flood of made-up runs, each paging one NaN at once, then the real run's page.

A real sidecar process (uvicorn, SQLite) with local Slack and PagerDuty receivers. One run
trains for a while (``age`` seconds: an established run); then ``runs`` made-up run ids
are ingested with a NaN loss as their first and only step (64 to a request, the most one
request may bring in), and then the real run's NaN arrives. The report says when each
receiver got the real page, how many messages each delivered between the real NaN and its
page (what it waited behind), what the real alert's delivery state is (``outbox full``?),
and what the flood cost the receivers.

Example::

    report = page_flood(tmp_path, runs=120, slack_interval=1.0)
    print(report.line())
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.receivers import Received, Receiver
from tests.sidecar_process import SidecarProcess

PD_KEY = "flood-routing-key-0123456789abcd"
REAL = "real-run"
PER_REQUEST = 64  # max_new_runs_per_request's default


@dataclass
class Channel:
    """What one receiver saw of the real page."""

    latency_s: float | None = None  # real NaN posted -> its page received; None: not within wait
    ahead: int = 0  # messages this receiver got after the real NaN and before its page
    queued_ahead: int | None = None  # still pending ahead of it (by queue id) when given up on
    state: str = ""  # the real alert's delivery state on GET /v1/alerts
    error: str | None = None
    flood_messages: int = 0  # what the receiver got about the made-up runs, in all
    summaries: int = 0  # of which summaries of many new runs


@dataclass
class FloodReport:
    runs: int
    flood_seconds: float = 0.0
    channels: dict[str, Channel] = field(default_factory=dict)
    fake_states: dict[str, int] = field(default_factory=dict)  # delivery state -> alerts
    log: str = ""

    def line(self) -> str:
        parts = [f"{self.runs} made-up runs ({self.flood_seconds:.1f} s to ingest):"]
        for name, ch in self.channels.items():
            when = (f"{ch.latency_s:.2f} s" if ch.latency_s is not None
                    else f"not within the wait ({ch.queued_ahead} still queued ahead)")
            why = f" [{ch.state}: {ch.error}]" if ch.state not in ("sent", "") else ""
            parts.append(f"{name}: real page {when}, {ch.ahead} messages before it{why}; "
                         f"flood cost {ch.flood_messages} messages ({ch.summaries} summaries)")
        return " ".join(parts[:1]) + "\n  " + "\n  ".join(parts[1:])


def _config(tmp: Path, slack: Receiver, pd: Receiver, slack_interval: float,
            outbox: str) -> Path:
    config = tmp / "flood.yaml"
    config.write_text(
        "tick_interval_seconds: 0.2\n"
        "alerting:\n  group_wait_seconds: 0.05\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/flood', "
        f"min_interval_seconds: {slack_interval}, timeout_seconds: 2}}\n"
        f"  pagerduty: {{routing_key: {PD_KEY}, url: '{pd.url}/v2/enqueue', "
        "timeout_seconds: 2}\n"
        + (f"  outbox: {{{outbox}}}\n" if outbox else ""))
    return config


def _step(run_id: str, step: int, loss: float | str) -> dict:
    return {"kind": "step", "run_id": run_id, "step": step, "time": 1000.0 + step,
            "loss": loss, "grad_norm": 1.0}


def about_real(r: Received) -> bool:
    """Whether a received message is the real run's page (not a summary naming it)."""
    body = r.json if isinstance(r.json, dict) else {}
    if "payload" in body:
        return body["payload"].get("custom_details", {}).get("run_id") == REAL
    return f"run {REAL}:" in str(body.get("text", ""))


def is_summary(r: Received) -> bool:
    return "new runs paged" in str(r.json)


def page_flood(tmp: Path, runs: int, *, slack_interval: float = 1.0, age: float = 2.0,
               outbox: str = "", wait: float = 60.0, settle: float = 0.0,
               drain: float = 0.0) -> FloodReport:
    """The real run (``age`` s old), ``runs`` made-up runs paging NaN, then the real NaN.

    ``outbox``: extra ``alerting.outbox`` settings, YAML flow style ("max_pending: 50");
    ``wait``: how long to wait for the real page; ``settle``: how long to let the flood's
    delivery go on before the real NaN arrives; ``drain``: how long to wait afterwards for
    the outbox to empty, so the flood's cost in messages is counted whole."""
    report = FloodReport(runs)
    tmp.mkdir(parents=True, exist_ok=True)
    with Receiver("slack") as slack, Receiver("pagerduty") as pd:
        sc = SidecarProcess(tmp / "flood", env={"MONITOR_AGENT_LOG_LEVEL": "warning"},
                            config=_config(tmp, slack, pd, slack_interval, outbox)).start()
        try:
            with httpx.Client(timeout=120) as http:
                post = sc.url + "/v1/records"
                http.post(post, json={"records": [_step(REAL, s, 2.0) for s in range(1, 6)]}
                          ).raise_for_status()
                time.sleep(age)  # the real run has trained for a while
                t0 = time.monotonic()
                for start in range(0, runs, PER_REQUEST):
                    batch = [_step(f"fake-{i:06d}", 1, "NaN")
                             for i in range(start, min(start + PER_REQUEST, runs))]
                    http.post(post, json={"records": batch}).raise_for_status()
                report.flood_seconds = time.monotonic() - t0
                time.sleep(0.5 + settle)  # the flood's pages are flushed into the outbox
                receivers = {"slack": slack, "pagerduty": pd}
                before = {name: len(r.requests) for name, r in receivers.items()}
                sent_at = time.time()
                http.post(post, json={"records": [_step(REAL, 6, "NaN")]}).raise_for_status()
                _await(report, receivers, before, sent_at, wait)
                _drain(http, sc.url, drain)
                _queued_ahead(report, sc.data_dir / "alerts.sqlite")
                _states(report, http, sc.url)
        finally:
            sc.stop()
        report.log = sc.log()
        for name, r in {"slack": slack, "pagerduty": pd}.items():
            ch = report.channels[name]
            flood = [q for q in r.requests if not about_real(q)]
            ch.flood_messages, ch.summaries = len(flood), sum(map(is_summary, flood))
    return report


def _await(report: FloodReport, receivers: dict[str, Receiver], before: dict[str, int],
           sent_at: float, wait: float) -> None:
    deadline = time.monotonic() + wait
    pending = dict(receivers)
    for name in receivers:
        report.channels[name] = Channel()
    while pending and time.monotonic() < deadline:
        for name, r in list(pending.items()):
            got = list(r.requests)
            for i, q in enumerate(got[before[name]:], start=before[name]):
                if about_real(q):
                    ch = report.channels[name]
                    ch.latency_s, ch.ahead = q.at - sent_at, i - before[name]
                    del pending[name]
                    break
        time.sleep(0.02)  # measures each channel's latency: none is a result
    for name in pending:
        report.channels[name].ahead = len(receivers[name].requests) - before[name]


def _drain(http: httpx.Client, url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for line in http.get(url + "/metrics").text.splitlines():
            if line.startswith("monitor_agent_outbox_pending ") and float(line.split()[1]) == 0:
                return
        time.sleep(0.5)  # a report, not a check: the caller judges it


def _queued_ahead(report: FloodReport, db: Path) -> None:
    """For a real page not delivered: the messages still queued before it (by id)."""
    missing = [n for n, ch in report.channels.items() if ch.latency_s is None]
    if not missing:
        return
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        for name in missing:
            row = conn.execute(
                "SELECT id FROM outbox WHERE channel = ? AND instr(body, ?) > 0 ORDER BY id "
                "LIMIT 1", (name, f'"run_id":"{REAL}"'.encode())).fetchone()
            if row is None:
                continue
            [(ahead,)] = conn.execute(
                "SELECT COUNT(*) FROM outbox WHERE channel = ? AND state = 'pending' "
                "AND id < ?", (name, row[0])).fetchall()
            report.channels[name].queued_ahead = ahead


def _states(report: FloodReport, http: httpx.Client, url: str) -> None:
    alerts, path = [], "/v1/alerts?limit=10000"
    while path:
        page = http.get(url + path).json()
        alerts, path = alerts + page["alerts"], page.get("next")
    for alert in alerts:
        for name, d in alert.get("delivery", {}).items():
            if alert["run_id"] == REAL:
                report.channels[name].state = d["state"]
                report.channels[name].error = d.get("last_error")
            else:
                key = f"{name}:{d['state']}" + (" (summarised)" if d.get("summarised") else "")
                report.fake_states[key] = report.fake_states.get(key, 0) + 1
