"""Alerting settings: secrets from env or files, never shown; bad rules fail at load."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from monitor_agent.alerting.settings import PAGERDUTY_EVENTS_URL, AlertingSettings
from monitor_agent.settings import ConfigError, load_settings

SLACK = "https://hooks.slack.com/services/T0/B0/verysecret"


def test_secrets_from_files(tmp_path: Path):
    (tmp_path / "slack").write_text(SLACK + "\n")
    (tmp_path / "pd").write_text("pdkey" + "0" * 27 + "\n")
    s = AlertingSettings(slack={"webhook_url_file": tmp_path / "slack"},
                         pagerduty={"routing_key_file": tmp_path / "pd"})
    assert (s.slack.secret(), s.pagerduty.secret()) == (SLACK, "pdkey" + "0" * 27)
    assert s.pagerduty.url == PAGERDUTY_EVENTS_URL
    assert "verysecret" not in repr(s) and "pdkey" not in str(s.model_dump(mode="json"))


def test_env_nesting_and_redaction(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MONITOR_AGENT_ALERTING__SLACK__WEBHOOK_URL", SLACK)
    monkeypatch.setenv("MONITOR_AGENT_ALERTING__ALERTMANAGER__URLS", '["http://u:pw@am:9093"]')
    s = load_settings()
    assert s.alerting.slack.secret() == SLACK
    shown = str(s.redacted())
    assert "verysecret" not in shown and "pw@" not in shown and "u:***@am:9093" in shown


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"slack": {"webhook_url": SLACK, "webhook_url_file": "/x"}}, "not both"),
        ({"pagerduty": {"routing_key_file": "/nonexistent/key"}}, "routing_key_file: cannot read"),
        ({"pagerduty": {"routing_key": "short"}}, "32 characters without spaces; got 5"),
        ({"pagerduty": {"routing_key": "0123456789abcdef 0123456789abcde"}}, "whitespace inside"),
        ({"group_wait_seconds": -1}, "group_wait_seconds"),
        ({"slak": {}}, "slak"),
    ],
)
def test_bad_settings_name_the_field(section: dict, message: str):
    with pytest.raises(ValidationError) as err:
        AlertingSettings(**section)
    assert message in str(err.value)


def test_empty_secret_file_is_rejected(tmp_path: Path):
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValidationError, match="is empty"):
        AlertingSettings(webhook={"url_file": tmp_path / "empty"})


def test_invalid_rules_file_fails_config_load(tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("routes: {chat: [slack]}\nrules:\n  - name: X\n"
                     "    match: {types: [nan_inf]}\n    cooldwn: 5m\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"alerting:\n  rules_file: {rules}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(config)
    assert "rules[0].cooldwn (rule X): unknown field" in str(err.value)
