"""loss_spike: far above the EMA and a robust outlier; quiet on noise and steady decline."""

from __future__ import annotations

import pytest
from class_traces import expected, recordings
from detector_harness import replay_trace
from synth_records import assert_restore_equivalent, feed, noise, of_type, only, run, step

from monitor_agent.records.types import Severity


def _decaying(n: int, spike_at: dict[int, float] | None = None) -> list:
    recs = [run()]
    for i in range(1, n):
        loss = 4.0 * (0.5 + 0.5 * 0.995**i) * (1 + noise(i, 0.03))
        recs.append(step(i, loss=loss * (spike_at or {}).get(i, 1.0)))
    return recs


def test_a_2x_spike_fires_once_with_ratio_and_z_in_the_message():
    found = feed(only("loss_spike"), _decaying(400, {300: 2.0, 301: 2.0, 302: 1.9}))
    assert [f.step for f in found] == [300]
    f = found[0]
    assert f.severity == Severity.WARNING
    assert "x its EMA" in f.message and "z=" in f.message
    assert f.evidence["ratio"] > 1.8 and f.threshold < f.value


def test_quiet_on_a_noisy_declining_loss():
    assert feed(only("loss_spike"), _decaying(1000)) == []


def test_a_noisy_run_needs_a_bigger_jump_than_a_smooth_one():
    noisy = [step(i, loss=2.0 * (1 + noise(i, 0.3))) for i in range(1, 200)]
    noisy.append(step(200, loss=2.0 * 1.4))
    assert of_type(feed(only("loss_spike"), noisy), "loss_spike") == []
    smooth = [step(i, loss=2.0 * (1 + noise(i, 0.01))) for i in range(1, 200)]
    smooth.append(step(200, loss=2.0 * 1.4))
    assert [f.step for f in feed(only("loss_spike"), smooth)] == [200]


def test_no_judgement_before_enough_history():
    recs = [step(1, loss=4.0), step(2, loss=2.0), step(3, loss=8.0)]
    assert feed(only("loss_spike"), recs) == []


def test_ema_is_bias_corrected_and_starts_at_the_first_value():
    suite = only("loss_spike", ema_alpha=0.9)
    feed(suite, [step(1, loss=4.0)])
    assert suite.ema_loss(0) == 4.0
    feed(suite, [step(2, loss=2.0)])
    assert abs(suite.ema_loss(0) - (0.9 * 0.1 * 4.0 + 0.1 * 2.0) / (1 - 0.81)) < 1e-12


def test_restore_mid_stream_changes_nothing():
    recs = _decaying(400, {300: 2.0})
    assert_restore_equivalent(lambda: only("loss_spike"), recs, cut=150)


def test_an_order_of_magnitude_is_a_spike_even_where_batches_are_heavy_tailed():
    # A converged CNN: single batches swing e^-2..e^2 around 0.01, so the robust z of a
    # 190x batch stays under spike_z; the spike_decade floor still reports it, a warning.
    import math

    recs = [run()] + [step(i, loss=0.01 * math.exp(noise(i, 2.0))) for i in range(1, 300)]
    spike = step(300, loss=1.9)
    assert feed(only("loss_spike", spike_decade=1e9), recs + [spike]) == []  # z alone: no
    found = feed(only("loss_spike"), recs + [spike])
    assert [(f.step, f.severity) for f in found] == [(300, Severity.WARNING)]
    assert found[0].evidence["ratio"] >= 10 and found[0].evidence["z"] < 6


def test_an_order_of_magnitude_is_no_spike_where_the_runs_own_batches_reach_one():
    # A TD loss near zero: its batches routinely reach 10-20x its EMA, so a 17x one at a
    # modest z is its normal; one a decade above anything in its last 100 steps is a spike.
    import numpy as np

    rng = np.random.default_rng(1)
    losses = 0.001 * np.exp(rng.standard_normal(300))  # heavy-tailed: max ~ 15-20x
    recs = [run()] + [step(i, loss=float(v)) for i, v in enumerate(losses[1:], start=1)]
    normal = step(300, loss=0.017)
    assert feed(only("loss_spike"), recs + [normal]) == []
    huge = step(300, loss=1.0)
    found = feed(only("loss_spike"), recs + [huge])
    assert [(f.step, f.severity) for f in found] == [(300, Severity.WARNING)]


