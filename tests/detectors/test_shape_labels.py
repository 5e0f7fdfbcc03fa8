"""The shape recordings' labels (``tests/traces/shapes``, ``scripts/traces/shapes_runs.py``) agree
with the recordings: every file is labelled once, each half (seed 1 ``tune``, seeds 2-3
``heldout``) holds healthy and faulty runs, and every window lies within the recorded
steps. No detector runs here: ``bench/detection.py`` scores the detectors on this set.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

SHAPES = Path(__file__).resolve().parents[1] / "traces" / "shapes"
LABELS = SHAPES / "labels.json"
pytestmark = pytest.mark.skipif(not LABELS.exists(), reason=f"{LABELS} not present")
HALVES = {"1": "tune", "2": "heldout", "3": "heldout"}


def _labels() -> list[dict]:
    return json.loads(LABELS.read_text())


def test_every_recording_is_labelled_once() -> None:
    files = sorted(p.name for p in SHAPES.glob("*.jsonl.gz"))
    labelled = [lab["file"] for lab in _labels()]
    assert sorted(labelled) == files
    assert len(set(labelled)) == len(labelled)


def test_halves_follow_the_seed_and_hold_both_kinds() -> None:
    labels = _labels()
    for lab in labels:
        seed = lab["file"].split(".")[0].rsplit("_s", 1)[1]
        assert lab["half"] == HALVES[seed], lab["file"]
    for half in ("tune", "heldout"):
        kinds = {lab["healthy"] for lab in labels if lab["half"] == half}
        assert kinds == {True, False}, half
        faults = {lab["scenario"] for lab in labels if lab["half"] == half and not lab["healthy"]}
        assert faults == {"recur", "burst", "kept", "nan"}, half


@pytest.mark.parametrize("label", _labels() if LABELS.exists() else [],
                         ids=lambda lab: lab["file"].split(".")[0])
def test_label_matches_its_recording(label: dict) -> None:
    with gzip.open(SHAPES / label["file"], "rt") as fh:
        records = [json.loads(line) for line in fh]
    run = records[0]
    assert run["kind"] == "run" and run["config"]["scenario"] == label["scenario"]
    steps = [r["step"] for r in records if r["kind"] == "step" and r.get("rank", 0) == 0]
    assert len(steps) == label["steps_recorded"]
    assert label["healthy"] == (run["config"]["fault_step"] is None) == (not label["expected"])
    for e in label["expected"]:
        assert steps[0] <= e["first_step"] <= e["last_step"], (label["file"], e)
        assert e["first_step"] <= steps[-1], (label["file"], e)
        assert e["type"] not in label["allowed"], (label["file"], e)
