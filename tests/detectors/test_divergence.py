"""divergence: a runaway (loss and grad norm rising together), a level that climbs and
holds, or updates far too large step after step; judged in units of the loss's own noise
and of the run's progress, so a bad batch that recovers or a noisy near-zero loss is not a
divergence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from class_traces import expected, recordings
from detector_harness import replay_trace
from synth_records import assert_restore_equivalent, feed, noise, only, run, step

from monitor_agent.detectors.divergence import DIVERGENCE
from monitor_agent.records.types import Severity


def _healthy(n: int) -> list:
    return [run()] + [step(i, loss=3.0 * 0.999**i * (1 + noise(i, 0.03)),
                           grad_norm=1.0 + noise(i, 0.2)) for i in range(1, n)]


def test_runaway_fires_before_the_nan():
    recs = _healthy(200)
    for k, (loss, g) in enumerate([(3.5, 4.0), (9.0, 30.0), (40.0, 900.0), (1e4, 1e8)]):
        recs.append(step(200 + k, loss=loss, grad_norm=g))
    recs.append(step(204, loss=float("nan"), grad_norm=float("nan")))
    found = feed(only("divergence"), recs)
    assert [f.step for f in found] == [202]
    assert found[0].severity == Severity.ERROR and found[0].evidence["rule"] == "runaway"


def test_a_transient_bad_batch_is_not_a_divergence():
    recs = _healthy(300)
    recs += [step(300, loss=5.5, grad_norm=2.8), step(301, loss=5.6, grad_norm=2.5),
             step(302, loss=5.4, grad_norm=2.6)]
    recs += [step(i, loss=2.2 * (1 + noise(i, 0.03))) for i in range(303, 400)]
    assert feed(only("divergence"), recs) == []


def test_creeping_rise_is_caught_by_the_level_rule():
    recs = _healthy(300)
    last = recs[-1].loss
    recs += [step(i, loss=last * 1.01 ** (i - 300) * (1 + noise(i, 0.03)),
                  grad_norm=1.0 * 1.02 ** (i - 300)) for i in range(300, 400)]
    found = feed(only("divergence"), recs)
    assert found and 300 < found[0].step < 360
    level_only = feed(only("divergence", divergence_steps=1000), recs)
    assert level_only and level_only[0].evidence["rule"] == "level"
    f = level_only[0]
    # a creep with no raised lr behind it must hold divergence_persist steps from its onset
    assert 300 < f.step < 370 and f.step - f.evidence["onset_step"] >= 30
    assert 300 <= f.evidence["onset_step"] < f.step
    assert f"{f.evidence['consecutive_steps']} steps in a row" in f.message
    assert "+" in f.message and f.evidence["median"] > f.evidence["earlier_median"]


def _near_zero(n: int, level: float, rng: np.random.Generator, start: int = 1) -> list:
    """A converged classifier: a heavy-tailed per-batch loss around ``level``."""
    return [step(i, loss=level * math.exp(rng.normal(0, 1.0)),
                 grad_norm=0.05 * math.exp(rng.normal(0, 0.8))) for i in range(start, n)]


def test_a_noisy_near_zero_loss_doubling_is_not_a_divergence():
    # The CNN case: 2.3 at the start, ~0.036 later, then its noisy level drifts to 0.075.
    rng = np.random.default_rng(1)
    recs = [run()] + [step(i, loss=2.3 * 0.97**i + 0.036) for i in range(1, 200)]
    recs += _near_zero(500, 0.036, rng, start=200) + _near_zero(900, 0.075, rng, start=500)
    assert feed(only("divergence"), recs) == []


def test_losing_the_progress_made_is_a_divergence_even_at_low_loss():
    rng = np.random.default_rng(2)
    recs = [run()] + [step(i, loss=2.3 * 0.97**i + 0.036) for i in range(1, 200)]
    recs += _near_zero(400, 0.036, rng, start=200)
    recs += [step(i, loss=2.0 * math.exp(rng.normal(0, 0.1)), grad_norm=0.5)
             for i in range(400, 450)]
    found = feed(only("divergence"), recs)
    # no raised lr behind it: judged once it has held divergence_persist (30) steps
    assert found and 400 < found[0].step <= 440 and found[0].evidence["rule"] == "level"
    assert found[0].evidence["onset_step"] == 400
    assert found[0].evidence["progress_lost"] > 0.25


def test_one_huge_batch_that_recovers_is_not_a_divergence():
    rng = np.random.default_rng(3)
    recs = [run()] + [step(i, loss=2.3 * 0.97**i + 0.01) for i in range(1, 200)]
    recs += _near_zero(600, 0.01, rng, start=200)
    recs[400] = step(400, loss=1.9, grad_norm=20.0)  # 190x on one batch
    assert feed(only("divergence"), recs) == []


def test_update_jumps_must_persist():
    def stream(big_steps: int) -> list:
        recs = _healthy(300)
        recs += [step(300 + k, update_norm=3.0) for k in range(big_steps)]  # ratio 0.3
        return recs + [step(i) for i in range(300 + big_steps, 400)]

    assert feed(only("divergence"), stream(3)) == []  # an SGD catapult: a few, then back
    found = feed(only("divergence"), stream(30))
    assert [f.step for f in found] == [304] and found[0].evidence["rule"] == "update_jump"
    assert found[0].evidence["consecutive_steps"] == 5


def test_quiet_on_a_noisy_small_batch_loss():
    recs = [run()] + [step(i, loss=0.1 * (1 + noise(i, 0.9, seed=3)) + 0.05 * (i % 7 == 0),
                           grad_norm=1.5 + noise(i, 0.5)) for i in range(1, 1000)]
    assert feed(only("divergence"), recs) == []


def test_quiet_on_a_healthy_run():
    assert feed(only("divergence"), _healthy(1000)) == []


def test_restore_mid_stream_changes_nothing():
    recs = _healthy(300)
    last = recs[-1].loss
    recs += [step(i, loss=last * 1.01 ** (i - 300), grad_norm=1.02 ** (i - 300))
             for i in range(300, 400)]
    assert_restore_equivalent(lambda: only("divergence"), recs, cut=280)


def test_an_update_jump_the_lr_itself_made_is_judged_at_once():
    recs = [run()] + [step(i, loss=3.0 * 0.999**i, lr=0.01) for i in range(1, 300)]
    recs += [step(300 + k, update_norm=3.0, lr=0.3) for k in range(3)]  # LR x30
    found = feed(only("divergence"), recs)
    assert [f.step for f in found] == [300] and "30x its median" in found[0].message
    assert found[0].evidence["lr_median"] == 0.01


def test_a_slow_creep_is_measured_from_the_best_level_not_the_window_it_drags():
    # 0.15% per step: the last 10 steps are never 30% above the 100 just before them, but
    # the loss climbs away from the best 100-step level (~1.0) the run reached; it fires
    # once a quarter of the progress 4.0 -> 1.0 is given back (loss ~1.75).
    recs = [run()] + [step(i, loss=3.0 * 0.99**i + 1.0) for i in range(1, 400)]
    best = recs[-1].loss
    recs += [step(i, loss=best * 1.0015 ** (i - 400) * (1 + noise(i, 0.01)))
             for i in range(400, 800)]
    found = feed(only("divergence"), recs)
    assert found and found[0].evidence["rule"] == "level" and found[0].evidence["earlier_is_best"]
    assert 700 < found[0].step < 800 and "best 100-step median" in found[0].message
    assert found[0].evidence["progress_lost"] >= 0.25


def test_a_runaway_cut_short_by_the_nan_fires_on_the_nan_step():
    recs = _healthy(200)
    recs += [step(200, loss=9.0, grad_norm=30.0), step(201, loss=1e4, grad_norm=1e8),
             step(202, loss=float("nan"), grad_norm=float("nan"))]
    found = feed(only("divergence"), recs)
    assert [f.step for f in found] == [202] and found[0].evidence["consecutive_steps"] == 3
    assert "then went nan" in found[0].message


def test_a_nan_out_of_the_blue_is_nan_infs_alone():
    recs = _healthy(200) + [step(200, loss=float("nan"), grad_norm=float("nan"))]
    assert feed(only("divergence"), recs) == []


# -- the class recordings: a burst that returns is a spike, a shift that persists is not ----


@pytest.mark.parametrize("label,path", [r for r in recordings("burst")
                                        if r[0]["returned_step"] is not None],
                         ids=lambda v: v["file"][:-9] if isinstance(v, dict) else "")
def test_a_burst_of_bad_batches_that_returns_is_never_a_divergence(label, path):
    # 1..20 bad batches in a row on an MLP, a CNN and a GPT; main paged every burst of 5+
    found = [f for f in replay_trace(path) if f.type == "divergence"]
    assert found == [], [(f.step, f.message) for f in found]


@pytest.mark.parametrize("label,path", [r for r in recordings("kept") + recordings("jump")
                                        if expected(r[0], "divergence")],
                         ids=lambda v: v["file"][:-9] if isinstance(v, dict) else "")
def test_an_lr_raised_and_kept_is_a_divergence_in_its_window_with_its_onset(label, path):
    window = expected(label, "divergence")
    found = [f for f in replay_trace(path) if f.type == "divergence"]
    assert found and window["first_step"] <= found[0].step <= window["last_step"]
    onset = found[0].evidence["onset_step"]
    assert label["fault_step"] <= onset <= found[0].step


def test_a_level_shift_with_no_lr_behind_it_waits_for_persistence_and_then_pages():
    # the same jump held 50 steps pages, dated to its onset; held 20 and back, it does not
    recs = _healthy(300)
    level = recs[-1].loss
    held = recs + [step(i, loss=3 * level * (1 + noise(i, 0.03))) for i in range(300, 350)]
    found = feed(only("divergence", divergence_steps=1000), held)
    assert found and found[0].evidence["onset_step"] == 300
    assert 330 <= found[0].step < 350 and "burst would have returned" in found[0].message
    burst = recs + [step(i, loss=(3 if i < 320 else 1) * level * (1 + noise(i, 0.03)))
                    for i in range(300, 400)]
    assert feed(only("divergence", divergence_steps=1000), burst) == []


# -- losses that are not positive and falling (issue 32) --------------------------------------


def _actor_critic(n: int = 2400, seed: int = 0, **config) -> list:
    """An actor-critic-like loss around zero, of either sign: its payoffs are redrawn every
    400 steps, after which the loss jumps and the policy relearns it."""
    rng = np.random.default_rng(seed)
    recs, wander = [run(**config)], 0.0
    for i in range(1, n):
        since = i % 400
        level = 0.03 + 0.15 * math.exp(-since / 60) * (i >= 400)
        wander = 0.9 * wander + 0.03 * rng.standard_normal()  # episodes overlap: smooth noise
        loss = level + wander + 0.03 * rng.standard_normal()
        recs.append(step(i, loss=loss, grad_norm=1.0 + 0.2 * rng.random()))
    return recs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_signed_loss_that_relearns_after_each_change_never_pages(seed):
    found = feed(only("divergence"), _actor_critic(seed=seed))
    assert not [f for f in found if f.severity.pages]
    info = [f for f in found if f.severity == Severity.INFO]
    assert len(info) <= 1  # said once, if at all
    if info:
        assert info[0].evidence["rule"] == "no_level"


def test_a_declared_nonstationary_loss_is_said_once_and_never_judged_by_level():
    found = feed(only("divergence"), _actor_critic(loss_kind="rl"))
    assert [f.severity for f in found] == [Severity.INFO]
    assert "nonstationary" in found[0].message


def _nll(**config) -> list:
    """A Gaussian NLL falling from 2 to -3 (a real level, of either sign), then climbing
    back to 0 at step 500 and staying."""
    recs = [run(**config)] + [step(i, loss=-3 + 5 * math.exp(-i / 60) + noise(i, 0.05))
                              for i in range(1, 500)]
    return recs + [step(i, loss=0.0 + noise(i, 0.05)) for i in range(500, 600)]


def test_a_declared_signed_loss_that_learnt_and_climbs_back_is_a_divergence_in_its_units():
    found = [f for f in feed(only("divergence"), _nll(loss_kind="signed")) if f.severity.pages]
    assert found and found[0].evidence["units"] == "linear"
    assert 500 <= found[0].step <= 540
    assert "standard errors of its own noise" in found[0].message


def test_a_loss_that_goes_negative_unsaid_is_said_to_have_no_level_once():
    """Nothing declared: a loss of either sign may be an RL objective whose level moves by
    design, so its level pages on nothing (an info says so once)."""
    found = feed(only("divergence"), _nll())
    assert [(f.severity, f.evidence["why"]) for f in found] == [(Severity.INFO, "signed")]
    assert "went below zero" in found[0].message


def test_the_no_level_note_is_log_only_so_no_rule_acts_on_it():
    """The note that no level is judged is no alarm: a rule on divergence that rolls back or
    pages critical must not act on it (the multi-node e2e: a rank's shuffled labels left
    its loss no progress, and the note stopped the job through RollbackOnDivergence)."""
    (note,) = feed(only("divergence"), _nll())
    assert note.severity == Severity.INFO and note.log_only


def test_a_loss_with_no_level_still_diverges_while_a_raised_lr_drives_it():
    """An actor-critic loss (either sign, no level) under an lr kept 30x from step 1200:
    its rise is the optimizer's, the cause still applied."""
    recs = _actor_critic(1200)
    recs += [step(i, loss=0.6 + 0.05 * math.sin(i), grad_norm=1.1, lr=3e-2)
             for i in range(1200, 1300)]
    recs = [r if r.kind != "step" or r.step >= 1200 else step(r.step, loss=r.loss,
                                                               grad_norm=r.grad_norm, lr=1e-3)
            for r in recs]
    found = [f for f in feed(only("divergence"), recs) if f.severity.pages]
    assert found and 1200 <= found[0].step <= 1215
    assert "the cause is still applied" in found[0].message