@pytest.mark.parametrize("label,path", recordings("burst"),
                         ids=lambda v: v["file"][:-9] if isinstance(v, dict) else "")
def test_every_recorded_burst_of_bad_batches_is_a_spike_dated_to_its_first_batch(label, path):
    # real runs: 1..20 bad batches in a row on an MLP, a CNN and a GPT (tests/traces/classes)
    window = expected(label, "loss_spike")
    found = [f for f in replay_trace(path) if f.type == "loss_spike"]
    assert found and window["first_step"] <= found[0].step <= window["last_step"]
    assert found[0].evidence["onset_step"] == found[0].step == label["fault_step"]


def test_a_signed_loss_is_judged_in_its_own_noise_not_as_a_ratio():
    """Around zero of either sign, loss / EMA is any number: 0.3 over an EMA of 0.01 is
    30x and nothing. One batch 20 of its own sigmas out is still a spike, on a loss the run
    declared signed (one that settles to a level)."""
    import numpy as np
    rng = np.random.default_rng(0)
    recs = [run(loss_kind="signed")]
    recs += [step(i, loss=0.01 + 0.05 * rng.standard_normal()) for i in range(1, 300)]
    assert of_type(feed(only("loss_spike"), recs), "loss_spike") == []
    recs.append(step(300, loss=1.5))
    found = of_type(feed(only("loss_spike"), recs), "loss_spike")
    assert [f.step for f in found] == [300] and found[0].evidence["units"] == "linear"


@pytest.mark.parametrize("config", [{}, {"loss_kind": "rl"}, {"loss_kind": "nonstationary"}])
def test_a_loss_with_no_stable_level_has_no_spike_above_it(config):
    """A loss of either sign nobody declared, or one declared nonstationary, has no stable
    level (support/context.py's level_units): the same batch 30 sigmas out is no spike."""
    import numpy as np
    rng = np.random.default_rng(0)
    recs = [run(**config)]
    recs += [step(i, loss=0.01 + 0.05 * rng.standard_normal()) for i in range(1, 300)]
    recs.append(step(300, loss=1.5))
    assert of_type(feed(only("loss_spike"), recs), "loss_spike") == []


# -- what a page says, and when the first one can come (issue 51) ----------------------------


def _signed(n: int) -> list:
    """A signed loss (declared so) around 0.01 with noise of 0.05, one batch each step."""
    import numpy as np
    rng = np.random.default_rng(0)
    return [run(loss_kind="signed")] + [step(i, loss=0.01 + 0.05 * rng.standard_normal(),
                                             grad_norm=0.7) for i in range(1, n)]


def _one_spike(history: list, loss: float) -> tuple:
    """The one finding of a spike to ``loss`` at step 300 after ``history``, and the loss
    EMA it was judged against."""
    suite = only("loss_spike")
    feed(suite, history)
    ema = suite.ema_loss(0)
    found = feed(suite, [step(300, loss=loss, grad_norm=0.7)])
    assert len(found) == 1
    return found[0], ema


def test_a_spike_page_gives_the_loss_its_ema_the_ratio_and_the_limits():
    from monitor_agent.detectors.loss_spike import LOSS_SPIKE

    f, ema = _one_spike(_decaying(300), 5.0)
    ratio, z = 5.0 / ema, f.evidence["z"]
    assert f.message == f"loss 5 is {ratio:.1f}x its EMA {ema:.3g} (z={z:.1f})"
    assert (f.value, f.threshold) == (5.0, pytest.approx(ema, rel=1e-5))
    assert f.evidence == {"onset_step": 300, "loss": 5.0, "ema": pytest.approx(ema, rel=1e-5),
                          "ratio": pytest.approx(ratio, rel=1e-5), "z": z,
                          "limit_ratio": 1.3, "limit_z": 6.0, "grad_norm": 0.7,
                          "spikes_so_far": 1}
    assert z >= 6 and f.suggestions == LOSS_SPIKE


