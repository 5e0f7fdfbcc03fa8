"""grad_explosion: the grad norm far above its rolling median in units of its own noise,
and staying there for explosion_steps steps while its cause (a raised lr) is still applied
or for longer than the longest burst of bad batches (one huge batch, or a burst the run
recovers from, is a loss_spike, not this); out of its band again and again across a long
window, whatever the spacing (a recurring problem); warmup-aware; per layer against the
layer's own frozen baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest
from class_traces import CLASSES
from detector_harness import replay_trace
from synth_records import assert_restore_equivalent, feed, layers, names, noise, only, run, step

from monitor_agent.records.types import Severity

LR = 1e-3


def _steady(n: int, start: int = 1) -> list:
    return [step(i, grad_norm=1.0 + noise(i, 0.3), lr=LR) for i in range(start, n)]


def _hot(i: int, g: float, **fields) -> object:
    """A step under an lr raised 10x (the cause of what it shows, still applied)."""
    return step(i, grad_norm=g, lr=10 * LR, **fields)


def test_a_gradient_that_stays_blown_up_fires_with_the_streak_in_message_and_evidence():
    recs = [run()] + _steady(100) + [_hot(100 + k, g)
                                     for k, g in enumerate([8.0, 15.0, 40.0, 90.0])]
    found = feed(only("grad_explosion"), recs)
    assert [(f.step, f.severity) for f in found] == [(102, Severity.ERROR)]
    f = found[0]
    assert f.evidence["consecutive_steps"] == 3 and "3 steps in a row" in f.message
    assert "10x its median" in f.message and "still applied" in f.message
    assert 35 < f.evidence["ratio"] < 45 and f.evidence["z"] >= 6
    assert 7 < f.evidence["min_ratio_in_streak"] < 8.5  # the 8.0 step, against ~1.0


def test_one_huge_batch_is_not_an_explosion():
    recs = [run()] + _steady(100) + [step(100, grad_norm=200.0)] + _steady(300, start=101)
    assert feed(only("grad_explosion"), recs) == []


def test_a_moderate_jump_that_persists_is_an_explosion_when_the_gradient_is_smooth():
    # LR x40 with clipping on: the grad norm sits ~4x its median for several steps.
    recs = [run()] + [step(i, grad_norm=0.5 * (1 + noise(i, 0.1)), lr=LR) for i in range(1, 300)]
    recs += [_hot(300 + k, 2.0 + noise(k, 0.3)) for k in range(8)]
    found = feed(only("grad_explosion"), recs)
    assert [f.step for f in found] == [302]


def test_quiet_on_a_heavy_tailed_gradient():
    # A CNN at near-zero loss: batch to batch its grad norm swings over an order of
    # magnitude; 10x for three steps is inside its own noise.
    rng = np.random.default_rng(0)
    recs = [run()] + [step(i, grad_norm=0.05 * math.exp(rng.normal(0, 1.2)))
                      for i in range(1, 2000)]
    assert feed(only("grad_explosion"), recs) == []


def test_warmup_peaks_need_a_bigger_jump():
    recs = [run(warmup_steps=200)] + _steady(100) + [step(100 + k, grad_norm=5.0)
                                                     for k in range(5)]
    assert feed(only("grad_explosion"), recs) == []
    recs += [_hot(105 + k, 100.0) for k in range(3)]
    assert [f.step for f in feed(only("grad_explosion"), recs)] == [107]


def test_loss_scaler_overflow_is_skipped():
    recs = _steady(60) + [step(60, grad_norm=float("inf"), skipped=True, loss_scale=1024.0)]
    recs += [step(61 + k, grad_norm=1e6, skipped=True, loss_scale=512.0) for k in range(4)]
    assert feed(only("grad_explosion"), recs) == []


def test_one_layer_exploding_alone_is_named():
    n = names(5)
    recs = [run(layer_order=n)]
    recs += [step(i, layers=layers(n, [1.0 + noise(i + k, 0.2) for k in range(5)]))
             for i in range(1, 60)]
    recs += [step(60 + k, layers=layers(n, [1.0, 1.0, 500.0, 1.0, 1.0])) for k in range(3)]
    found = feed(only("grad_explosion"), recs)
    assert [(f.step, f.layer) for f in found] == [(62, "layers.2.weight")]
    assert found[0].evidence["consecutive_steps"] == 3


def test_one_layer_blip_is_not_named():
    n = names(5)
    recs = [run(layer_order=n)]
    recs += [step(i, layers=layers(n, [1.0 + noise(i + k, 0.2) for k in range(5)]))
             for i in range(1, 60)]
    recs += [step(60, layers=layers(n, [1.0, 1.0, 500.0, 1.0, 1.0]))]
    recs += [step(i, layers=layers(n, [1.0] * 5)) for i in range(61, 80)]
    assert feed(only("grad_explosion"), recs) == []


def test_quiet_on_ordinary_fluctuation():
    recs = [run()] + [step(i, grad_norm=1.0 * (3.0 if i % 50 == 0 else 1.0) + noise(i, 0.3))
                      for i in range(1, 1000)]
    assert feed(only("grad_explosion"), recs) == []


def test_restore_mid_stream_changes_nothing():
    n = names(3)
    recs = [run(layer_order=n)] + [step(i, grad_norm=1 + noise(i, 0.3),
                                        layers=layers(n, [1 + noise(i, 0.2)] * 3))
                                   for i in range(1, 80)]
    recs += [step(80 + k, grad_norm=50.0, layers=layers(n, [1.0, 300.0, 1.0]))
             for k in range(4)]
    assert_restore_equivalent(lambda: only("grad_explosion"), recs, cut=81)


def test_with_clipping_on_it_does_not_advise_enabling_it():
    from monitor_agent.detectors import grad_explosion as tips

    recs = [run()] + [step(i, grad_norm=0.5 * (1 + noise(i, 0.1)), clip_threshold=1.0, lr=LR)
                      for i in range(1, 300)]
    recs += [_hot(300 + k, 2.5, clip_threshold=1.0) for k in range(4)]
    found = feed(only("grad_explosion"), recs)
    assert found and found[0].suggestions == tips.GRAD_EXPLOSION_CLIPPED
    assert found[0].evidence["clip_threshold"] == 1.0


def test_a_streak_cut_short_by_overflow_fires_on_the_overflow_step():
    recs = [run()] + _steady(100) + [step(100, grad_norm=50.0), step(101, grad_norm=5e4),
                                     step(102, grad_norm=float("inf"))]
    found = feed(only("grad_explosion"), recs)
    assert [f.step for f in found] == [102] and found[0].evidence["consecutive_steps"] == 3


def test_a_nan_gradient_out_of_the_blue_is_not_an_explosion():
    recs = [run()] + _steady(100) + [step(100, grad_norm=float("nan"))]
    assert feed(only("grad_explosion"), recs) == []


def test_isolated_spikes_within_the_window_are_an_explosion_dated_to_the_first():
    # AdamW after an LR jump at step 300: spikes of 9-15x (over 6 sigma) with the norm
    # collapsing back, never two in a row. Three spread wider than explosion_window (50)
    # steps are separate bad batches; the third within the window fires.
    spikes = {100: 5.0, 160: 5.0, 220: 5.0, 310: 9.0, 318: 15.0, 327: 10.0, 340: 12.0}
    recs = [run()] + _steady(100) + [step(i, grad_norm=spikes.get(i, 0.8 + noise(i, 0.2)),
                                          lr=LR if i < 300 else 10 * LR)
                                     for i in range(100, 360)]
    found = feed(only("grad_explosion"), recs)
    assert [f.step for f in found] == [327]
    f = found[0]
    assert f.evidence["onset_step"] == 310 and f.evidence["spikes_in_window"] == 3
    assert f.evidence["consecutive_steps"] == 1 and "since step 310" in f.message


def test_a_streak_is_dated_to_its_first_step():
    recs = [run()] + _steady(100) + [_hot(100 + k, g) for k, g in enumerate([8.0, 15.0, 40.0])]
    assert [f.evidence["onset_step"] for f in feed(only("grad_explosion"), recs)] == [100]


@pytest.mark.parametrize("name", ["kept_mlp_s2", "kept_mlp_s3"])
def test_recorded_isolated_gradient_spikes_after_an_lr_raised_and_kept_are_an_explosion(name):
    # real runs (tests/traces/classes, held-out seeds): SGD on an MLP, LR x20 from step 200;
    # the grad norm spikes 3-8x its median on scattered steps, never 3 in a row
    found = [f for f in replay_trace(CLASSES / f"{name}.jsonl.gz") if f.type == "grad_explosion"]
    assert found and 200 < found[0].step <= 250
    assert 200 <= found[0].evidence["onset_step"] < found[0].step
    assert found[0].evidence["consecutive_steps"] < 3


# -- burst vs explosion vs a recurring problem (issue 32) ------------------------------------


@pytest.mark.parametrize("length", [3, 6, 20])
def test_a_burst_the_run_recovers_from_is_not_an_explosion(length):
    """Bad batches (random labels, a corrupt shard) for up to explosion_burst_steps (20)
    steps, the lr unchanged, then the norm back at its level: a loss_spike's to report."""
    burst = [step(100 + k, grad_norm=30.0 if k % 3 else 8.0, lr=LR) for k in range(length)]
    recs = [run()] + _steady(100) + burst + _steady(400, start=100 + length)
    assert feed(only("grad_explosion"), recs) == []


