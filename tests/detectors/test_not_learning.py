"""not_learning: exact zeros or exact repeats for min_history_steps steps page the run
(issue 45: a dead GAN generator and a one-column cross-entropy were "completed, healthy")."""

from __future__ import annotations

import pytest
from synth_records import assert_restore_equivalent, feed, layers, noise, only, run, step

from monitor_agent.detectors import FINDING_TYPES, DetectorSettings, DetectorSuite

MEASURED = layers(["fc.weight"], [0.25])  # the client measured this step's gradients


def _gan(dead_from: int = 190, until: int = 300) -> list:
    """A generator whose gradient is exactly 0 from ``dead_from``, while its loss still moves
    (the discriminator trains on)."""
    recs: list = [run(loss_kind="gan")]
    for i in range(1, until):
        dead = i >= dead_from
        recs.append(step(i, loss=0.7 + noise(i, 0.2), grad_norm=0.0 if dead else 0.3 + noise(i),
                         update_norm=None, param_norm=None))
    return recs


def test_an_all_zero_gradient_pages_after_min_history_steps():
    found = feed(only("not_learning"), _gan())
    assert [(f.step, f.severity.label) for f in found] == [(209, "error")]
    (f,) = found
    assert f.evidence["signal"] == "zero_grad" and f.evidence["since_step"] == 190
    assert f.evidence["onset_step"] == 190 and f.evidence["steps"] == 20
    assert "gradient norm is exactly 0 on every step since step 190" in f.message


def test_a_one_column_cross_entropy_pages_from_its_first_steps():
    recs = [step(i, loss=0.0, grad_norm=0.0, update_norm=0.0, layers=MEASURED)
            for i in range(1, 40)]
    (f,) = feed(only("not_learning"), recs)
    assert f.step == 20 and f.evidence["since_step"] == 1
    assert f.message.endswith("and the loss is exactly 0"), f.message
    assert set(f.evidence["signals"]) == {"zero_grad", "zero_update", "zero_loss", "constant"}


def test_a_script_that_reports_only_its_loss_shows_a_zero_loss():
    recs = [step(i, loss=0.0, grad_norm=None, update_norm=None) for i in range(1, 40)]
    (f,) = feed(only("not_learning"), recs)
    assert (f.step, f.evidence["signal"]) == (20, "zero_loss")
    # a loss that may be negative has no minimum at 0 (an RL objective)
    recs = [run(loss_kind="actor_critic"), *recs]
    assert feed(only("not_learning"), recs) == []


def test_the_stretch_takes_min_history_steps():
    recs = [step(i, grad_norm=0.0) for i in range(1, 40)]
    assert [f.step for f in feed(only("not_learning", min_history_steps=5), recs)] == [5]


def test_weights_that_never_move_page_from_the_measured_steps_alone():
    """Updates are measured every 10th step (layer statistics); the steps between them
    neither break the stretch nor extend it: optimizer.step() is never called. The stretch
    is as long as it was measured: zeros at steps 10, 20 and 30 are 21 steps."""
    recs = [step(i, update_norm=0.0 if i % 10 == 0 else None) for i in range(1, 60)]
    (f,) = feed(only("not_learning"), recs)
    assert (f.step, f.evidence["signal"], f.evidence["since_step"]) == (30, "zero_update", 10)
    assert f.evidence["steps"] == 21
    # one measured step that moved breaks it: zeros at 10 and 20 alone are 11 steps
    recs = [step(i, update_norm=(0.01 if i == 30 else 0.0) if i % 10 == 0 else None)
            for i in range(1, 60)]
    assert feed(only("not_learning"), recs) == []
    recs = [step(i, update_norm=(0.01 if i in (20, 40) else 0.0) if i % 10 == 0 else None)
            for i in range(1, 60)]
    assert feed(only("not_learning"), recs) == []


def test_a_warmup_from_lr_0_is_one_measured_zero_not_a_stretch():
    """A schedule that warms up from 0 (HF's get_linear_schedule_with_warmup, a LambdaLR of
    step/10): the first step's update is exactly 0, the next measured one, 25 steps later,
    moved. One measured zero is one step of evidence; the steps after it, unmeasured, are
    none (a healthy HF run with warmup was paged "stopped learning at step 1")."""
    recs = [step(i, lr=min(1.0, (i - 1) / 10) * 1e-3, grad_norm=0.5 + noise(i),
                 update_norm=(0.0 if i == 1 else 1e-3) if i % 25 == 1 else None)
            for i in range(1, 200)]
    assert feed(only("not_learning"), recs) == []