def test_a_signed_loss_spike_page_says_how_far_above_its_ema_in_its_own_units():
    from monitor_agent.detectors.loss_spike import LOSS_SPIKE

    f, ema = _one_spike(_signed(300), 1.5)
    excess, z = 1.5 - ema, f.evidence["z"]
    assert f.message == (f"loss 1.5 is {excess:.3g} above its EMA {ema:.3g} (z={z:.1f} of its "
                         "own noise; a signed loss has no ratio)")
    assert (f.value, f.threshold) == (1.5, pytest.approx(ema, rel=1e-5))
    assert f.evidence == {"onset_step": 300, "loss": 1.5, "ema": pytest.approx(ema, rel=1e-5),
                          "excess": pytest.approx(excess, rel=1e-5), "z": z, "limit_z": 6.0,
                          "units": "linear", "grad_norm": 0.7, "spikes_so_far": 1}
    assert z >= 6 and f.suggestions == LOSS_SPIKE
    assert f.severity == Severity.WARNING


@pytest.mark.parametrize("units", ["log", "linear"])
def test_spikes_within_repeat_every_steps_are_counted_though_not_paged(units):
    """One page per ``repeat_every_steps`` (100); the next one says how many spikes the
    run had so far, the unpaged ones included."""
    if units == "log":
        recs, big = _decaying(600), 5.0
    else:
        recs, big = _signed(600), 1.5
    at = {300, 340, 450}
    recs = [step(r.step, loss=big, grad_norm=0.7) if getattr(r, "step", None) in at else r
            for r in recs]
    found = feed(only("loss_spike"), recs)
    assert [(f.step, f.evidence["spikes_so_far"]) for f in found] == [(300, 1), (450, 3)]


@pytest.mark.parametrize("config", [{}, {"loss_kind": "signed"}], ids=["log", "linear"])
def test_the_first_spike_judged_is_the_one_with_min_history_steps_residuals_behind_it(config):
    """The first step has no EMA to be above (nothing enters it before its step is
    judged); each later one leaves a residual; with ``min_history_steps`` of them behind
    it a step is judged, not before."""
    def spike_at(k: int) -> list[int]:
        recs = [run(**config)] + [step(i, loss=2.0 + noise(i, 0.05)) for i in range(1, k)]
        found = feed(only("loss_spike", min_history_steps=30), recs + [step(k, loss=6.0)])
        return [f.step for f in found]

    assert spike_at(31) == [] and spike_at(32) == [32]


def _falling(n: int) -> tuple[list, float]:
    """A loss that falls faster than its EMA follows: every batch 1.6-20x under the EMA
    (log ratio -1.75 +- 1.25); the records, and the EMA the next step is judged against."""
    import math

    suite = only("loss_spike")
    recs = [run(), step(1, loss=1.0)]
    feed(suite, recs)
    for i in range(2, n):
        ema = suite.ema_loss(0)
        assert ema is not None
        rec = step(i, loss=ema * math.exp(-1.75 + noise(i, 1.25)))
        feed(suite, [rec])
        recs.append(rec)
    ema = suite.ema_loss(0)
    assert ema is not None
    return recs, ema


def test_an_order_of_magnitude_counts_from_the_ema_where_every_recent_batch_was_under_it():
    """The decade rule's tail is the largest recent ratio, but never under the EMA itself:
    where every batch of the window was below its EMA, a spike is still spike_decade x
    the EMA (exactly that is one), not a decade above that largest ratio (7x is not)."""
    recs, ema = _falling(300)
    assert feed(only("loss_spike"), recs + [step(300, loss=7.0 * ema)]) == []
    found = feed(only("loss_spike"), recs + [step(300, loss=10.0 * ema)])
    assert [f.step for f in found] == [300]
    assert found[0].evidence["ratio"] == 10.0 and found[0].evidence["z"] < 6  # the decade's