def test_a_blow_up_with_no_raised_lr_pages_once_it_outlasts_a_burst():
    recs = [run()] + _steady(100) + [step(100 + k, grad_norm=40.0 * 1.05**k, lr=LR)
                                     for k in range(40)]
    found = feed(only("grad_explosion"), recs)
    assert [f.step for f in found] == [120]  # 21 steps: longer than a 20-step burst
    assert found[0].evidence["onset_step"] == 100 and found[0].evidence["rule"] == "in_a_row"


def test_outliers_that_keep_coming_are_a_recurring_problem_whatever_their_spacing():
    """One batch with inputs x30 every 35-70 steps: each alone is a bad batch, far apart
    for the isolated rule's 50-step window; the third an order of magnitude out within
    1000 steps names the pattern (five of any size would)."""
    rng = np.random.default_rng(1)
    at, k = [], 150
    while k < 1400:
        at.append(k)
        k += int(rng.integers(35, 71))
    recs = [run()] + [step(i, grad_norm=(30.0 if i in at else 1.0) * (1 + noise(i, 0.2)), lr=LR)
                      for i in range(1, 1400)]
    found = feed(only("grad_explosion"), recs)
    assert found and found[0].step == at[2]
    f = found[0]
    assert f.evidence["rule"] == "recurring" and f.evidence["onset_step"] == at[0]
    assert "at least 10x 3 separate times" in f.message and "about every" in f.message
    gaps = np.diff(at[:3])
    assert f"gaps {gaps.min()}-{gaps.max()}" in f.message


