"""action_held: a rank that held the job's action back (an ``agreement`` record) pages once
per action and outcome, naming the rank and why; the told set survives a restore. (Also
proven on real ranks: tests/e2e/test_multi_node.py.)"""

from __future__ import annotations

from monitor_agent.detectors import DetectorSettings, DetectorSuite
from monitor_agent.records.schemas import parse_record


def _held(rank: int, outcome: str, rounds: int, step: int, action: str = "rollback"):
    return parse_record({"kind": "agreement", "run_id": "r", "rank": rank, "step": step,
                         "time": float(step), "action_id": 2, "action": action,
                         "outcome": outcome, "rounds": rounds, "check_every": 10,
                         "detail": "why"})


def _found(suite, records):
    return [f for rec in records for f in suite.update(rec) if f.type == "action_held"]


def test_a_hold_pages_once_per_action_and_outcome():
    suite = DetectorSuite(DetectorSettings())
    found = _found(suite, [_held(3, "missing", 1, 130), _held(3, "missing", 2, 140),
                           _held(1, "mismatch", 1, 150), _held(3, "missing", 1, 160, "stop")])
    assert [(f.rank, f.step, f.severity.label) for f in found] == [
        (3, 130, "error"), (1, 150, "error"), (3, 160, "error")]
    assert "rank 1 holds another content under its id" in found[1].message
    assert found[2].message.startswith("stop 2 held back at step 160")


def test_what_it_told_survives_a_restore():
    suite = DetectorSuite(DetectorSettings())
    assert len(_found(suite, [_held(3, "missing", 1, 130)])) == 1
    restored = DetectorSuite(DetectorSettings())
    restored.restore(suite.snapshot())
    assert _found(restored, [_held(3, "missing", 4, 170)]) == []
