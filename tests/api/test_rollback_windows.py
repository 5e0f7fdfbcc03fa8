"""A second rollback skips the windows of the first as well as its own (alerting/rollback.py
``decide``: a plan is the whole set of windows the resumed run leaves out, the earlier ones
merged in). Over real HTTP: a run rolls back once, resumes past its window, saves again past
it, diverges again, and its second plan is read back."""

from __future__ import annotations

from pathlib import Path

from tests.rollback_sidecar import post, rollback_sidecar
from tests.rollback_sidecar import save as _save
from tests.rollback_sidecar import step as _step


def test_a_second_rollback_skips_the_first_ones_window_too(tmp_path: Path):
    run = {"kind": "run", "run_id": "r", "time": 1000.0}
    with rollback_sidecar(tmp_path, rollback_skip_margin=3, rollback_budget=3) as srv:
        post(srv, [{**run, "attempt": "a"}, *(_step(s, s, "a") for s in range(1, 21)),
                    _save(10, 10, "a")])
        [first] = post(srv, [_step(21, 21, "a", "NaN")])["actions"]
        assert first["plan"]["skip"] == [[11, 24]], first["plan"]
        # The relaunch resumes at step 11 from the save at position 10 and reads past the
        # window: its step s trains position s + 14. It saves at step 30 (position 44),
        # then diverges at step 40 (position 54).
        post(srv, [{**run, "attempt": "b"}, *(_step(s, s + 14, "b") for s in range(11, 40)),
                    _save(30, 44, "b")])
        [second] = post(srv, [_step(40, 54, "b", "NaN")])["actions"]
    assert second["plan"]["number"] == 2 and second["plan"]["resume_position"] == 44
    # Its own window (45-57), and the first one's: a job resumes with every window of the
    # plan left out and nothing else (docs/actions.md), so a plan that forgot 11-24 would
    # have a DataStream that seeks back before them train them (docs/alerting.md, "windows
    # add up"). The e2e's second window always holds the first: this one does not.
    assert second["plan"]["skip"] == [[11, 24], [45, 57]], second["plan"]
