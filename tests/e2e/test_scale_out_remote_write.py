"""Remote write as deploy/kubernetes/README.md recommends it, natively on loopback: a
Prometheus in agent mode scrapes the sidecars and remote-writes, with the README's own
``remote_write`` block (its ``write_relabel_configs`` dropping per-layer series), to a
second Prometheus started with ``--web.enable-remote-write-receiver``: the stand-in for
Mimir, Thanos Receive or Cortex. An agent evaluates no rules, so the receiving side loads
the repo's rules (``for`` durations compressed as in e2e/cluster.py; the traces are fed
once, so rate windows stay 5 min), as the README says to load them into the global ruler.

Then every dashboard expression returns data from the receiving side, recording rules
included, except the per-layer ones: those series were dropped on the way, by design.
About 40 s.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dashboards.queries import substitute
from tests.e2e.cluster import SCRAPE, compressed_rules
from tests.e2e.test_stack import (
    BUILTINS,
    DEPLOY,
    FED,
    TOKEN,
    TRACES,
    Binary,
    dashboard_queries,
    has_data,
    have,
    post,
    trace_records,
    values_for,
)
from tests.eventually import eventually
from tests.sidecar_process import SidecarProcess, free_port

pytestmark = [pytest.mark.binaries, pytest.mark.slow, pytest.mark.timeout(300)]

README = DEPLOY / "kubernetes" / "README.md"
PER_LAYER = "training_layer_"
RECORDED = re.compile(r"\b\w+:\w+:\w+\b")


def readme_remote_write() -> list[dict[str, Any]]:
    """The ``remote_write:`` YAML block of the README's scaling-out section, as written."""
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    found = [yaml.safe_load(b)["remote_write"] for b in blocks if "remote_write:" in b]
    assert len(found) == 1, "the README should show exactly one remote_write block"
    return found[0]


