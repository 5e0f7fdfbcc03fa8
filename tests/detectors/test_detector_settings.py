"""DetectorSettings: sane defaults, invalid values rejected with the field named.

(Named test_detector_settings, not test_settings: tests/test_settings.py exists and
pytest needs unique basenames in this rootdir-style layout.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from monitor_agent.detectors import DetectorSettings


def test_defaults():
    s = DetectorSettings()
    assert s.ema_alpha == 0.99 and s.disabled == set() and s.log_only == set()
    assert s.update_ratio_max == 0.1 and s.update_ratio_min == 1e-7
    assert s.stall_horizon_seconds > s.stall_min_seconds


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"ema_alpha": 1.5}, "ema_alpha"),
        ({"spike_ratio": 0.5}, "spike_ratio"),
        ({"dead_steps": 0}, "dead_steps"),
        ({"disabled": ["nan_inff"]}, "disabled"),
        ({"log_only": ["loss-spike"]}, "log_only"),
        ({"spke_z": 3}, "spke_z"),
    ],
)
def test_invalid_values_name_the_field(values: dict, field: str):
    with pytest.raises(ValidationError) as err:
        DetectorSettings(**values)
    assert field in str(err.value)


def test_unknown_type_lists_the_known_ones():
    with pytest.raises(ValidationError, match="known: nan_inf, loss_spike"):
        DetectorSettings(disabled={"nope"})


def test_inconsistent_limits_are_rejected():
    with pytest.raises(ValidationError, match="memory_critical"):
        DetectorSettings(memory_high=0.95, memory_critical=0.9)


def test_each_detectors_knobs_are_set_flat():
    s = DetectorSettings(spike_ratio=1.5, stall_min_seconds=60)
    assert (s.spike_ratio, s.stall_min_seconds, s.baseline_window) == (1.5, 60.0, 100)
    with pytest.raises(ValidationError, match="loss_spike"):
        DetectorSettings(loss_spike={"spike_ratio": 1.5})  # no section per detector
    assert "loss_spike" not in DetectorSettings().model_dump()


def test_yaml_section_and_env_reach_the_detectors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from monitor_agent.settings import ConfigError, load_settings

    cfg = tmp_path / "c.yaml"
    cfg.write_text("detectors:\n  log_only: [gain_drift]\n  spike_z: 8\n")
    monkeypatch.setenv("MONITOR_AGENT_DETECTORS__DEAD_STEPS", "7")
    s = load_settings(cfg).detectors
    assert (s.log_only, s.spike_z, s.dead_steps) == ({"gain_drift"}, 8.0, 7)
    cfg.write_text("detectors:\n  spike_z: -1\n")
    with pytest.raises(ConfigError, match="detectors.spike_z"):
        load_settings(cfg)
