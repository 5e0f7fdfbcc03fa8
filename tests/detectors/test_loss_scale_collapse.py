"""loss_scale_collapse: repeated halvings, the floor, or persistent overflow; the
scaler's own probing is counted, never flagged."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, only, step

from monitor_agent.records.types import Severity

INF = float("inf")


def _scaled(scales: list[float], skipped: set[int]) -> list:
    return [step(i + 1, loss_scale=s, skipped=(i + 1) in skipped,
                 grad_norm=INF if (i + 1) in skipped else 1.0) for i, s in enumerate(scales)]


def test_scaler_warmup_halvings_are_not_a_collapse():
    # GradScaler starts high and halves a few times before settling; then normal probing.
    scales = [65536 / 2**k for k in range(8)] + [256.0] * 100 + [128.0] + [256.0] * 100
    skipped = set(range(1, 9)) | {109}
    assert feed(only("loss_scale_collapse"), _scaled(scales, skipped)) == []


def test_six_halvings_after_settling_is_an_error():
    scales = [262144.0] * 100 + [262144.0 / 2**k for k in range(1, 10)]
    skipped = set(range(101, 110))
    found = feed(only("loss_scale_collapse"), _scaled(scales, skipped))
    assert [(f.step, f.severity) for f in found] == [(106, Severity.ERROR)]
    assert "bfloat16" in found[0].suggestions[0]
    assert found[0].evidence["skipped_total"] == 6


def test_persistent_overflow_without_scale_change_is_a_collapse():
    scales = [1024.0] * 130
    found = feed(only("loss_scale_collapse"), _scaled(scales, set(range(100, 131))))
    assert found and found[0].step == 109 and "in a row" in found[0].message


def test_scale_below_the_floor():
    found = feed(only("loss_scale_collapse"), _scaled([0.5] * 3, set()))
    assert found and found[0].step == 1


def test_restore_mid_stream_changes_nothing():
    scales = [262144.0] * 100 + [262144.0 / 2**k for k in range(1, 40)]
    recs = _scaled(scales, set(range(101, 140)))
    assert_restore_equivalent(lambda: only("loss_scale_collapse"), recs, cut=103)


def test_the_collapse_names_where_the_unscaled_gradients_overflow():
    from synth_records import grad_table, names, run

    n = names(4)  # input -> output; layer 2 overflows on its own, 3 (output side) is fine
    recs = [run(layer_order=n)] + [step(i, loss_scale=4096.0) for i in range(1, 100)]
    recs += [step(i, loss_scale=4096.0, skipped=True, grad_norm=INF,
                  grad_norms=grad_table(n, [INF, INF, INF, 0.3])) for i in range(100, 120)]
    (f, *_) = feed(only("loss_scale_collapse"), recs)
    assert f.evidence["overflow_origin"] == n[2]
    assert f"first non-finite gradient (output side): {n[2]}" in f.message
