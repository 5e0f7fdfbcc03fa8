"""grad_explosion: an order of magnitude above the rolling median, warmup-aware, per layer."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, layers, names, noise, only, run, step

from monitor_agent.types import Severity


def _steady(n: int, start: int = 1) -> list:
    return [step(i, grad_norm=1.0 + noise(i, 0.3)) for i in range(start, n)]


def test_ten_x_the_median_fires_with_the_ratio():
    recs = [run()] + _steady(100) + [step(100, grad_norm=15.0)]
    found = feed(only("grad_explosion"), recs)
    assert [(f.step, f.severity) for f in found] == [(100, Severity.ERROR)]
    assert 13 < found[0].evidence["ratio"] < 17 and "x its median" in found[0].message


def test_warmup_peaks_need_a_bigger_jump():
    recs = [run(warmup_steps=200)] + _steady(100) + [step(100, grad_norm=15.0)]
    assert feed(only("grad_explosion"), recs) == []
    recs.append(step(101, grad_norm=100.0))
    assert [f.step for f in feed(only("grad_explosion"), recs)] == [101]


def test_loss_scaler_overflow_is_skipped():
    recs = _steady(60) + [step(60, grad_norm=float("inf"), skipped=True, loss_scale=1024.0)]
    recs.append(step(61, grad_norm=1e6, skipped=True, loss_scale=512.0))
    assert feed(only("grad_explosion"), recs) == []


def test_one_layer_exploding_alone_is_named():
    n = names(5)
    recs = [run(layer_order=n)]
    recs += [step(i, layers=layers(n, [1.0 + noise(i + k, 0.2) for k in range(5)]))
             for i in range(1, 60)]
    recs.append(step(60, layers=layers(n, [1.0, 1.0, 500.0, 1.0, 1.0])))
    found = feed(only("grad_explosion"), recs)
    assert [(f.step, f.layer) for f in found] == [(60, "layers.2.weight")]


def test_quiet_on_ordinary_fluctuation():
    recs = [run()] + [step(i, grad_norm=1.0 * (3.0 if i % 50 == 0 else 1.0) + noise(i, 0.3))
                      for i in range(1, 1000)]
    assert feed(only("grad_explosion"), recs) == []


def test_restore_mid_stream_changes_nothing():
    n = names(3)
    recs = [run(layer_order=n)] + [step(i, grad_norm=1 + noise(i, 0.3),
                                        layers=layers(n, [1 + noise(i, 0.2)] * 3))
                                   for i in range(1, 80)]
    recs += [step(80, grad_norm=50.0, layers=layers(n, [1.0, 300.0, 1.0])),
             step(81, grad_norm=1.0, layers=layers(n, [1.0, 300.0, 1.0]))]
    assert_restore_equivalent(lambda: only("grad_explosion"), recs, cut=40)
