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
