"""dashboards/*.json: a valid Grafana model, generated from the Python beside it, and every
expression parses as PromQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import DASHBOARD_DIR, DASHBOARDS, DEPLOY

from dashboards import generate
from dashboards.queries import iter_panels, iter_queries, substitute, variables_in

PROVISIONING = DEPLOY / "grafana" / "provisioning"
UIDS = {"training-run.json": "monitor-agent-training-run", "layers.json": "monitor-agent-layers",
        "fleet.json": "monitor-agent-fleet"}
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
UNITLESS = {"row"}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def provisioned_uid() -> str:
    sources = yaml.safe_load((PROVISIONING / "datasources" / "monitor-agent.yml").read_text())
    return next(d["uid"] for d in sources["datasources"] if d["type"] == "prometheus")


@pytest.fixture(params=[p.name for p in DASHBOARDS])
def board(request: pytest.FixtureRequest) -> dict:
    return load(DASHBOARD_DIR / request.param) | {"_file": request.param}


def test_the_three_dashboards_exist_with_stable_uids() -> None:
    assert {p.name: load(p)["uid"] for p in DASHBOARDS} == UIDS


def test_committed_json_is_what_the_generator_writes() -> None:
    assert generate.stale() == [], "run: python -m dashboards.generate"


def test_model_basics(board: dict) -> None:
    assert board["schemaVersion"] >= 36 and board["title"] and board["panels"]
    ids = [p["id"] for p in iter_panels(board["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_panels_fit_the_grid_without_overlapping(board: dict) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in iter_panels(board["panels"]):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not mine & cells, f'{panel["title"]} overlaps another panel'
        cells |= mine


def test_every_query_uses_the_provisioned_datasource(board: dict) -> None:
    uid = provisioned_uid()
    for panel in iter_panels(board["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"] and all(t["datasource"]["uid"] == uid for t in panel["targets"])
    for var in board["templating"]["list"]:
        assert var["datasource"]["uid"] == uid
    for ann in board["annotations"]["list"]:
        assert ann.get("builtIn") or ann["datasource"]["uid"] == uid


def test_every_variable_used_is_defined(board: dict) -> None:
    defined = {v["name"] for v in board["templating"]["list"]}
    for query in iter_queries(board):
        unknown = variables_in(query.expr) - defined - set(BUILTINS)
        assert not unknown, f"{board['_file']} {query.where} uses undefined {unknown}"
    # Variables refer only to variables defined before them (Grafana resolves in order).
    seen: set[str] = set()
    for var in board["templating"]["list"]:
        assert variables_in(var["definition"]) <= seen, var["name"]
        seen.add(var["name"])


def test_every_panel_sets_a_unit(board: dict) -> None:
    for panel in iter_panels(board["panels"]):
        if panel["type"] not in UNITLESS:
            assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]


@pytest.mark.binaries
def test_every_expression_parses_as_promql(promtool: str, tmp_path: Path) -> None:
    # promtool parses each expression as a recording rule: exact Prometheus syntax checks.
    values = {"project": ".*", "run": "r", "rank": "0", "layer": ".*"}
    exprs = [(p.name, q) for p in DASHBOARDS for q in iter_queries(load(p))]
    rules = [{"record": f"dashboard:check:{i}", "expr": substitute(q.expr, values, BUILTINS)}
             for i, (_, q) in enumerate(exprs)]
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(rules)} rules found" in proc.stdout


def test_provisioning_loads_the_dashboards_directory_compose_mounts() -> None:
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "monitor-agent.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    compose = yaml.safe_load((DEPLOY.parent / "docker-compose.yml").read_text())
    assert f"./dashboards:{path}:ro" in compose["services"]["grafana"]["volumes"]


def test_training_run_dashboard_has_what_the_issue_asks_for() -> None:
    board = load(DASHBOARD_DIR / "training-run.json")
    assert [v["name"] for v in board["templating"]["list"]] == ["project", "run", "rank"]
    titles = {p["title"]: p for p in iter_panels(board["panels"])}
    exprs = {t["expr"] for p in titles.values() for t in p.get("targets", [])}
    for metric in ("training_loss_ema", "training_val_loss", "training_learning_rate",
                   "training_grad_clip_threshold", "training_update_ratio", "training_mfu_ratio",
                   "training_tokens_per_second", "training_memory_total_bytes",
                   "training_step_duration_seconds_bucket", "training_alert_active"):
        assert any(metric in e for e in exprs), metric
    assert titles["Step time"]["type"] == "heatmap"
    assert titles["Update ratio ||update|| / ||param||"]["fieldConfig"]["defaults"]["thresholds"]
    assert "suggestion" in json.dumps(titles["Active alerts"]["transformations"])
    names = {a["name"] for a in board["annotations"]["list"]}
    assert {"Findings", "Sidecar alerts", "Prometheus alerts"} <= names


def test_alert_links_open_the_training_run_dashboard_on_the_run() -> None:
    from urllib.parse import parse_qs, urlsplit

    from monitor_agent.alerting.events import dashboard_url

    url = urlsplit(dashboard_url("http://grafana:3000", "run-1", 1_700_000_000.0))
    board = load(DASHBOARD_DIR / "training-run.json")
    assert url.path.startswith(f"/d/{board['uid']}")
    variables = {v["name"] for v in board["templating"]["list"]}
    chosen = {k.removeprefix("var-") for k in parse_qs(url.query) if k.startswith("var-")}
    assert chosen and chosen <= variables
