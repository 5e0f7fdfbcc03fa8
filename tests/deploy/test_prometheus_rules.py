"""deploy/prometheus: the config and rules pass promtool, and the rules are complete."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import DASHBOARDS, DEPLOY, RULE_FILES, RULES_DIR

pytestmark = pytest.mark.binaries
PROM_DIR = DEPLOY / "prometheus"
SEVERITIES = {"info", "warning", "error", "critical"}


def run(*cmd: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=60)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def rules() -> list[dict]:
    return [r for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]
            for r in g["rules"]]


def alert_tests() -> list[dict]:
    files = sorted((PROM_DIR / "tests").glob("*.yml"))
    return [a for f in files for t in yaml.safe_load(f.read_text())["tests"]
            for a in t.get("alert_rule_test", [])]


def test_config_with_its_rule_files_passes_promtool(promtool: str, tmp_path: Path) -> None:
    # The container path of rule_files does not exist here; point it at the repo's rules so
    # `check config` also loads and checks every rule file it names.
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    config["rule_files"] = [str(RULES_DIR / "*.yml")]
    copy = tmp_path / "prometheus.yml"
    copy.write_text(yaml.safe_dump(config))
    out = run(promtool, "check", "config", str(copy))
    for path in RULE_FILES:
        assert f"Checking {path}" in out


def test_rule_files_pass_promtool(promtool: str) -> None:
    assert [p.name for p in RULE_FILES] == ["sidecar.yml", "training.yml"]
    run(promtool, "check", "rules", *map(str, RULE_FILES))


def test_rule_unit_tests_pass(promtool: str) -> None:
    tests = sorted((PROM_DIR / "tests").glob("*.yml"))
    assert tests, "no promtool unit tests"
    out = run(promtool, "test", "rules", *map(str, tests))
    assert out.count("SUCCESS") == len(tests)


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    tested = alert_tests()
    for rule in (r for r in rules() if "alert" in r):
        cases = [t for t in tested if t["alertname"] == rule["alert"]]
        assert any(t.get("exp_alerts") for t in cases), f"{rule['alert']} never tested firing"
        assert any(not t.get("exp_alerts") for t in cases), f"{rule['alert']} never tested quiet"


def test_alerts_carry_severity_summary_and_suggestion() -> None:
    alerts = [r for r in rules() if "alert" in r]
    assert {a["alert"] for a in alerts} >= {
        "MonitorAgentDown", "TrainingRunStalled", "TrainingRankStraggler",
        "MonitorAgentNotificationsFailing",
    }
    for alert in alerts:
        assert alert["labels"]["severity"] in SEVERITIES, alert["alert"]
        assert {"summary", "description", "suggestion"} <= alert["annotations"].keys()


def test_recording_rules_follow_the_naming_convention_and_are_used() -> None:
    exprs = [r["expr"] for r in rules()]
    boards = [p.read_text() for p in DASHBOARDS]
    for name in (r["record"] for r in rules() if "record" in r):
        level, metric, operation = name.split(":")
        assert level and metric.startswith(("training_", "monitor_agent_")) and operation, name
        assert any(name in text for text in exprs + boards), f"{name} is recorded but unused"


def test_scrape_job_is_the_one_the_alerts_match() -> None:
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["monitor-agent"]["static_configs"][0]["targets"] == ["monitor-agent:9400"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "alertmanager:9093"
    ]
    assert 'up{job="monitor-agent"}' in (RULES_DIR / "sidecar.yml").read_text()