@pytest.mark.parametrize("log_noise,pages", [(1.0, False), (0.03, True)])
def test_a_runaway_must_stand_out_of_the_log_losss_own_noise(log_noise, pages):
    """Loss and grad norm rising 3 steps in a row to 2-4x the EMA: a runaway on a loss
    whose steps scatter by 3%, the ordinary swing of a TD loss whose steps scatter by e^1."""
    rng = np.random.default_rng(0)
    recs = [run()] + [step(i, loss=0.001 * math.exp(log_noise * rng.standard_normal()),
                           grad_norm=1.0 + 0.1 * rng.random()) for i in range(1, 300)]
    ema = 0.001 * math.exp(log_noise**2 / 2)
    recs += [step(300 + k, loss=ema * r, grad_norm=g)
             for k, (r, g) in enumerate([(1.3, 3.0), (2.0, 5.0), (4.0, 8.0)])]
    found = [f for f in feed(only("divergence"), recs) if f.evidence.get("rule") == "runaway"]
    assert bool(found) == pages


def _swinging(swings: tuple[int, ...], shift: float, seed: int = 0) -> list:
    """A TD-like loss falling from 0.02 to 0.01 that swings up ~30x at each step in
    ``swings`` and settles back within 50 steps; from step 700 its level moves to ``shift``
    x and stays."""
    rng = np.random.default_rng(seed)
    recs = [run()]
    for i in range(1, 900):
        level = 0.01 * (1 + math.exp(-i / 40))
        for s0 in swings:
            if i >= s0:
                level *= 1 + 30 * math.exp(-(i - s0) / 12)
        level *= shift if i >= 700 else 1.0
        recs.append(step(i, loss=level * math.exp(0.05 * rng.standard_normal()),
                         grad_norm=1.0 + 0.1 * rng.random()))
    return recs


