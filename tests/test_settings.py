"""Settings: YAML < env < flags, errors that name the field, secrets never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor_agent.settings import ConfigError, load_settings


def test_defaults_bind_loopback_9400():
    s = load_settings()
    assert (s.host, s.port, s.max_body_bytes) == ("127.0.0.1", 9400, 8 * 1024 * 1024)


def test_precedence_yaml_env_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: 9500\nhost: 0.0.0.0\nmax_active_runs: 7\n")
    monkeypatch.setenv("MONITOR_AGENT_PORT", "9600")
    s = load_settings(cfg, host="127.0.0.2")
    assert (s.port, s.host, s.max_active_runs) == (9600, "127.0.0.2", 7)


def test_nested_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MONITOR_AGENT_DETECTORS__EMA_ALPHA", "0.9")
    assert load_settings().detectors.ema_alpha == 0.9


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("port: 70000\n", "port"),
        ("prot: 9400\n", "prot"),
        ("detectors:\n  ema_alpha: 7\n", "detectors.ema_alpha"),
        ("max_body_bytes: lots\n", "max_body_bytes"),
    ],
)
def test_errors_name_the_field(tmp_path: Path, yaml_text: str, field: str):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert f"  {field}:" in str(err.value)
    assert str(cfg) in str(err.value)


def test_missing_file_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")


def test_token_is_redacted(tmp_path: Path):
    s = load_settings(token="hunter2-token")
    assert s.token_value() == "hunter2-token"
    assert "hunter2-token" not in repr(s)
    assert "hunter2-token" not in str(s.redacted())


def test_token_file(tmp_path: Path):
    (tmp_path / "tok").write_text("from-file\n")
    assert load_settings(token_file=tmp_path / "tok").token_value() == "from-file"