def test_a_few_outliers_in_a_thousand_steps_are_bad_batches_not_a_pattern():
    def trace(at, size):
        return [run()] + [step(i, grad_norm=(size if i in at else 1.0) * (1 + noise(i, 0.2)),
                               lr=LR) for i in range(1, 1400)]
    assert feed(only("grad_explosion"), trace([150, 400, 650, 900], 5.0)) == []  # 4 of 5x
    assert feed(only("grad_explosion"), trace([150, 900], 30.0)) == []  # 2 of 30x
    found = feed(only("grad_explosion"), trace([150, 350, 550, 750, 950], 5.0))
    assert [f.step for f in found] == [950]  # the fifth of any size
    assert "5 separate times" in found[0].message


def test_a_burst_after_which_the_gradient_does_not_come_back_is_an_explosion():
    """Inputs x100 (normalisation dropped): the norm 100-1000x for 6 steps, then a tenth
    of its level (dead units). Not a burst the run recovered from: paged once the 10 steps
    after it show the level, dated to the burst."""
    burst = [step(100 + k, grad_norm=g, lr=LR) for k, g in enumerate([120, 600, 1300, 400, 9])]
    dead = [step(i, grad_norm=0.1 * (1 + noise(i, 0.3)), lr=LR) for i in range(105, 200)]
    found = feed(only("grad_explosion"), [run()] + _steady(100) + burst + dead)
    assert [f.step for f in found] == [114]
    assert found[0].evidence["rule"] == "not_recovered" and found[0].evidence["onset_step"] == 100
    assert "did not come back" in found[0].message and "below" in found[0].message


