"""effective_lr_shift: ||update|| / ||clipped grad|| against the lr, in units of its own
noise, for a sustained stretch; schedules and gradient explosions are not the optimizer."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, noise, only, run, step

from monitor_agent.records.types import Severity


def _adam_like(n: int, start: int = 1, *, lr=lambda i: 1e-3, update=None, grad=None) -> list:
    """Layer-statistics steps of an Adam-like run: update ~ 30 x lr, grad ~ 1, with noise."""
    recs = []
    for i in range(start, n):
        g = grad(i) if grad else 1.0 + noise(i, 0.2)
        u = update(i) if update else 30 * lr(i) * (1 + noise(i, 0.2, seed=3))
        recs.append(step(i, lr=lr(i), grad_norm=g, update_norm=u))
    return recs


def test_a_sustained_amplification_warns_with_its_size_in_sigmas():
    recs = [run()] + _adam_like(60) + _adam_like(66, 60, update=lambda i: 3.0)
    (f,) = feed(only("effective_lr_shift"), recs)
    assert f.severity == Severity.WARNING and f.step == 62
    assert f.evidence["consecutive_readings"] == 3 and f.evidence["z"] >= 8
    assert 60 < f.evidence["ratio_to_lr"] / f.evidence["usual_ratio_to_lr"] < 140  # ~100x
    assert "amplifies" in f.message and "3 layer-statistics steps in a row" in f.message


def test_a_sustained_damping_warns():
    recs = [run()] + _adam_like(60) + _adam_like(70, 60, update=lambda i: 1e-4)
    (f,) = feed(only("effective_lr_shift"), recs)
    assert "damps" in f.message and f.step == 62


def test_one_odd_reading_is_not_a_regime():
    recs = [run()] + _adam_like(60) + _adam_like(61, 60, update=lambda i: 3.0)
    recs += _adam_like(200, 61)
    assert feed(only("effective_lr_shift"), recs) == []


def test_a_schedule_moves_lr_and_update_together_and_is_not_a_shift():
    def lr(i):
        return 1e-3 if i < 100 else 1e-5  # a step decay, 100x

    assert feed(only("effective_lr_shift"), [run()] + _adam_like(300, lr=lr)) == []


def test_a_gradient_explosion_is_left_to_grad_explosion():
    # Adam's update stays put while the gradient grows 50x: eff / lr falls 50x.
    recs = [run()] + _adam_like(60) + _adam_like(80, 60, grad=lambda i: 50.0)
    assert feed(only("effective_lr_shift"), recs) == []


def test_warmup_readings_are_not_the_baseline():
    recs = [run(warmup_steps=50)] + _adam_like(50, update=lambda i: 1e-6) + _adam_like(200, 50)
    assert feed(only("effective_lr_shift"), recs) == []


def test_restore_mid_stream_changes_nothing():
    recs = [run()] + _adam_like(60) + _adam_like(70, 60, update=lambda i: 3.0)
    assert_restore_equivalent(lambda: only("effective_lr_shift"), recs, cut=61)