def test_a_loss_climbing_at_a_steady_rate_is_no_spike_a_hair_off_its_trend():
    """A loss growing 0.3% a step sits 1.30x over its lagging EMA every step, its log
    ratio constant to the last bit: a step 0.3% off that trend is within the thousandth
    of a log unit the spread never goes under (rounding), no spike; 1% off is one."""
    g = 0.99 / 0.987  # the growth whose steady ratio to an EMA of alpha 0.99 is 1.3
    recs = [run()] + [step(i, loss=1e-3 * g**i) for i in range(1, 3000)]
    trend = 1e-3 * g**3000
    assert feed(only("loss_spike"), recs + [step(3000, loss=1.003 * trend)]) == []
    found = feed(only("loss_spike"), recs + [step(3000, loss=1.01 * trend)])
    assert [f.step for f in found] == [3000] and found[0].evidence["ratio"] > 1.3


def test_spike_ratio_is_the_least_ratio_that_is_a_spike():
    """A batch at exactly ``spike_ratio`` x its EMA is a spike (its z far past spike_z);
    one just under it is not."""
    suite = only("loss_spike")
    feed(suite, _decaying(300))
    ema = suite.ema_loss(0)
    assert ema is not None
    at, under = step(300, loss=2.0 * ema), step(300, loss=1.99 * ema)
    found = feed(only("loss_spike", spike_ratio=2.0), _decaying(300) + [at])
    assert [f.step for f in found] == [300] and found[0].evidence["ratio"] == 2.0
    assert feed(only("loss_spike", spike_ratio=2.0), _decaying(300) + [under]) == []


@pytest.mark.parametrize("units", ["log", "linear"])
def test_spike_z_is_the_least_z_that_is_a_spike(units):
    """A batch exactly ``spike_z`` robust sigmas out is a spike, one a hair under it is
    not: the z recomputed here as the module docstring states it (the residual against the
    median and MAD of the last baseline_window residuals; in log units a spread of at
    least a thousandth)."""
    import math

    from monitor_agent.detectors.support.stats import Window, robust_z

    recs, loss = (_decaying(300), 5.0) if units == "log" else (_signed(300), 1.5)
    suite, window = only("loss_spike"), Window.of(100)

    def residual(value: float) -> float:
        ema = suite.ema_loss(0)
        assert ema is not None
        return math.log(value / ema) if units == "log" else value - ema

    for rec in recs:
        if getattr(rec, "loss", None) is not None and suite.ema_loss(0) is not None:
            window.add(residual(rec.loss))
        feed(suite, [rec])
    z = robust_z(residual(loss), window, **({"floor": 1e-3} if units == "log" else {}))
    spike = step(300, loss=loss)
    assert [f.step for f in feed(only("loss_spike", spike_z=z), recs + [spike])] == [300]
    assert feed(only("loss_spike", spike_z=math.nextafter(z, math.inf)), recs + [spike]) == []


def test_a_loss_of_exactly_zero_has_no_ratio_and_breaks_nothing():
    """A loss at exactly 0 (every batch fitted: a hinge loss, an underflow) for the first
    steps leaves an EMA of 0, and a 0 later on has no log ratio: neither is judged, and the
    spike after them still is."""
    recs = [run()] + [step(i, loss=0.0) for i in range(1, 31)]
    recs += [step(i, loss=0.0 if i == 150 else 1e-3 * (1 + noise(i, 0.05)))
             for i in range(31, 250)]
    found = feed(only("loss_spike"), recs + [step(250, loss=5e-3)])
    assert [f.step for f in found] == [250]