def _paged(recs: list) -> list:
    return [f for f in feed(only("divergence"), recs) if f.severity.pages]


def test_a_level_no_higher_than_the_runs_own_recovered_swings_does_not_page():
    # the swings held past a burst's 30 steps (3.5x there) and came back on their own: a
    # level shift to 3x is within them; to 10x it is beyond, and without swings 3x pages
    assert _paged(_swinging((300, 500), 1.0)) == []
    assert _paged(_swinging((300, 500), 3.0)) == []
    beyond = _paged(_swinging((300, 500), 10.0))
    assert beyond and beyond[0].evidence["rule"] == "level" and beyond[0].step > 700
    assert beyond[0].evidence["recovered_rise"] is not None
    assert _paged(_swinging((), 3.0))


@pytest.mark.parametrize("rise,pages", [((5, 8, 12), False), ((25, 400, 6000), True)])
def test_a_positive_loss_declared_nonstationary_runs_away_in_its_log_noise(rise, pages):
    """A TD loss declared nonstationary stays a positive error: its runaway is judged as a
    ratio in its log noise, not in the linear spread of values packed near zero."""
    rng = np.random.default_rng(0)
    recs = [run(loss_kind="td")]
    recs += [step(i, loss=0.001 * math.exp(rng.standard_normal()),
                  grad_norm=1.0 + 0.1 * rng.random()) for i in range(1, 300)]
    recs += [step(300 + k, loss=0.0016 * r, grad_norm=3.0 * (k + 1))
             for k, r in enumerate(rise)]
    found = [f for f in feed(only("divergence"), recs) if f.evidence.get("rule") == "runaway"]
    assert bool(found) == pages


