"""The detector registry (catalogue.DETECTOR_CLASSES) and what is assembled from it: the
finding types, their usual severities and the flat DetectorSettings (composed from the
registered detectors' settings models, and reaching the sidecar's settings); plus the
package layout rules that keep a detector one file (no detector imports a sibling
detector)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import Field, ValidationError

from monitor_agent.detectors import FINDING_TYPES, DetectorSettings, DetectorSuite
from monitor_agent.detectors.catalogue import DETECTOR_CLASSES, USUAL_SEVERITY
from monitor_agent.detectors.nan_inf import NanInfDetector
from monitor_agent.detectors.settings import compose_settings
from monitor_agent.detectors.support.base import Detector
from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.records.types import Severity

PACKAGE = Path(__file__).resolve().parents[2] / "monitor_agent" / "detectors"
NOT_DETECTORS = {"__init__", "catalogue", "settings", "suite"}


def _models() -> list[type[SharedSettings]]:
    return list(dict.fromkeys(cls.settings_model for cls in DETECTOR_CLASSES))


def test_every_registered_class_declares_type_severity_and_settings():
    assert len(set(FINDING_TYPES)) == len(DETECTOR_CLASSES)
    for cls in DETECTOR_CLASSES:
        assert cls.type and isinstance(cls.severity, Severity), cls
        assert issubclass(cls.settings_model, SharedSettings), cls
        assert USUAL_SEVERITY[cls.type] is cls.severity


def test_the_flat_settings_are_exactly_the_detectors_knobs():
    declared = set(SharedSettings.model_fields)
    for model in _models():
        declared |= set(model.model_fields)
    assert set(DetectorSettings.model_fields) == declared
    settings = DetectorSettings()
    assert all(isinstance(settings, model) for model in _models())


def test_no_knob_is_declared_by_two_detectors():
    owner: dict[str, str] = {}
    shared = set(SharedSettings.model_fields)
    for model in _models():
        for name in set(model.model_fields) - shared:
            assert name not in owner, f"{name} in {owner.get(name)} and {model.__name__}"
            owner[name] = model.__name__


def test_each_registered_detectors_knobs_reach_the_sidecar_settings():
    """A registered detector's knobs are ``detectors.<knob>`` in the sidecar's settings
    (YAML and env), with the defaults, limits and descriptions its own model declares."""
    from monitor_agent.settings import Settings

    schema = Settings.model_json_schema()
    section = schema["$defs"][schema["properties"]["detectors"]["$ref"].rsplit("/", 1)[1]]
    for cls in DETECTOR_CLASSES:
        own = cls.settings_model.model_json_schema()["properties"]
        for knob, declared in own.items():
            assert section["properties"].get(knob) == declared, (cls.type, knob)
            assert declared.get("description"), f"{cls.type}: {knob} has no description"
    # The detector is handed the sidecar's section itself, typed as its own model.
    settings = Settings().detectors
    assert all(isinstance(settings, cls.settings_model) for cls in DETECTOR_CLASSES)


def test_knobs_come_out_shared_first_then_in_catalogue_order():
    order = list(SharedSettings.model_fields)
    for model in _models():
        order += [k for k in model.model_fields if k not in order]
    assert list(DetectorSettings.model_fields) == order


@pytest.mark.parametrize(("values", "message"), [
    ({"memory_high": 0.95, "memory_critical": 0.9}, "memory_critical must be >= memory_high"),
    ({"overfit_gap_mild": 0.5, "overfit_gap_high": 0.4}, "overfit_gap_high must be >= overfit"),
    ({"update_ratio_min": 0.5}, "update_ratio_min must be < update_ratio_max"),
])
def test_each_models_cross_checks_survive_composition(values: dict, message: str):
    with pytest.raises(ValidationError, match=message):
        DetectorSettings(**values)


class _ToySettings(SharedSettings):
    toy_ratio: float = Field(default=2.0, gt=1, description="A toy knob.")


class _ToyDetector(DetectorBase[_ToySettings]):
    type = "nan_inf"  # a known type, so disabled/log_only validation still applies
    severity = Severity.INFO
    settings_model = _ToySettings


def test_composing_adds_a_new_detectors_knobs_flat():
    model = compose_settings((NanInfDetector, _ToyDetector))
    s = model(toy_ratio=3.0, nan_persist_steps=4, log_only={"nan_inf"})
    assert (s.toy_ratio, s.nan_persist_steps, s.baseline_window) == (3.0, 4, 100)
    with pytest.raises(ValidationError, match="toy_ratio"):
        model(toy_ratio=0.5)
    with pytest.raises(ValidationError, match="spike_z"):
        model(spike_z=3.0)  # loss_spike is not in this composition
    with pytest.raises(ValidationError, match="unknown finding type"):
        model(disabled={"nope"})


def test_the_suite_holds_detector_protocol_objects_in_catalogue_order():
    suite = DetectorSuite()
    assert [d.type for d in suite.detectors] == list(FINDING_TYPES)
    assert all(isinstance(d, Detector) for d in suite.detectors)


def _detector_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.glob("*.py")) if p.stem not in NOT_DETECTORS]


def test_the_package_top_level_holds_detectors_only():
    registered = {cls.__module__.rsplit(".", 1)[1] for cls in DETECTOR_CLASSES}
    assert {p.stem for p in _detector_modules()} == registered


def test_no_detector_imports_a_sibling_detector():
    siblings = {f"monitor_agent.detectors.{p.stem}" for p in _detector_modules()}
    for path in _detector_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            else:
                continue
            assert not names & siblings, f"{path.name} imports {names & siblings}"