def test_a_loss_repeated_to_the_last_bit_with_its_gradient_pages():
    recs = [step(i, loss=100.0, grad_norm=0.25, layers=MEASURED) for i in range(1, 30)]
    (f,) = feed(only("not_learning"), recs)
    assert (f.step, f.evidence["signal"], f.evidence["since_step"]) == (20, "constant", 1)
    # values a script passes without the client's layer statistics may be stale (a loss
    # and a norm it updates every 100 steps, or never): they are no evidence of a repeat
    recs = [step(i, loss=100.0, grad_norm=0.25) for i in range(1, 60)]
    assert feed(only("not_learning"), recs) == []
    # a gradient that moves with the data is a run learning, whatever loss it reports, and
    # a loss alone that repeats may be how the script reports it (a stale value)
    for grad in ({}, {"grad_norm": None}):
        recs = [step(i, loss=100.0, **grad) for i in range(1, 60)]
        assert feed(only("not_learning"), recs) == []


def test_healthy_noise_and_single_zeros_never_page():
    recs = [step(i, grad_norm=0.0 if i % 7 == 0 else 1.0 + noise(i, 0.1),
                 update_norm=0.0 if i % 11 == 0 else 0.01) for i in range(1, 400)]
    assert feed(only("not_learning"), recs) == []


def test_overflow_and_guard_skipped_steps_neither_count_nor_break():
    # a scaler overflow every other step: no update by design, inf gradient
    recs = [step(i, skipped=True, loss_scale=1024.0, grad_norm=float("inf"), update_norm=0.0)
            for i in range(1, 40)]
    assert feed(only("not_learning"), recs) == []
    recs = [step(i, grad_norm=0.0) if i % 2 else
            step(i, skipped=True, loss_scale=1024.0, grad_norm=float("inf")) for i in range(1, 60)]
    (f,) = feed(only("not_learning"), recs)
    assert (f.step, f.evidence["since_step"]) == (21, 1)


def test_a_second_finding_waits_repeat_every_steps():
    recs = [step(i, grad_norm=0.0) for i in range(1, 260)]
    assert [f.step for f in feed(only("not_learning"), recs)] == [20, 120, 220]


def test_the_type_is_registered_and_pages():
    assert "not_learning" in FINDING_TYPES
    suite = DetectorSuite(DetectorSettings())
    found = [f for i in range(1, 30) for f in suite.update(step(i, loss=0.0, grad_norm=0.0))]
    assert [f.type for f in found if f.severity.pages] == ["not_learning"]


def test_restore_mid_stream_changes_nothing():
    assert_restore_equivalent(lambda: only("not_learning"), _gan(), cut=200)


def test_a_zero_gradient_page_says_the_signal_its_stretch_and_nothing_else():
    recs = _gan()
    (f,) = feed(only("not_learning"), recs)
    assert f.message == ("the run stopped learning: the gradient norm is exactly 0 on every "
                         "step since step 190 (20 steps)")
    assert (f.value, f.threshold) == (20.0, 20.0)
    assert f.suggestions and f.suggestions[0].startswith("An exactly zero gradient")
    assert f.evidence["loss"] == pytest.approx(recs[209].loss, rel=1e-5) and f.evidence["grad_norm"] == 0.0
    assert f.evidence["update_norm"] is None and f.evidence["lr"] is None


def test_a_stretch_from_step_0_counts_step_0():
    """Trainers that log from step 0: the stretch begins there, and a zero loss or a
    repeated loss from step 0 on is said with it."""
    recs = [step(i, loss=0.0, grad_norm=0.0, update_norm=None) for i in range(0, 40)]
    (f,) = feed(only("not_learning"), recs)
    assert (f.step, f.evidence["since_step"]) == (19, 0)
    assert f.message == ("the run stopped learning: the gradient norm is exactly 0 on every "
                         "step since step 0 (20 steps), and the loss is exactly 0")
    recs = [step(i, loss=100.0, grad_norm=0.0, update_norm=None, layers=MEASURED)
            for i in range(0, 40)]
    (f,) = feed(only("not_learning"), recs)
    assert (f.step, f.evidence["since_step"]) == (19, 0)
    assert f.message == ("the run stopped learning: the gradient norm is exactly 0 on every "
                         "step since step 0 (20 steps), and the loss is 100 to the last bit")