def _rising_before_the_lr(kind: str) -> list:
    """The loss learns, then rises from step 135 as the run's own level moves (a GAN's
    discriminator winning, an actor-critic's episodes growing); the lr is multiplied by 100
    at step 150 and kept. A signed loss is the same shape below zero."""
    offset = -3.0 if kind == "signed" else 0.0
    recs = [run(loss_kind=kind)]
    for i in range(1, 260):
        level = 1.0 + 2.0 * math.exp(-i / 30) + (0.6 if i >= 135 else 0.0)
        recs.append(step(i, loss=offset + level * (1 + noise(i, 0.02)),
                         grad_norm=1.0 + noise(i, 0.1), lr=1e-3 if i < 150 else 0.1))
    return recs


@pytest.mark.parametrize("kind", ["auto", "error", "signed", "nonstationary", "actor_critic",
                                  "gan"])
def test_a_divergence_the_raised_lr_drives_starts_at_or_after_the_lr_rose(kind):
    """Issue 45: under loss_kind="actor_critic" the LR x100 page's onset was 125, before
    the LR change at 150: the rise before it is the run's own, not the lr's."""
    found = [f for f in feed(only("divergence"), _rising_before_the_lr(kind))
             if f.severity.pages]
    assert found, kind
    caused = [f for f in found if "the cause is still applied" in f.message]
    assert caused, [f.message for f in found]
    assert all(f.evidence["onset_step"] >= 150 for f in caused), [
        (f.step, f.evidence["onset_step"]) for f in caused]
    assert all(f.step >= 150 + 4 for f in caused)  # the lr rule's hold, counted from there


