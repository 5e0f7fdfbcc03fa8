"""Which layer left its own band first: the per-parameter order behind grad_explosion and
divergence findings (layer_bands.py), from monitored layers and gated grad_norms alike."""

from __future__ import annotations

import math

import numpy as np
from synth_records import assert_restore_equivalent, feed, grad_table, names, noise, only, run, step

from monitor_agent.detectors.settings import DetectorSettings
from monitor_agent.detectors.support.context import DetectorContext
from monitor_agent.detectors.support.layer_bands import HORIZON, LayerBands

N = names(4)
LEVELS = np.array([0.2, 1.0, 0.05, 0.5])  # each layer its own level


def _layer_grads(i: int, boost: dict[int, float]) -> list[float]:
    return [LEVELS[k] * (1 + noise(i, 0.2, seed=k)) * boost.get(k, 1.0) for k in range(4)]


def _explosion(first: int, second: int) -> list:
    """Layer ``first`` leaves at step 100, ``second`` at 102, global explosion from 103,
    under an lr raised 10x at step 100 (the cause, still applied)."""
    recs = [run(layer_order=N)]
    for i in range(1, 110):
        boost = {}
        if i >= 100:
            boost[first] = 6.0 * (i - 99)
        if i >= 102:
            boost[second] = 5.0 * (i - 101)
        g = 1.0 + noise(i, 0.2) if i < 103 else 10.0 * (i - 102)
        recs.append(step(i, grad_norm=g, grad_norms=grad_table(N, _layer_grads(i, boost)),
                         lr=1e-3 if i < 100 else 1e-2))
    return recs


def test_grad_explosion_names_the_layer_that_left_its_band_first():
    (f,) = feed(only("grad_explosion"), _explosion(first=2, second=0))
    assert f.evidence["first_layer_out"] == N[2] and f.evidence["first_layer_out_step"] == 100
    assert f.evidence["layers_out_order"].startswith(f"{N[2]}@100, {N[0]}@102")
    assert f"first layer out of its band: {N[2]} (step 100" in f.message


def test_the_order_follows_the_layers_not_their_registration():
    (f,) = feed(only("grad_explosion"), _explosion(first=0, second=3))
    assert f.evidence["first_layer_out"] == N[0]
    assert f.evidence["layers_out_order"].startswith(f"{N[0]}@100, {N[3]}@102")


def test_divergence_findings_carry_the_first_layer_out():
    recs = _explosion(first=1, second=2)
    # The loss runs off with the gradients: the runaway rule, then a NaN.
    recs = [r if r.kind != "step" or r.step < 100 else
            step(r.step, loss=2.0 * 1.5 ** (r.step - 99), grad_norm=r.grad_norm,
                 grad_norms=r.grad_norms) for r in recs]
    found = feed(only("divergence"), recs)
    assert found and found[0].evidence["first_layer_out"] == N[1]


def test_an_episode_is_remembered_for_the_horizon_after_the_layer_came_back():
    ctx = DetectorContext(DetectorSettings())
    bands = LayerBands()
    for i in range(1, 40 + HORIZON + 2):
        boost = ({1: 10.0} if i in (30, 31, 35) else {2: 10.0} if i in (32, 33) else
                 {3: 10.0} if i == 20 else {})  # layer 3: one stray reading, no episode
        bands.update(ctx.align(grad_table(N, _layer_grads(i, boost))), i)
        if i == 36:  # 35 continues layer 1's episode that began at 30
            assert [(n, s) for n, s, _ in bands.first_out(ctx, i)] == [(N[1], 30), (N[2], 32)]
    # Layer 1 came back at 36: its episode is named until 36 + HORIZON, then forgotten.
    assert [n for n, _, _ in bands.first_out(ctx, 36 + HORIZON)] == [N[1]]
    assert bands.first_out(ctx, 37 + HORIZON) == [] and bands.count_out(37 + HORIZON) == 0


def test_a_non_finite_gradient_is_out_of_band_at_once():
    ctx = DetectorContext(DetectorSettings())
    bands = LayerBands()
    bands.update(ctx.align(grad_table(N, [1.0, math.nan, 1.0, 1.0])), 1)
    (name, at, ratio), = bands.first_out(ctx, 1)
    assert (name, at, ratio) == (N[1], 1, math.inf)


def test_restore_mid_stream_changes_nothing():
    assert_restore_equivalent(lambda: only("grad_explosion"), _explosion(2, 0), cut=101)


def test_a_departure_long_before_the_faults_onset_is_not_named_as_its_origin():
    """Issue 31: a layer flared (two readings out) 60 steps before a divergence began; it is
    within the episode horizon, but the fault's onset says it is another story."""
    from monitor_agent.detectors.support.layer_bands import locate
    from monitor_agent.records.types import Finding, Severity

    ctx, bands = DetectorContext(DetectorSettings()), LayerBands()
    for i in range(1, 71):
        boost = {1: 8.0} if i in (10, 11) else {}  # the stray flare
        if i >= 68:
            boost[3] = 6.0 * (i - 67)  # where the fault begins
        bands.update(ctx.align(grad_table(N, _layer_grads(i, boost))), i)
    fault = Finding("divergence", Severity.ERROR, "r", 70, "diverged",
                    evidence={"onset_step": 70})
    [named] = locate([fault], bands, ctx)
    assert named.evidence["first_layer_out"] == N[3], named.evidence
    assert named.evidence["first_layer_out_step"] == 68
    # Without an onset the horizon alone decides, and the flare is still the first out.
    [plain] = locate([Finding("grad_explosion", Severity.ERROR, "r", 70, "exploded")], bands, ctx)
    assert plain.evidence["first_layer_out"] == N[1]
