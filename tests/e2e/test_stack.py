"""The docker-compose stack, natively: the sidecar, the Debian ``prometheus`` with
deploy/prometheus/prometheus.yml and ``prometheus-alertmanager`` with
deploy/alertmanager/alertmanager.yml (only targets, paths, secrets and intervals rewritten),
fed recorded faulty traces. Then every PromQL expression of every dashboard must return data,
and the Prometheus alerts must reach Slack and PagerDuty (a local webhook) through
Alertmanager's routing and inhibition.

Two sidecars run, as on two nodes: one gets the traces, the other is killed, so the stalled-run
and sidecar-down alerts (``for: 1m`` each) ripen at the same time. The whole test takes about
90 s, most of it waiting out those ``for`` durations.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dashboards.queries import iter_queries, substitute
from monitor_agent.records import wire
from tests.e2e.webhook import Webhook
from tests.eventually import eventually
from tests.sidecar_process import SidecarProcess, free_port

pytestmark = [pytest.mark.binaries, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
TRACES = Path(__file__).resolve().parents[1] / "traces" / "public"
DEPLOY = REPO / "deploy"
PROJECT = "e2e"
TOKEN = "e2e-ingest-token"
# straggler: two ranks; fp16: loss scale, skipped steps, NaN; stalled: no step for 20 min;
# frozen: a layer with exactly zero updates.
# healthy_act_{gpt,mlp} (tests/traces, recorded by scripts/traces/record_traces.py): gradient/weight
# distributions, activation statistics (GELU; ReLU with dead units) and per-category evals.
FED = ("straggler_ddp_gpt", "loss_scale_collapse_gpt_fp16", "stalled_gpt", "frozen_layer_gpt",
       "healthy_act_gpt", "healthy_act_mlp")
RECORDED = REPO / "tests" / "traces"
STALLED, STALL_AGE = "stalled_gpt", 1200.0
GPU_RUN = "loss_scale_collapse_gpt_fp16"
# Posted without its end record: a run still training when scraped, so its per-layer alert
# (TrainingDeadLayer on the frozen layers) is still active, as the Layers dashboard shows it
# (an ended run's alerts resolve).
STILL_TRAINING = "frozen_layer_gpt"
# The fp16 run also hangs once, for HANG_SECONDS after a quarter of its steps, and recovers
# (its watchdog's hang record, then the steps go on): the Fleet dashboard's time to recover
# shows recovered failures only, and a fleet where nothing ever failed has none to show.
HUNG_RUN, HANG_SECONDS = GPU_RUN, 30.0
# Grafana's own variables, as it would set them for a 1 h view of a 1 s scrape.
BUILTINS = {"__rate_interval": "5m", "__interval": "15s", "__range": "1h"}
ALERT_WAIT = 150.0


class Binary:
    """A Debian binary in a subprocess, logging to a file, ready when ``ready_url`` says 200."""

    def __init__(self, args: list[str], log: Path, ready_url: str) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        eventually(lambda: self._ready(ready_url), timeout=30, interval=0.5,
                   what=f"{args[0]} ready", context=self.tail)

    def _ready(self, url: str) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"exited with {self.proc.returncode}:\n{self.tail()}")
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def prometheus_config(path: Path, sidecars: list[str], prom: str, am: str) -> None:
    """deploy/prometheus/prometheus.yml with loopback targets, 1 s intervals, repo rules."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(DEPLOY / "prometheus" / "rules" / "*.yml")]
    config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [am]
    targets = {"monitor-agent": sidecars, "prometheus": [prom], "alertmanager": [am]}
    for job in config["scrape_configs"]:
        job.update(scrape_interval="1s", scrape_timeout="1s")
        job["static_configs"][0]["targets"] = targets[job["job_name"]]
    path.write_text(yaml.safe_dump(config))


def alertmanager_config(path: Path, hook: str) -> None:
    """deploy/alertmanager/alertmanager.yml with receivers at the webhook, 1 s grouping."""
    config = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    config["templates"] = [str(DEPLOY / "alertmanager" / "templates" / "*.tmpl")]
    config["route"].update(group_wait="1s", group_interval="1s")
    for receiver in config["receivers"]:
        for slack in receiver.get("slack_configs", []):
            del slack["api_url_file"]
            slack["api_url"] = hook + "/slack"
        for pd in receiver.get("pagerduty_configs", []):
            del pd["routing_key_file"]
            pd.update(routing_key="e2e-routing-key-0123456789abcdef", url=hook + "/pagerduty")
    path.write_text(yaml.safe_dump(config))


