"""Alert latency: POST of the bad step -> arrival at the receivers, sidecar vs Prometheus path.

Sidecar path: a real sidecar (subprocess) with Slack and PagerDuty pointed at local
receivers; each incident is a new run whose NaN step is POSTed alone; we time until both
receivers got the page. Prometheus path, the one a user would otherwise build: the real
Prometheus binary scraping the sidecar's /metrics with an alerting rule on NaN loss ->
the real Alertmanager -> a webhook receiver, with the shipped deploy intervals
(deploy/prometheus/prometheus.yml, deploy/alertmanager/alertmanager.yml). Prometheus'
defaults (1m scrape and evaluation) are computed from the measured pieces.

    python -m bench.alert_latency [--incidents 200] [--prom-incidents 3] [--quick]

``--quick`` runs the Prometheus path with 1 s intervals and no group wait (a sanity check).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from tests.alertmanager_process import AlertmanagerProcess
from tests.receivers import Receiver
from tests.sidecar_process import SidecarProcess, free_port

REPO = Path(__file__).resolve().parents[1]

DEFAULTS = {"scrape": 60.0, "eval": 60.0, "group_wait": 30.0}  # Prometheus / Alertmanager


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--incidents", type=int, default=200)
    p.add_argument("--prom-incidents", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="alert-bench-") as tmp, \
            Receiver("slack") as slack, Receiver("pagerduty") as pd, Receiver("webhook") as hook:
        sc = SidecarProcess(Path(tmp) / "data", config=_sidecar_config(Path(tmp), slack, pd))
        sc.start()
        try:
            sidecar = _sidecar_path(sc, slack, pd, args.incidents)
            shipped = _shipped_intervals(args.quick)
            prom = _prometheus_path(sc, hook, Path(tmp), shipped, args.prom_incidents)
        finally:
            sc.stop()
    _report(sidecar, prom, shipped)
    return 0


def _sidecar_config(tmp: Path, slack: Receiver, pd: Receiver) -> Path:
    config = tmp / "sidecar.yaml"
    config.write_text(yaml.safe_dump({"alerting": {
        # Slack's 1 message/s limit is per webhook; incidents here come faster than that,
        # so the bench lifts it to time the pipeline, not the rate limiter.
        "slack": {"webhook_url": slack.url + "/services/bench", "min_interval_seconds": 0},
        "pagerduty": {"routing_key": "bench0routing0key000000000000000", "url": pd.url + "/v2/enqueue"},
        # Each incident is a new run: past new_run_burst of them a minute, a flood's pages
        # go out as one summary (notify/fairness.py), which the bench would wait for in vain.
        "outbox": {"new_run_seconds": 0},
    }}))
    return config


def _setup_run(sc: SidecarProcess, run_id: str) -> None:
    records = [{"kind": "run", "run_id": run_id, "labels": {"project": "bench"}}]
    records += [{"kind": "step", "run_id": run_id, "step": s, "time": time.time(), "loss": 2.0}
                for s in range(1, 4)]
    sc.post(records).raise_for_status()


def _post_nan(sc: SidecarProcess, run_id: str) -> float:
    t0 = time.time()
    sc.post([{"kind": "step", "run_id": run_id, "step": 4, "time": t0, "loss": "NaN"}])
    return t0


def _arrival(receiver: Receiver, run_id: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in list(receiver.requests):
            if run_id.encode() in r.body:
                return r.at
        time.sleep(0.0005)
    raise TimeoutError(f"{receiver.protocol}: nothing for {run_id}")


def _sidecar_path(sc: SidecarProcess, slack: Receiver, pd: Receiver, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"slack": [], "pagerduty": []}
    for i in range(n):
        run_id = f"side-{i}"
        _setup_run(sc, run_id)
        t0 = _post_nan(sc, run_id)
        out["pagerduty"].append(_arrival(pd, run_id, 10) - t0)
        out["slack"].append(_arrival(slack, run_id, 10) - t0)
    return out


def _shipped_intervals(quick: bool) -> dict[str, float]:
    if quick:
        return {"scrape": 1.0, "eval": 1.0, "group_wait": 0.0}
    prom = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    am = yaml.safe_load((REPO / "deploy/alertmanager/alertmanager.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "monitor-agent")
    return {"scrape": _secs(job.get("scrape_interval", prom["global"]["scrape_interval"])),
            "eval": _secs(prom["global"]["evaluation_interval"]),
            "group_wait": _secs(am["route"].get("group_wait", "30s"))}


def _secs(text: str) -> float:
    from monitor_agent.alerting.rules import parse_duration

    return parse_duration(text)


def _prometheus_path(sc: SidecarProcess, hook: Receiver, tmp: Path, iv: dict[str, float],
                     n: int) -> list[float]:
    wait = f"{iv['group_wait']:g}s"
    with AlertmanagerProcess(tmp, hook.url + "/am", group_wait=wait) as am:
        prom = _start_prometheus(tmp, sc.port, am.port, iv)
        try:
            _wait_scraped(prom, timeout=iv["scrape"] * 3 + 10)
            out = []
            for i in range(n):
                run_id = f"prom-{i}"
                _setup_run(sc, run_id)
                t0 = _post_nan(sc, run_id)
                out.append(_arrival(hook, run_id, timeout=iv["scrape"] + iv["eval"] + iv["group_wait"] + 60) - t0)
            return out
        finally:
            prom.terminate()
            prom.wait(10)


def _start_prometheus(tmp: Path, sidecar_port: int, am_port: int, iv: dict[str, float]):
    rules = tmp / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "bench", "rules": [{
        "alert": "TrainingLossNaN", "expr": "training_loss != training_loss",
        "labels": {"severity": "critical"}}]}]}))
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": f"{iv['scrape']:g}s", "evaluation_interval": f"{iv['eval']:g}s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "monitor-agent",
                            "static_configs": [{"targets": [f"127.0.0.1:{sidecar_port}"]}]}],
    }))
    port = free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return proc


def _wait_scraped(prom, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = httpx.get(prom.url + "/api/v1/query", params={"query": "up{job='monitor-agent'}"})
            if r.status_code == 200 and r.json()["data"]["result"]:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("prometheus never scraped the sidecar")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _report(sidecar: dict[str, list[float]], prom: list[float], iv: dict[str, float]) -> None:
    print(f"sidecar path, {len(sidecar['slack'])} incidents (POST of the NaN step -> receiver):")
    for channel, values in sidecar.items():
        print(f"  {channel:10} p50 {_pct(values, 0.5) * 1000:7.1f} ms   p99 {_pct(values, 0.99) * 1000:7.1f} ms"
              f"   max {max(values) * 1000:7.1f} ms")
    worst_p99 = max(_pct(v, 0.99) for v in sidecar.values())
    phases = iv["scrape"] / 2 + iv["eval"] / 2 + iv["group_wait"]
    overhead = statistics.mean(prom) - phases
    print(f"prometheus path (scrape {iv['scrape']:g}s, eval {iv['eval']:g}s, AM group_wait "
          f"{iv['group_wait']:g}s), {len(prom)} incidents: "
          + ", ".join(f"{v:.1f}s" for v in prom))
    print(f"  mean {statistics.mean(prom):.1f} s (expected from intervals {phases:.1f} s; "
          f"measured overhead {overhead:+.1f} s)")
    d = DEFAULTS
    expect = d["scrape"] / 2 + d["eval"] / 2 + d["group_wait"] + max(overhead, 0)
    worst = d["scrape"] + d["eval"] + d["group_wait"] + max(overhead, 0)
    print(f"prometheus defaults (scrape 1m, eval 1m, group_wait 30s): expected mean {expect:.0f} s, "
          f"worst {worst:.0f} s (computed from the measured pieces)")
    print(f"goal: sidecar p99 <= 200 ms: {'MET' if worst_p99 <= 0.2 else 'MISSED'} "
          f"({worst_p99 * 1000:.1f} ms); >= 100x faster than the Prometheus path: "
          f"{statistics.mean(prom) / worst_p99:.0f}x (shipped), {expect / worst_p99:.0f}x (defaults)")


if __name__ == "__main__":
    raise SystemExit(main())
