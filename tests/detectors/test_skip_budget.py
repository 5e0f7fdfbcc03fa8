"""skip_budget: N step-guard skips within M steps page; fewer, older ones, or the loss
scaler's own skips do not; the count survives a snapshot and restore."""

from __future__ import annotations

from monitor_agent.detectors import DetectorSettings, DetectorSuite
from monitor_agent.records.schemas import parse_record


def _steps(skips: dict[int, str], last: int, rank: int = 0):
    for s in range(1, last + 1):
        extra = {"skipped": True, "skip_reason": skips[s]} if s in skips else {}
        yield parse_record({"kind": "step", "run_id": "r", "step": s, "time": float(s),
                            "rank": rank, "loss": 2.0, "grad_norm": 1.0, **extra})


def _budget(suite: DetectorSuite, records) -> list:
    return [f for rec in records for f in suite.update(rec) if f.type == "skip_budget"]


def _suite() -> DetectorSuite:
    return DetectorSuite(DetectorSettings(skip_budget_skips=3, skip_budget_steps=100))


def test_the_budget_pages_on_the_skip_that_exceeds_it_naming_reasons_and_steps():
    found = _budget(_suite(), _steps({10: "grad_norm_outlier", 40: "nonfinite_grad",
                                      90: "grad_norm_outlier"}, 120))
    assert [f.step for f in found] == [90]
    assert found[0].evidence["steps"] == [10, 40, 90]
    assert found[0].evidence["by_reason"] == {"grad_norm_outlier": 2, "nonfinite_grad": 1}
    assert "steps 10, 40, 90" in found[0].message and "nonfinite_grad x1" in found[0].message


def test_skips_spread_wider_than_the_window_never_page():
    assert _budget(_suite(), _steps({10: "grad_norm_outlier", 80: "grad_norm_outlier",
                                     150: "grad_norm_outlier", 220: "nonfinite_grad"},
                                    300)) == []


def test_loss_scaler_skips_are_not_counted():
    skips = {s: "loss_scale" for s in range(10, 30)} | {50: "grad_norm_outlier"}
    assert _budget(_suite(), _steps(skips, 60)) == []


def test_the_count_survives_a_snapshot_and_restore():
    suite = _suite()
    records = list(_steps({10: "grad_norm_outlier", 20: "grad_norm_outlier",
                           30: "grad_norm_outlier"}, 40))
    assert _budget(suite, records[:25]) == []
    restored = _suite()
    restored.restore(suite.snapshot())
    assert [f.step for f in _budget(restored, records[25:])] == [30]


def test_a_step_the_guard_skipped_pages_nothing_and_leaves_the_loss_ema_alone():
    """Issue 31: a NaN the guard skipped (weights untouched) and a spike it skipped page
    nobody, do not make the run unhealthy and stay out of the loss EMA; a skip with no
    guard reason (a step the trainer never took) is not the guard's and is not counted."""
    from monitor_agent.runs.verdict import VerdictTracker

    suite, verdict = DetectorSuite(DetectorSettings()), VerdictTracker()
    bad = {150: {"loss": "NaN", "grad_norm": "NaN", "skipped": True,
                 "skip_reason": "nonfinite_grad"},
           170: {"loss": 6000.0, "grad_norm": 900.0, "skipped": True,
                 "skip_reason": "grad_norm_outlier"},
           180: {"loss": 2.0, "grad_norm": 1.0, "skipped": True}}
    found = []
    for s in range(1, 201):
        rec = parse_record({"kind": "step", "run_id": "r", "step": s, "time": float(s),
                            "loss": 2.0 + 0.01 * (s % 5), "grad_norm": 1.0 + 0.01 * (s % 3),
                            **bad.get(s, {})})
        out = suite.update(rec)
        verdict.observe(rec, out)
        found += out
    assert [(f.type, f.severity.label) for f in found if f.severity.label != "info"] == []
    assert 2.0 <= suite.ema_loss() <= 2.05
    assert verdict.verdict("completed").text == "completed, healthy"
    assert suite.preview(parse_record({"kind": "step", "run_id": "r", "step": 201,
                                       "time": 201.0, **bad[150]})) == []
    # Not a page on its own, but counted: the budget (5 in 500 by default) sees both.
    state = suite.snapshot()["detectors"]["skip_budget"]
    assert "150" in str(state) and "170" in str(state) and "180" not in str(state)