def trace_records(name: str, now: float) -> list[dict[str, Any]]:
    """A public trace with times moved to end now (the stalled one 20 min ago), labelled
    with the project. The fp16 run also gets GPU readings: NVML is the one boundary this
    machine has no hardware for."""
    path = TRACES / f"{name}.jsonl.gz"
    records = list(wire.iter_trace(path if path.exists() else RECORDED / f"{name}.jsonl.gz"))
    if name == STILL_TRAINING:
        records = [r for r in records if r["kind"] != "end"]
    if name == HUNG_RUN:
        records = with_a_recovered_hang(records)
    last = max(r["time"] for r in records if r.get("time") is not None)
    shift = now - (STALL_AGE if name == STALLED else 0.0) - last
    for i, rec in enumerate(records):
        if rec.get("time") is not None:
            rec["time"] += shift
        if rec["kind"] == "run":
            rec["labels"] = {"project": PROJECT, "team": "e2e"}
        if name == GPU_RUN and rec["kind"] == "step":
            rec["gpu"] = {"utilization": 0.9 - (i % 7) / 100, "temperature_c": 70.0, "power_w": 300.0}
            rec["memory"]["reserved_bytes"] = rec["memory"]["allocated_bytes"] * 1.25
    return records


def with_a_recovered_hang(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace with a hang after a quarter of its steps: every later record moved
    HANG_SECONDS on, and halfway through the silence the hang record the client's watchdog
    sends (the last step completed, how long stuck)."""
    steps = [r for r in records if r["kind"] == "step"]
    at = steps[len(steps) // 4]
    for rec in records:
        if rec.get("time") is not None and rec["time"] > at["time"]:
            rec["time"] += HANG_SECONDS
    hang = {"kind": "hang", "run_id": at["run_id"], "step": at["step"],
            "rank": at.get("rank", 0), "time": at["time"] + HANG_SECONDS / 2,
            "stuck_seconds": HANG_SECONDS / 2, "phase": "backward"}
    where = records.index(at) + 1
    return [*records[:where], hang, *records[where:]]


def post(url: str, records: list[dict[str, Any]]) -> None:
    for start in range(0, len(records), 500):
        body = b"\n".join(wire.dumps(r) for r in records[start:start + 500])
        resp = httpx.post(url + "/v1/records", content=body, timeout=60,
                          headers={"Content-Type": "application/x-ndjson",
                                   "Authorization": f"Bearer {TOKEN}"})
        assert resp.status_code == 200, resp.text


class Stack:
    """Everything started, the traces fed in two halves (so counters move between scrapes)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hook = Webhook()
        self.am_port, self.prom_port = free_port(), free_port()
        self.prom_url = f"http://127.0.0.1:{self.prom_port}"
        self.procs: list[Binary] = []
        env = {"MONITOR_AGENT_TOKEN": TOKEN,
               "MONITOR_AGENT_ALERTING__ALERTMANAGER__URLS": f'["http://127.0.0.1:{self.am_port}"]'}
        self.fed = SidecarProcess(tmp / "fed", env=env)
        self.doomed = SidecarProcess(tmp / "doomed", env=env)
        self.down_instance = f"127.0.0.1:{self.doomed.port}"

    def start(self) -> None:
        am_cfg, prom_cfg = self.tmp / "alertmanager.yml", self.tmp / "prometheus.yml"
        alertmanager_config(am_cfg, self.hook.url)
        am = f"127.0.0.1:{self.am_port}"
        self.procs.append(Binary(
            ["prometheus-alertmanager", f"--config.file={am_cfg}", f"--web.listen-address={am}",
             f"--storage.path={self.tmp / 'am'}", "--cluster.listen-address="],
            self.tmp / "alertmanager.log", f"http://{am}/-/ready"))
        self.fed.start()
        self.doomed.start()
        sidecars = [f"127.0.0.1:{s.port}" for s in (self.fed, self.doomed)]
        prometheus_config(prom_cfg, sidecars, f"127.0.0.1:{self.prom_port}", am)
        self.procs.append(Binary(
            ["prometheus", f"--config.file={prom_cfg}", f"--storage.tsdb.path={self.tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.prom_port}"],
            self.tmp / "prometheus.log", self.prom_url + "/-/ready"))

    def feed(self) -> None:
        records = {name: trace_records(name, time.time()) for name in FED}
        halves = [{n: r[: len(r) // 2] for n, r in records.items()},
                  {n: r[len(r) // 2:] for n, r in records.items()}]
        for half in halves:
            for recs in half.values():
                post(self.fed.url, recs)
            steps = {n: max(r["step"] for r in recs if r["kind"] == "step") for n, recs in half.items()}
            eventually(lambda steps=steps: self._scraped(steps), timeout=60, interval=0.5,
                       what=f"Prometheus to see {steps}", context=self.fed.log)

    def _scraped(self, steps: dict[str, int]) -> bool:
        seen = {s["metric"]["run_id"]: float(s["value"][1]) for s in
                self.query(f'max by (run_id) (training_last_step{{project="{PROJECT}"}})')}
        return all(seen.get(name, -1) >= step for name, step in steps.items())

    def kill_doomed_once_scraped(self) -> None:
        up = f'up{{instance="{self.down_instance}"}} == 1'
        eventually(lambda: self.query(up), timeout=30, interval=0.5,
                   what="the doomed sidecar's first scrape")
        self.doomed.kill()

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = httpx.get(self.prom_url + "/api/v1/query", params={"query": expr}, timeout=10)
        assert resp.status_code == 200, f"{expr}: {resp.text}"
        return resp.json()["data"]["result"]

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.procs) + self.fed.log()[-3000:]

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.fed.stop()
        self.doomed.stop()
        self.hook.close()


def have(binary: str) -> bool:
    return any((Path(d) / binary).exists() for d in os.environ.get("PATH", "").split(os.pathsep))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    for binary in ("prometheus", "prometheus-alertmanager"):
        if not have(binary):
            pytest.skip(f"{binary} not on PATH: apt-get install prometheus prometheus-alertmanager")
    if not TRACES.is_dir():
        pytest.skip(f"public traces not found at {TRACES}")
    stack = Stack(tmp_path_factory.mktemp("stack"))
    try:
        stack.start()
        stack.kill_doomed_once_scraped()
        stack.feed()
        post_alerts_to_alertmanager(stack)
        yield stack
    finally:
        stack.stop()


def post_alerts_to_alertmanager(stack: Stack) -> None:
    """As a sidecar does: a critical and a warning alert of one run, a warning of another."""
    def alert(name: str, severity: str, run: str) -> dict[str, Any]:
        return {"labels": {"alertname": name, "severity": severity, "project": PROJECT,
                           "run_id": run},
                "annotations": {"summary": f"{name} on {run}", "suggestion": "look"}}

    alerts = [alert("E2ENanInf", "critical", "inhibit-run"),
              alert("E2ELossSpikeMuted", "warning", "inhibit-run"),
              alert("E2ELossSpikeAlone", "warning", "other-run")]
    resp = httpx.post(f"http://127.0.0.1:{stack.am_port}/api/v2/alerts", json=alerts, timeout=10)
    assert resp.status_code == 200, resp.text


def mentions(bodies: list[dict[str, Any]], *words: str) -> list[dict[str, Any]]:
    return [b for b in bodies if all(w in json.dumps(b) for w in words)]


@pytest.fixture(scope="module")
def fired(stack: Stack) -> Stack:
    """Waits until both Prometheus alerts have paged through Alertmanager."""
    def paged() -> bool:
        pages = stack.hook.bodies("/pagerduty")
        return bool(mentions(pages, "MonitorAgentDown", stack.down_instance)
                    and mentions(pages, "TrainingRunStalled", STALLED))
    eventually(paged, timeout=ALERT_WAIT, interval=0.5,
               what="MonitorAgentDown and TrainingRunStalled at the webhook",
               context=lambda: f"{stack.hook.received}\n{stack.logs()}")
    return stack


def test_sidecar_down_pages_and_posts_to_slack(fired: Stack) -> None:
    (page, *_) = mentions(fired.hook.bodies("/pagerduty"), "MonitorAgentDown", fired.down_instance)
    assert page["routing_key"] == "e2e-routing-key-0123456789abcdef" and page["event_action"] == "trigger"
    assert page["payload"]["severity"] == "error"
    eventually(lambda: mentions(fired.hook.bodies("/slack"), "MonitorAgentDown"),
               timeout=30, interval=0.5, what="Slack copy")
    # The live sidecar is not reported down.
    fed = f"127.0.0.1:{fired.fed.port}"
    assert not mentions(fired.hook.bodies("/pagerduty"), "MonitorAgentDown", fed)


def test_stalled_run_pages_and_only_that_run(fired: Stack) -> None:
    (page, *_) = mentions(fired.hook.bodies("/pagerduty"), "TrainingRunStalled", STALLED)
    assert page["payload"]["custom_details"]["run_id"] == STALLED
    assert "py-spy" in json.dumps(page), "the rule's suggestion reaches the page"
    for live in FED:
        if live != STALLED:
            assert not mentions(fired.hook.bodies("/pagerduty"), "TrainingRunStalled", live)


def test_sidecar_findings_page_through_alertmanager(fired: Stack) -> None:
    # The sidecar's own alerts take the same routes: NaN in the fp16 run is critical.
    pages = mentions(fired.hook.bodies("/pagerduty"), GPU_RUN, "TrainingNanInf")
    assert pages and pages[0]["payload"]["custom_details"]["run_id"] == GPU_RUN
    assert mentions(fired.hook.bodies("/slack"), GPU_RUN, "TrainingNanInf", "Try: ")


def test_straggler_rule_picks_the_slow_rank(fired: Stack) -> None:
    # `for: 5m` keeps it pending here; promtool's unit tests cover the firing.
    alerts = fired.query(f'ALERTS{{alertname="TrainingRankStraggler", project="{PROJECT}"}}')
    assert {(a["metric"]["run_id"], a["metric"]["rank"]) for a in alerts} == {
        ("straggler_ddp_gpt", "1")}


def test_a_page_of_a_run_inhibits_its_warnings(fired: Stack) -> None:
    slack = fired.hook.bodies("/slack")
    eventually(lambda: mentions(fired.hook.bodies("/slack"), "E2ELossSpikeAlone"),
               timeout=30, interval=0.5, what="an uninhibited warning in Slack")
    assert mentions(fired.hook.bodies("/pagerduty"), "E2ENanInf")
    assert not mentions(fired.hook.bodies("/pagerduty"), "E2ELossSpike")
    assert not mentions(slack + fired.hook.bodies("/slack"), "E2ELossSpikeMuted")


def dashboard_queries() -> list[Any]:
    params = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        multi = {v["name"]: v["multi"] for v in board["templating"]["list"]}
        for q in iter_queries(board):
            params.append(pytest.param(q, multi, id=f"{path.stem}: {q.where}"))
    return params


def values_for(run: str, multi: dict[str, bool]) -> dict[str, str]:
    return {"project": PROJECT, "run": run, "rank": "0|1" if multi.get("rank") else "0",
            "layer": ".*"}


def has_data(result: list[dict[str, Any]]) -> bool:
    return any(s["value"][1] not in ("NaN", "+Inf", "-Inf") for s in result)


@pytest.mark.parametrize(("query", "multi"), dashboard_queries())
def test_dashboard_expression_returns_data(fired: Stack, query: Any, multi: dict[str, bool]) -> None:
    tried = {}
    for run in FED:
        expr = substitute(query.expr, values_for(run, multi), BUILTINS)
        result = fired.query(expr)
        if query.label:
            result = [s for s in result if s["metric"].get(query.label)]
        if has_data(result):
            return
        tried[run] = expr
    pytest.fail("no data for any fed run:\n" + "\n".join(f"{r}: {e}" for r, e in tried.items()))


def test_variables_offer_the_fed_runs_and_ranks(fired: Stack) -> None:
    runs = {s["metric"]["run_id"] for s in fired.query(f'training_run_info{{project="{PROJECT}"}}')}
    assert runs == set(FED)
    ranks = fired.query('training_last_step{run_id="straggler_ddp_gpt"}')
    assert {s["metric"]["rank"] for s in ranks} == {"0", "1"}


def test_fleet_goodput_panel_is_the_runs_ledgers_summed(fired: Stack) -> None:
    """The Fleet dashboard's goodput stat, queried from the real Prometheus, is what the
    sidecar's own ledgers say (``GET /v1/runs/{id}/goodput``), GPU-weighted over the fed
    runs; the badput panel splits the same time by cause."""
    from dashboards import fleet

    auth = {"Authorization": f"Bearer {TOKEN}"}
    ledgers = [httpx.get(f"{fired.fed.url}/v1/runs/{run}/goodput", headers=auth,
                         timeout=10).json() for run in FED]
    want = (sum(g["productive_seconds"] * g["gpus"] for g in ledgers)
            / sum(g["wall_seconds"] * g["gpus"] for g in ledgers))
    [sample] = fired.query(substitute(fleet.FLEET_GOODPUT, {"project": PROJECT}, BUILTINS))
    # A run whose hang is still open grows its wall time between the scrape and the read.
    assert float(sample["value"][1]) == pytest.approx(want, rel=0.02)
    causes = {s["metric"]["cause"]: float(s["value"][1]) for s in fired.query(
        substitute(fleet.BADPUT_GPU_HOURS, {"project": PROJECT}, BUILTINS))}
    assert set(causes) >= {"startup", "input", "hang_detected", "unaccounted"}
    spent = sum(g["badput_seconds"]["startup"] * g["gpus"] for g in ledgers) / 3600
    assert causes["startup"] == pytest.approx(spent, rel=0.02)
