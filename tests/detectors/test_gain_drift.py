"""gain_drift: the per-layer gradient gain through depth creeping above its early level."""

from __future__ import annotations

import math

from synth_records import (
    assert_restore_equivalent,
    feed,
    geometric,
    layers,
    names,
    noise,
    only,
    run,
    step,
)


def _stream(n_layers: int, gains, n_steps: int) -> list:
    ns = names(n_layers)
    recs = [run(layer_order=ns)]
    for i in range(1, n_steps):
        g = gains(i)
        # grad norm grows toward the input by ``g`` per layer: input = g**(L-1) x output
        grads = geometric(n_layers, g ** (n_layers - 1), 1.0)
        grads = grads * [1 + noise(i + k, 0.1) for k in range(n_layers)]
        recs.append(step(i, layers=layers(ns, grads)))
    return recs


def test_creeping_gain_fires_past_the_depth_scaled_limit():
    n = 16  # limit 1 + 0.05 * sqrt(16) = 1.2 per layer
    found = feed(only("gain_drift"), _stream(n, lambda i: 1.0 if i < 200 else 1.4, 400))
    assert found and 200 < found[0].step < 260
    f = found[0]
    assert abs(f.threshold - 1.2) < 1e-9 and f.value > 1.2
    assert f.evidence["end_to_end_drift"] > 4


def test_quiet_on_a_stable_gain_even_if_it_is_not_one():
    assert feed(only("gain_drift"), _stream(16, lambda i: 1.1, 600)) == []


def test_quiet_on_small_drift_in_a_shallow_net():
    # 1.15x per layer over 6 layers is ~2x end to end: noise-sized, below min total.
    assert feed(only("gain_drift"), _stream(6, lambda i: 1.0 if i < 200 else 1.15, 500)) == []


def test_limit_scales_with_depth():
    deep = 64  # limit 1.4: a 1.3x per-layer drift that fires at 16 layers does not here
    shallow = feed(only("gain_drift"), _stream(16, lambda i: 1.0 if i < 200 else 1.3, 400))
    assert shallow and math.isclose(shallow[0].threshold, 1.2)
    assert feed(only("gain_drift"), _stream(deep, lambda i: 1.0 if i < 200 else 1.3, 400)) == []


def test_restore_mid_stream_changes_nothing():
    recs = _stream(16, lambda i: 1.0 if i < 150 else 1.5, 350)
    assert_restore_equivalent(lambda: only("gain_drift"), recs, cut=120)


def test_a_drift_at_constant_total_gradient_is_quiet():
    # Healthy training redistributes the gradient between layers: the gain moves, the
    # total norm does not grow. Measured on the corpus' healthy MLPs; not an alarm.
    n = 16
    ns = names(n)
    recs = [run(layer_order=ns)]
    for i in range(1, 400):
        g = 1.0 if i < 200 else 1.4
        grads = geometric(n, g ** (n - 1), 1.0)
        grads = grads / math.sqrt(float((grads**2).sum()))  # unit total norm throughout
        recs.append(step(i, layers=layers(ns, grads * [1 + noise(i + k, 0.1) for k in range(n)])))
    assert feed(only("gain_drift"), recs) == []


def test_it_is_info_not_an_alarm():
    from monitor_agent.records.types import Severity

    found = feed(only("gain_drift"), _stream(16, lambda i: 1.0 if i < 200 else 1.4, 400))
    assert found and {f.severity for f in found} == {Severity.INFO}
    assert found[0].evidence["grad_norm_growth"] >= 3
