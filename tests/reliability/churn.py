"""Many runs appearing and ending: once their TTL passes they leave /metrics and memory.

Each run sends a ``run`` record, a few steps with per-layer stats and an ``end``; half of
them end, half just go silent (the other TTL). Afterwards the sidecar must hold none of
them in memory or on /metrics, while the store still has their history.

Example::

    with SidecarProcess(tmp, env=churn_env(ttl=1.0)) as sc:
        report = churn(sc.url, sc.proc.pid, runs=5000, ttl=1.0)
    print(report.line())
"""

from __future__ import annotations

import gzip
import re
import time
from dataclasses import dataclass

import httpx

from monitor_agent.records import wire
from tests.reliability.process_probe import ProcessProbe

NDJSON_GZIP = {"content-type": "application/x-ndjson", "content-encoding": "gzip"}


def churn_env(ttl: float) -> dict[str, str]:
    """Sidecar env for a churn test: short TTLs and a fast tick."""
    return {"MONITOR_AGENT_ENDED_RUN_TTL_SECONDS": str(ttl),
            "MONITOR_AGENT_SILENT_RUN_TTL_SECONDS": str(ttl),
            "MONITOR_AGENT_TICK_INTERVAL_SECONDS": "0.2",
            "MONITOR_AGENT_LOG_LEVEL": "warning"}


@dataclass
class ChurnReport:
    runs: int
    peak_runs_on_metrics: int = 0
    runs_on_metrics_after: int = -1
    active_after: int = -1
    stored_runs: int = 0
    rss_start: int = 0
    rss_peak: int = 0
    rss_after: int = 0

    def line(self) -> str:
        mib = 1 << 20
        return (f"{self.runs:,} runs came and went: up to {self.peak_runs_on_metrics:,} on "
                f"/metrics at once, {self.runs_on_metrics_after} after the TTL, "
                f"{self.active_after} still active in memory, {self.stored_runs:,} kept in "
                f"the store; RSS {self.rss_start / mib:.0f} -> peak {self.rss_peak / mib:.0f}"
                f" -> {self.rss_after / mib:.0f} MiB")


def _run_records(run_id: str, end: bool, layers: int = 20) -> list[dict]:
    blob = {f"l{i}": {"grad_norm": 0.1, "param_norm": 1.0, "update_norm": 1e-3}
            for i in range(layers)}
    now = time.time()
    recs: list[dict] = [{"kind": "run", "run_id": run_id, "labels": {"project": "churn"}}]
    recs += [{"kind": "step", "run_id": run_id, "step": s, "time": now + s, "loss": 1.0,
              "layers": blob} for s in range(1, 4)]
    if end:
        recs.append({"kind": "end", "run_id": run_id, "step": 3, "time": now + 3,
                     "status": "completed"})
    return recs


def _runs_on_metrics(http: httpx.Client, url: str) -> int:
    text = http.get(url + "/metrics").text
    return len(set(re.findall(r'training_run_info\{[^}]*run_id="([^"]+)"', text)))


def churn(url: str, pid: int, runs: int, ttl: float, batch: int = 100,
          prefix: str = "churn") -> ChurnReport:
    """Send ``runs`` short runs in batches, then wait out the TTL and look what is left.
    Call it again with another ``prefix`` for a second wave: RSS should not grow again."""
    report = ChurnReport(runs)
    probe = ProcessProbe(pid)
    report.rss_start = probe.sample().rss_bytes
    with httpx.Client(timeout=60) as http:
        for first in range(0, runs, batch):
            lines = [wire.dumps(r) for i in range(first, min(first + batch, runs))
                     for r in _run_records(f"{prefix}-{i}", end=i % 2 == 0)]
            body = gzip.compress(b"\n".join(lines), 1)
            resp = http.post(url + "/v1/records", content=body, headers=NDJSON_GZIP)
            resp.raise_for_status()
            probe.sample()
            if first % (batch * 10) == 0:
                report.peak_runs_on_metrics = max(report.peak_runs_on_metrics,
                                                  _runs_on_metrics(http, url))
        report.rss_peak = probe.peak_rss_bytes
        deadline = time.monotonic() + ttl + 30
        while time.monotonic() < deadline:
            # a measurement: runs on /metrics after their ttl, sampled
            time.sleep(max(ttl / 2, 0.2))
            report.runs_on_metrics_after = _runs_on_metrics(http, url)
            health = http.get(url + "/metrics").text
            held = re.findall(r'monitor_agent_runs\{state="[^"]+"\} (\S+)', health)
            report.active_after = int(sum(float(v) for v in held)) if held else -1
            if report.runs_on_metrics_after == 0 and report.active_after == 0:
                break
        page: dict = {"next": "/v1/runs?limit=10000"}
        report.stored_runs = 0
        while page["next"] is not None:  # every page of the runs list
            page = http.get(url + page["next"]).json()
            report.stored_runs += len(page["runs"])
    report.rss_after = probe.sample().rss_bytes
    return report