def test_a_zero_gradient_with_a_loss_repeated_to_the_last_bit_says_both():
    recs = [step(i, loss=100.0, grad_norm=0.0, update_norm=None, layers=MEASURED)
            for i in range(1, 30)]
    (f,) = feed(only("not_learning"), recs)
    assert f.evidence["signal"] == "zero_grad" and f.evidence["signals"] == ["constant",
                                                                             "zero_grad"]
    assert f.message == ("the run stopped learning: the gradient norm is exactly 0 on every "
                         "step since step 1 (20 steps), and the loss is 100 to the last bit")


def test_a_one_column_cross_entropy_is_paged_by_its_zero_gradient():
    """Every signal holds from step 1: the page names the gradient, in the signals' order."""
    recs = [step(i, loss=0.0, grad_norm=0.0, update_norm=0.0, layers=MEASURED)
            for i in range(1, 40)]
    (f,) = feed(only("not_learning"), recs)
    assert f.evidence["signal"] == "zero_grad"
    assert f.message == ("the run stopped learning: the gradient norm is exactly 0 on every "
                         "step since step 1 (20 steps), and the loss is exactly 0")


def test_the_longest_stretch_is_the_one_paged():
    """The gradient died at step 1, the updates from step 2: the gradient's stretch is the
    longer, on the first page and on the next."""
    recs = [step(i, grad_norm=0.0, update_norm=0.0 if i >= 2 else 0.01) for i in range(1, 130)]
    found = feed(only("not_learning"), recs)
    assert [(f.step, f.evidence["signal"]) for f in found] == [(20, "zero_grad"),
                                                               (120, "zero_grad")]
    assert found[1].evidence["signals"] == ["zero_grad", "zero_update"]


def test_a_zero_update_page_says_the_measured_steps_and_the_lr():
    recs = [step(i, lr=3e-4, update_norm=0.0 if i % 10 == 0 else None) for i in range(1, 60)]
    (f,) = feed(only("not_learning"), recs)
    assert f.message == ("the run stopped learning: the update norm is exactly 0 at every "
                         "measured step since step 10 (21 steps; lr 0.0003)")
    assert (f.evidence["lr"], f.evidence["update_norm"]) == (3e-4, 0.0)
    assert f.evidence["grad_norm"] == pytest.approx(recs[29].grad_norm, rel=1e-5)


def test_a_zero_loss_page_says_the_loss_is_at_its_minimum():
    recs = [step(i, loss=0.0, grad_norm=None, update_norm=None) for i in range(1, 40)]
    (f,) = feed(only("not_learning"), recs)
    assert f.message == ("the run stopped learning: the loss is exactly 0, the minimum of an "
                         "error, where its gradient is 0 on every step since step 1 (20 "
                         "steps)")


def test_a_constant_page_says_the_loss_and_gradient_repeat_and_nothing_else():
    recs = [step(i, loss=100.0, grad_norm=0.25, layers=MEASURED) for i in range(1, 30)]
    (f,) = feed(only("not_learning"), recs)
    assert f.message == ("the run stopped learning: the loss and gradient norm are the same to "
                         "the last bit on every step since step 1 (20 steps)")


def test_a_loss_that_went_below_zero_has_no_minimum_at_zero():
    """Nothing declared, and the loss was once negative: a signed objective, whose 0 is no
    minimum; its rank's history says so, whatever the other ranks'."""
    recs = [step(1, rank=1, loss=-0.5), step(2, rank=1, loss=0.3),
            *(step(i, rank=1, loss=0.0, update_norm=None) for i in range(3, 60))]
    assert feed(only("not_learning"), recs) == []


def test_a_missing_or_non_finite_loss_neither_counts_nor_breaks_a_stretch():
    """Steps 20 (no loss) and 21 (NaN) are passed over: the stretch from step 1 is seen
    again at step 22, 22 steps long."""
    recs = [step(i, loss=None if i % 5 == 0 else float("nan") if i % 7 == 0 else 0.0,
                 grad_norm=0.5 + noise(i), update_norm=None) for i in range(1, 40)]
    (f,) = feed(only("not_learning"), recs)
    assert (f.step, f.evidence["signal"], f.evidence["since_step"]) == (22, "zero_loss", 1)


def test_a_learning_run_with_layer_statistics_on_every_step_never_pages():
    recs = [step(i, layers=MEASURED) for i in range(1, 200)]
    assert feed(only("not_learning"), recs) == []
    # a gradient norm that repeats while the loss moves, or a loss that repeats while the
    # gradient moves, is not a dead run
    recs = [step(i, grad_norm=0.25, layers=MEASURED) for i in range(1, 60)]
    assert feed(only("not_learning"), recs) == []
    recs = [step(i, loss=1.5, layers=MEASURED) for i in range(1, 60)]
    assert feed(only("not_learning"), recs) == []
