"""The activation detectors on real recorded runs: ``tests/traces`` (scripts/traces/record_traces.py).

Same rule and same two drivers (``DetectorSuite`` directly and ``monitor_agent.pipeline.trace_judge``) as
the public traces: expected findings first fire inside their windows, anything else that
fires is listed in ``allowed``, healthy runs page nothing; and a healthy run raises none of
the activation types at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from detector_harness import replay_trace
from test_public_traces import _replay, problems

TRACES = Path(__file__).resolve().parents[1] / "traces"
NEW_TYPES = {"dead_units", "activation_blowup"}


def _labels() -> list[dict]:
    return json.loads((TRACES / "labels.json").read_text())


@pytest.mark.parametrize("driver", ["suite", "replay"])
@pytest.mark.parametrize("label", _labels(), ids=lambda lab: lab["file"].split(".")[0])
def test_recorded_trace_meets_labels(label: dict, driver: str):
    path = TRACES / label["file"]
    findings = replay_trace(path) if driver == "suite" else _replay(path)
    assert problems(label, findings) == []
    if label["healthy"]:
        assert [f for f in findings if f.type in NEW_TYPES] == []


def test_every_activation_type_is_expected_by_a_recording():
    assert {e["type"] for lab in _labels() for e in lab["expected"]} >= NEW_TYPES
    assert sum(lab["healthy"] for lab in _labels()) >= 1


def test_the_checker_catches_a_missing_activation_detector():
    label = next(lab for lab in _labels() if lab["scenario"] == "activation_blowup")
    findings = replay_trace(TRACES / label["file"])
    assert problems(label, [f for f in findings if f.type != "activation_blowup"]) != []
