"""deploy/alertmanager: amtool accepts the config, and alerts route and inhibit as designed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import DEPLOY

pytestmark = pytest.mark.binaries
AM_DIR = DEPLOY / "alertmanager"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The config with its templates glob pointed at the repo, so amtool parses them too."""
    data = yaml.safe_load((AM_DIR / "alertmanager.yml").read_text())
    assert data["templates"] == ["/etc/alertmanager/templates/*.tmpl"]
    data["templates"] = [str(AM_DIR / "templates" / "*.tmpl")]
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def amtool_run(amtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([amtool, *args], capture_output=True, text=True, timeout=30)


def test_config_and_templates_pass_amtool(amtool: str, config: Path) -> None:
    proc = amtool_run(amtool, "check-config", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 templates" in proc.stdout and "SUCCESS" in proc.stdout


def test_a_broken_template_fails_the_check(amtool: str, config: Path, tmp_path: Path) -> None:
    # Proves the check above really parses templates.
    data = yaml.safe_load(config.read_text())
    bad = tmp_path / "bad.tmpl"
    bad.write_text('{{ define "x" }}{{ .Unclosed ')
    data["templates"] = [str(bad)]
    config.write_text(yaml.safe_dump(data))
    assert amtool_run(amtool, "check-config", str(config)).returncode != 0


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        ({"alertname": "NanInf", "severity": "critical", "run_id": "r", "project": "p"},
         "pagerduty,slack"),
        ({"alertname": "Divergence", "severity": "error", "run_id": "r"}, "pagerduty,slack"),
        ({"alertname": "LossSpike", "severity": "warning", "run_id": "r"}, "slack"),
        ({"alertname": "Plateau", "severity": "info", "run_id": "r"}, "blackhole"),
        ({"alertname": "MonitorAgentDown", "severity": "error", "instance": "a:9400"},
         "pagerduty,slack"),
        ({"alertname": "MonitorAgentDroppingSeries", "severity": "warning"}, "slack"),
        # An alert without a severity still reaches people.
        ({"alertname": "Unlabelled"}, "slack"),
    ],
)
def test_routes_by_severity(amtool: str, config: Path, labels: dict, receivers: str) -> None:
    args = [f"{k}={v}" for k, v in labels.items()]
    proc = amtool_run(amtool, "config", "routes", "test", f"--config.file={config}",
                      f"--verify.receivers={receivers}", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_groups_by_run_and_sidecar_alerts_by_instance() -> None:
    route = yaml.safe_load((AM_DIR / "alertmanager.yml").read_text())["route"]
    assert route["group_by"] == ["project", "run_id"]
    sidecar_routes = [r for top in route["routes"] for r in top.get("routes", [])]
    assert sidecar_routes and all(r["group_by"] == ["alertname", "instance"] for r in sidecar_routes)


def test_a_page_of_a_run_inhibits_its_warnings() -> None:
    rules = yaml.safe_load((AM_DIR / "alertmanager.yml").read_text())["inhibit_rules"]
    run_rule = next(r for r in rules if r["equal"] == ["project", "run_id"])
    assert run_rule["source_matchers"] == ['severity=~"critical|error"', 'run_id=~".+"']
    assert run_rule["target_matchers"] == ['severity=~"warning|info"']


def test_secrets_are_read_from_files_not_written_in_the_config() -> None:
    receivers = {r["name"]: r for r in yaml.safe_load((AM_DIR / "alertmanager.yml").read_text())["receivers"]}
    slack = receivers["slack"]["slack_configs"][0]
    pagerduty = receivers["pagerduty"]["pagerduty_configs"][0]
    assert slack["api_url_file"] == "/run/secrets/slack_webhook_url" and "api_url" not in slack
    assert pagerduty["routing_key_file"] == "/run/secrets/pagerduty_routing_key"
    assert "routing_key" not in pagerduty
