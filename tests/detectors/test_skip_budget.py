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