class Pipeline:
    """Sidecar -> Prometheus agent -> remote-write receiver (with the repo's rules)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sidecar = SidecarProcess(tmp / "sidecar", env={"MONITOR_AGENT_TOKEN": TOKEN})
        self.agent_port, self.central_port = free_port(), free_port()
        self.central_url = f"http://127.0.0.1:{self.central_port}"
        self.procs: list[Binary] = []

    def start(self) -> None:
        self.sidecar.start()
        central = self.tmp / "central.yml"
        central.write_text(yaml.safe_dump({
            "global": {"evaluation_interval": "1s"},
            "rule_files": [str(compressed_rules(self.tmp / "rules", windows=False) / "*.yml")]}))
        self.procs.append(Binary(
            ["prometheus", f"--config.file={central}", "--web.enable-remote-write-receiver",
             f"--storage.tsdb.path={self.tmp / 'central'}",
             f"--web.listen-address=127.0.0.1:{self.central_port}"],
            self.tmp / "central.log", self.central_url + "/-/ready"))
        agent = self.tmp / "agent.yml"
        self.agent_config(agent)
        self.procs.append(Binary(
            ["prometheus", "--enable-feature=agent", f"--config.file={agent}",
             f"--storage.agent.path={self.tmp / 'agent'}",
             f"--web.listen-address=127.0.0.1:{self.agent_port}"],
            self.tmp / "agent.log", f"http://127.0.0.1:{self.agent_port}/-/ready"))

    def agent_config(self, path: Path) -> None:
        """deploy/prometheus/prometheus.yml as an agent: its scrape jobs with loopback
        targets, no rules or alerting (an agent has neither), the README's remote_write
        pointed at the receiver and flushing every second instead of every 5 s."""
        config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        del config["rule_files"], config["alerting"], config["global"]["evaluation_interval"]
        config["global"].update(scrape_interval=SCRAPE)
        config["global"]["external_labels"]["cluster"] = "loopback"
        targets = {"monitor-agent": [f"127.0.0.1:{self.sidecar.port}"],
                   "prometheus": [f"127.0.0.1:{self.agent_port}"]}
        config["scrape_configs"] = [job for job in config["scrape_configs"]
                                    if job["job_name"] in targets]
        for job in config["scrape_configs"]:
            job.update(scrape_interval=SCRAPE, scrape_timeout=SCRAPE)
            job["static_configs"][0]["targets"] = targets[job["job_name"]]
        config["remote_write"] = readme_remote_write()
        for target in config["remote_write"]:
            target["url"] = self.central_url + "/api/v1/write"
            target["queue_config"] = {"batch_send_deadline": "1s"}
        path.write_text(yaml.safe_dump(config))

    def feed(self) -> None:
        """The public traces, in two halves so counters move between scrapes."""
        records = {name: trace_records(name, time.time()) for name in FED}
        for half in (slice(0, 1), slice(1, 2)):
            steps = {}
            for name, recs in records.items():
                cut = len(recs) // 2
                part = recs[:cut] if half.start == 0 else recs[cut:]
                post(self.sidecar.url, part)
                steps[name] = max(r["step"] for r in part if r["kind"] == "step")
            eventually(lambda steps=steps: self.arrived(steps), timeout=60, interval=0.5,
                       what=f"the receiver to hold {steps}", context=self.logs)

    def arrived(self, steps: dict[str, int]) -> bool:
        seen = {s["metric"]["run_id"]: float(s["value"][1])
                for s in self.query("max by (run_id) (training_last_step)")}
        return all(seen.get(name, -1) >= step for name, step in steps.items())

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = httpx.get(self.central_url + "/api/v1/query", params={"query": expr}, timeout=10)
        assert resp.status_code == 200, f"{expr}: {resp.text}"
        return resp.json()["data"]["result"]

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.procs)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.sidecar.stop()


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    if not have("prometheus"):
        pytest.skip("prometheus not on PATH: apt-get install prometheus")
    if not TRACES.is_dir():
        pytest.skip(f"public traces not found at {TRACES}")
    pipe = Pipeline(tmp_path_factory.mktemp("remote-write"))
    try:
        pipe.start()
        pipe.feed()
        # Recording rules over rates need the second half; the stalled run's alert its `for`.
        eventually(lambda: pipe.query("project_run_rank:training_step_duration_seconds:p50_rate5m")
                   and pipe.query('ALERTS{alertname="TrainingRunStalled", alertstate="firing"}'),
                   timeout=60, interval=0.5, what="the receiver's recording and alerting rules",
                   context=pipe.logs)
        yield pipe
    finally:
        pipe.stop()


def test_the_agent_writes_the_run_series_and_the_readme_rule_drops_per_layer(
        pipeline: Pipeline) -> None:
    exposed = httpx.get(pipeline.sidecar.url + "/metrics", timeout=10).text
    assert PER_LAYER + "grad_norm{" in exposed, "the sidecar does expose per-layer series"
    assert pipeline.query(f'count({{__name__=~"{PER_LAYER}.*"}})') == []
    runs = pipeline.query('count by (run_id, cluster) (training_run_info)')
    assert {(s["metric"]["run_id"], s["metric"]["cluster"]) for s in runs} == {
        (run, "loopback") for run in FED}


@pytest.mark.parametrize(("query", "multi"), dashboard_queries())
def test_dashboard_expression_on_the_receiving_side(pipeline: Pipeline, query: Any,
                                                    multi: dict[str, bool]) -> None:
    results = {}
    for run in FED:
        expr = substitute(query.expr, values_for(run, multi), BUILTINS)
        result = pipeline.query(expr)
        if query.label:
            result = [s for s in result if s["metric"].get(query.label)]
        results[run] = has_data(result)
    if PER_LAYER in query.expr:
        assert not any(results.values()), "a per-layer series crossed the drop rule"
    else:
        assert any(results.values()), f"no data at the receiver for {query.expr}"


def test_recording_rules_are_evaluated_on_the_receiving_side(pipeline: Pipeline) -> None:
    rules = httpx.get(pipeline.central_url + "/api/v1/rules", timeout=10).json()["data"]
    recorded = {r["name"] for g in rules["groups"] for r in g["rules"] if r["type"] == "recording"}
    used = {name for q in (p.values[0] for p in dashboard_queries())
            for name in RECORDED.findall(q.expr)}
    assert used and used <= recorded
    for name in sorted(used):
        assert has_data(pipeline.query(name)), name