def test_an_excursion_that_began_after_the_lr_rose_keeps_its_onset():
    recs = [run()] + [step(i, loss=(1.0 + 2.0 * math.exp(-i / 30) + (1.0 if i >= 152 else 0))
                           * (1 + noise(i, 0.02)), lr=1e-3 if i < 150 else 0.1)
                      for i in range(1, 220)]
    (first, *_) = [f for f in feed(only("divergence"), recs) if f.severity.pages]
    assert first.evidence["onset_step"] == 152 and first.step == 160, first.message


def test_a_loss_that_explodes_by_decades_in_its_first_steps_pages_at_once():
    """Issue 45: an LBFGS run of 15 steps whose loss rose ~30 decades got no page; the
    other rules wait for min_history_steps of history."""
    lbfgs = [0.572, 0.0289, 1.86e-3, 4.5e-4, 1.1e-4, 7.2e-5, 5.2e-5, 3.7e-5, 5.2e46,
             6.3e83, 1.5e119, 1.6e153, 7.3e187, 1.3e226, 1.1e260]
    found = feed(only("divergence"), [run()] + [step(i, loss=x) for i, x in enumerate(lbfgs, 1)])
    assert [(f.step, f.evidence["rule"], f.evidence["onset_step"]) for f in found] == [
        (9, "early", 9)]
    assert found[0].severity.pages
    assert found[0].message == ("loss 5.2e+46 is 47 decades above the highest the run had "
                                "reported (0.572 at step 1), more than float32's 7 digits "
                                "tell apart: the loss exploded"), found[0].message


@pytest.mark.parametrize("losses,kind", [
    ([0.572, 0.0289, 1.86e-3, 4.5e-4, 1.1e-4, 7.2e-5, 5.2e-5, 3.7e-5], "auto"),  # it learns
    ([2.3, 2.31, 2.29, 2.2, 2.1, 2e6, 2.0], "auto"),  # six decades: within precision
    ([-1.0, -2.0, -3.0, 4e7, 5e8], "signed"),  # no zero to measure decades from
    ([1e-9, 1e-8, 1e-6, 1e-2, 50.0], "signed"),
])
def test_rises_a_float_can_still_tell_apart_are_no_early_divergence(losses, kind):
    recs = [run(loss_kind=kind)] + [step(i, loss=x) for i, x in enumerate(losses, 1)]
    assert [f for f in feed(only("divergence"), recs) if f.severity.pages] == []