def test_steps_without_a_grad_norm_neither_break_nor_extend_a_streak():
    """A writer that sends the norm on some steps only (a script's own records, a
    ``log_every`` loop): the steps between carry none. The same blow-up as above with a step without a norm after
    each reading fires on the same readings, 3 in a row."""
    def gaps(i: int) -> object:  # a step that says nothing of its gradient
        return step(i, lr=10 * LR, grad_norm=None)

    hot = [r for k, g in enumerate([8.0, 15.0, 40.0, 90.0])
           for r in (_hot(100 + 2 * k, g), gaps(101 + 2 * k))]
    found = feed(only("grad_explosion"), [run()] + _steady(100) + hot)
    assert [f.step for f in found] == [104]
    assert found[0].evidence["consecutive_steps"] == 3 and "3 steps in a row" in found[0].message


# -- what the not-recovered and overflow pages say (issue 51) --------------------------------


def _log_median(norms: list[float]) -> float:
    """The median the detector states, taken in log space (a ratio's middle)."""
    return float(np.exp(np.median(np.log(norms))))


def test_a_burst_that_did_not_come_back_page_gives_the_burst_the_level_since_and_the_drop():
    """Paged once: the level staying down past repeat_every_steps is the same damage."""
    from monitor_agent.detectors.grad_explosion import GRAD_EXPLOSION

    steady = _steady(100)
    burst = [step(100 + k, grad_norm=g, lr=LR) for k, g in enumerate([120, 600, 1300, 400, 9])]
    dead = [step(i, grad_norm=0.1 * (1 + noise(i, 0.3)), lr=LR, clip_threshold=5.0)
            for i in range(105, 400)]
    found = feed(only("grad_explosion"), [run()] + steady + burst + dead)
    assert [f.step for f in found] == [114]
    f, paged = found[0], dead[114 - 105]
    before = _log_median([r.grad_norm for r in steady])
    since = _log_median([r.grad_norm for r in dead[:10]])
    e = f.evidence
    assert (e["rule"], e["onset_step"], e["last_spike_step"]) == ("not_recovered", 100, 104)
    assert e["level_after"] == pytest.approx(since, rel=1e-5)
    # the median before the burst (its first readings in it barely move a median of 100)
    assert e["median"] == pytest.approx(before, rel=0.01)
    assert e["ratio"] == pytest.approx(since / e["median"], rel=1e-4) and e["z"] <= -6
    assert (e["grad_norm"], e["lr"], e["loss"], e["clip_threshold"]) == pytest.approx(
        (paged.grad_norm, LR, paged.loss, 5.0), rel=1e-5)
    assert f.message == (
        f"grad norm blew up from step 100 to 104 and did not come back: its median over the "
        f"10 steps since is {since:.3g}, {e['median'] / since:.0f}x below its median "
        f"{e['median']:.3g} "
        f"before ({-e['z']:.0f} sigma): the weights were damaged, not one bad batch")
    assert (f.value, f.threshold) == (e["level_after"], e["median"])
    assert f.severity == Severity.ERROR and f.suggestions == GRAD_EXPLOSION


def test_a_streak_cut_short_by_overflow_page_says_how_long_and_how_far_it_had_gone():
    from monitor_agent.detectors.grad_explosion import GRAD_EXPLOSION

    recs = [run()] + _steady(100) + [
        step(100, grad_norm=50.0, lr=LR, clip_threshold=5.0),
        step(101, grad_norm=5e4, lr=LR, clip_threshold=5.0),
        step(102, grad_norm=float("inf"), lr=LR, clip_threshold=5.0, loss=3.5)]
    found = feed(only("grad_explosion"), recs)
    assert [f.step for f in found] == [102]
    f, e = found[0], found[0].evidence
    assert 1.0 < e["median"] < 1.1 and 45 < e["min_ratio_in_streak"] < 50  # the 50 step
    assert f.message == (f"grad norm went inf after 2 step(s) at least "
                         f"{e['min_ratio_in_streak']:.1f}x its median {e['median']:.3g}")
    assert e["onset_step"] == 100 and e["consecutive_steps"] == 3
    assert (e["grad_norm"], e["lr"], e["loss"], e["clip_threshold"]) == (math.inf, LR, 3.5, 5.0)
    assert (f.value, f.threshold) == (math.inf, e["median"])
    assert f.severity == Severity.ERROR and f.suggestions == GRAD_EXPLOSION
