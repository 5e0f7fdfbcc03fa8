"""overfitting: val rising while train falls (with a gap), or a high gap once val stalls."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, eval_rec, feed, only, run, step

from monitor_agent.detectors import overfitting as tips


def _evals(pairs: list[tuple[float, float]]) -> list:
    return [eval_rec(10 * (k + 1), v, t) for k, (v, t) in enumerate(pairs)]


def test_val_rising_while_train_falls_fires_after_two_evals():
    pairs = [(3.0, 3.2), (2.6, 2.5), (2.7, 2.3), (2.9, 2.1), (2.95, 2.0), (3.1, 1.8)]
    found = feed(only("overfitting", overfit_gap_high=5.0), _evals(pairs))
    assert [f.step for f in found] == [50]
    f = found[0]
    assert f.threshold == 2.6 and f.evidence["gap_band"] == "mild"  # high moved to 500%
    assert f.suggestions == tips.OVERFITTING


def test_gap_bands_are_10_and_30_percent():
    pairs = [(2.0, 2.1), (2.1, 1.5), (2.1, 1.45), (2.12, 1.4)]  # gap 40%+, val stalled
    found = feed(only("overfitting"), _evals(pairs))
    assert [f.step for f in found] == [30] and found[0].evidence["gap"] >= 0.3


def test_one_noisy_eval_above_a_lucky_best_is_not_a_trend():
    pairs = [(0.95, 1.2), (0.75, 0.89), (0.86, 0.82), (0.79, 0.81), (0.86, 0.78), (0.74, 0.78)]
    assert feed(only("overfitting"), _evals(pairs)) == []


def test_val_rising_without_a_gap_is_not_overfitting():
    pairs = [(2.0, 2.0), (1.9, 2.0), (2.2, 2.1), (2.3, 2.2), (2.5, 2.4)]
    assert feed(only("overfitting"), _evals(pairs)) == []


def test_train_loss_falls_back_to_the_loss_ema():
    recs = [step(i, loss=1.0) for i in range(1, 10)] + [eval_rec(10, 2.0)]
    recs += [step(i, loss=1.0) for i in range(11, 20)] + [eval_rec(20, 2.1)]
    recs += [step(i, loss=1.0) for i in range(21, 30)] + [eval_rec(30, 2.2)]
    found = feed(only("overfitting"), recs)
    assert [f.step for f in found] == [30] and found[0].evidence["train_loss"] == 1.0


def test_restore_mid_stream_changes_nothing():
    pairs = [(3.0, 3.2), (2.6, 2.5), (2.7, 2.3), (2.9, 2.1), (2.95, 2.0), (3.1, 1.8)] * 30
    assert_restore_equivalent(lambda: only("overfitting"), _evals(pairs), cut=3)


def test_a_declared_nonstationary_loss_is_not_judged_for_overfitting():
    evals = [eval_rec(s, val, train) for s, val, train in
             [(100, 2.6, 2.5), (200, 2.9, 2.1), (300, 3.0, 2.0), (400, 3.1, 1.9)]]
    assert feed(only("overfitting"), [run()] + evals)  # the control
    assert feed(only("overfitting"), [run(loss_kind="gan")] + evals) == []