def test_the_early_rule_needs_no_history_and_survives_a_restart():
    recs = [run()] + [step(i, loss=2.0 + noise(i)) for i in range(1, 12)] + [
        step(i, loss=1e9 * (i - 10)) for i in range(12, 16)]
    assert_restore_equivalent(lambda: only("divergence"), recs, cut=8)


# -- what each rule's page says (issue 51: the numbers a person acts on) ---------------------


def _page(found: list) -> tuple:
    """A finding as a person reads it: step, message, the evidence of its own rule (the
    layer bands' two keys aside), value, threshold, severity and suggestions."""
    (f,) = found
    evidence = {k: v for k, v in f.evidence.items()
                if k not in ("first_layer_out", "layers_out_of_band")}
    return f.step, f.message, evidence, f.value, f.threshold, f.severity, f.suggestions


def test_a_runaway_page_gives_the_streak_the_loss_and_the_gradient_against_its_median():
    recs = _healthy(200) + [step(200 + k, loss=loss, grad_norm=g, lr=0.01) for k, (loss, g)
                            in enumerate([(3.5, 4.0), (9.0, 30.0), (40.0, 900.0)])]
    assert _page(feed(only("divergence"), recs)) == (
        202, "loss rose 3 steps in a row to 40 (from 2.5) while grad norm grew to 900 (884x "
        "its median 1.02)",
        {"rule": "runaway", "onset_step": 200, "consecutive_steps": 3, "loss": 40.0,
         "loss_before": 2.49758, "ema": 2.7202, "grad_norm": 900.0, "grad_median": 1.01769,
         "lr": 0.01},
        40.0, 2.7202, Severity.ERROR, DIVERGENCE)


def test_a_runaway_cut_short_by_the_nan_pages_the_last_finite_loss():
    recs = _healthy(200) + [step(200, loss=9.0, grad_norm=30.0, lr=0.1),
                            step(201, loss=1e4, grad_norm=1e8, lr=0.1),
                            step(202, loss=math.nan, grad_norm=math.nan, lr=0.1)]
    step_, message, evidence, value, threshold, severity, tips = _page(
        feed(only("divergence"), recs))
    assert (step_, message, value, threshold, severity, tips) == (
        202, "loss rose 2 step(s) in a row to 1e+04 (from 2.5) while the grad norm grew, then "
        "went nan at step 202", 10000.0, 2.49758, Severity.ERROR, DIVERGENCE)
    assert math.isnan(evidence.pop("loss")) and math.isnan(evidence.pop("grad_norm"))
    assert evidence == {"rule": "runaway", "onset_step": 200, "consecutive_steps": 3,
                        "loss_before": 2.49758, "last_finite_loss": 10000.0, "lr": 0.1}


def test_a_nan_after_one_rising_step_completes_the_runaway_and_after_none_does_not():
    base = _healthy(200)
    one = base + [step(200, loss=9.0, grad_norm=30.0),
                  step(201, loss=math.nan, grad_norm=math.nan)]
    (f,) = feed(only("divergence"), one)
    assert (f.step, f.evidence["consecutive_steps"], f.evidence["onset_step"]) == (201, 2, 200)
    assert f.message.startswith("loss rose 1 step(s) in a row to 9 (from")
    # a streak as long as divergence_steps has paged already: the NaN adds nothing
    long = base + [step(200 + k, loss=loss, grad_norm=g) for k, (loss, g) in
                   enumerate([(3.5, 4.0), (9.0, 30.0), (40.0, 900.0), (math.nan, math.nan)])]
    assert [f.step for f in feed(only("divergence"), long)] == [202]
    # and a streak paged once does not page again at the NaN a few steps on
    assert [f.step for f in feed(only("divergence"), long + [
        step(204, loss=math.nan, grad_norm=math.nan)])] == [202]


def test_an_early_explosion_page_names_the_highest_loss_it_left_behind():
    lbfgs = [0.572, 0.0289, 1.86e-3, 4.5e-4, 1.1e-4, 7.2e-5, 5.2e-5, 3.7e-5, 5.2e46]
    recs = [run()] + [step(i, loss=x, lr=1.0) for i, x in enumerate(lbfgs, 1)]
    step_, message, evidence, value, threshold, severity, tips = _page(
        feed(only("divergence"), recs))
    assert (step_, value, threshold, severity, tips) == (9, 5.2e46, 9596570.0, Severity.ERROR,
                                                          DIVERGENCE)
    assert "rising since" not in message
    assert evidence == {"rule": "early", "onset_step": 9, "loss": 5.2e46, "highest_loss": 0.572,
                        "highest_step": 1, "decades": 46.9586,
                        "grad_norm": round(recs[-1].grad_norm, 6),
                        "lr": 1.0}


def test_an_early_explosion_that_rose_over_several_steps_says_since_when():
    losses = [0.572, 0.0289, 1.86e-3, 4.5e-4, 1.1e-4, 7.2e-5, 5.2e-5, 3.7e-5, 1e3, 1e5, 5.2e46]
    recs = [run()] + [step(i, loss=x) for i, x in enumerate(losses, 1)]
    (f,) = feed(only("divergence"), recs)
    assert (f.step, f.evidence["onset_step"], f.evidence["highest_step"]) == (11, 9, 10)
    assert f.message == ("loss 5.2e+46 is 42 decades above the highest the run had reported "
                         "(1e+05 at step 10), more than float32's 7 digits tell apart: the loss "
                         "exploded, rising since step 9")


def test_an_update_jump_page_gives_the_ratio_against_its_median_and_the_lr():
    recs = _healthy(300) + [step(300 + k, update_norm=3.0, lr=0.01) for k in range(30)]
    step_, message, evidence, value, threshold, severity, tips = _page(
        feed(only("divergence"), recs))
    assert (step_, message, value, threshold, severity, tips) == (
        304, "update/param ratio 0.3 is 300x its median 0.001 and above 0.1, for 5 steps in a "
        "row (lr 0.01): steps this large precede divergence", 0.3, 0.1, Severity.ERROR,
        DIVERGENCE)
    assert {k: evidence[k] for k in ("rule", "onset_step", "update_ratio", "median_ratio",
                                     "consecutive_steps", "lr", "lr_median")} == {
        "rule": "update_jump", "onset_step": 300, "update_ratio": 0.3, "median_ratio": 0.001,
        "consecutive_steps": 5, "lr": 0.01, "lr_median": None}
    paged = recs[304]  # step 304
    assert (evidence["loss"], evidence["grad_norm"]) == (round(paged.loss, 5),
                                                         round(paged.grad_norm, 5))


def test_an_update_jump_the_lr_made_says_by_how_much():
    recs = [run()] + [step(i, loss=3.0 * 0.999**i, lr=0.01) for i in range(1, 300)]
    recs += [step(300, update_norm=3.0, lr=0.3)]
    (f,) = feed(only("divergence"), recs)
    assert f.message == ("update/param ratio 0.3 is 300x its median 0.001 and above 0.1, the "
                         "lr 0.3 is 30x its median 0.01: steps this large precede divergence")
    assert (f.evidence["consecutive_steps"], f.evidence["lr_median"]) == (1, 0.01)


def test_a_runaway_already_paged_is_not_paged_again_at_its_nan_however_short_the_repeat():
    recs = _healthy(200) + [step(200 + k, loss=loss, grad_norm=g) for k, (loss, g) in
                            enumerate([(3.5, 4.0), (9.0, 30.0), (40.0, 900.0),
                                       (math.nan, math.nan)])]
    assert [f.step for f in feed(only("divergence", repeat_every_steps=1), recs)] == [202]


def test_a_nan_ends_the_streak_so_two_rising_steps_after_it_are_no_runaway():
    recs = _healthy(200) + [step(200, loss=math.nan, grad_norm=math.nan),
                            step(201, loss=9.0, grad_norm=30.0),
                            step(202, loss=40.0, grad_norm=900.0)]
    assert [f for f in feed(only("divergence"), recs) if f.evidence["rule"] == "runaway"] == []
