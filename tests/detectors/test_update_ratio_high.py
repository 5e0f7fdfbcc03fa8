"""update_ratio_high: the median update/param ratio above 0.1 -> reduce LR 5-10x."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, only, run, step

from monitor_agent.detectors import update_ratio as tips


def _stream(ratios: list[float]) -> list:
    return [run(total_steps=1000)] + [step(i + 1, param_norm=10.0, update_norm=10.0 * r)
                                      for i, r in enumerate(ratios)]


def test_sustained_high_ratio_fires_with_phase_band_and_lr_advice():
    found = feed(only("update_ratio_high"), _stream([0.005] * 400 + [0.3] * 10))
    assert [f.step for f in found] == [403]  # 3 of the last 5 above the limit
    f = found[0]
    assert f.threshold == 0.1 and f.value > 0.1
    assert f.evidence["phase"] == "mid" and f.evidence["band_high"] == 1e-3
    assert f.suggestions == tips.UPDATE_RATIO_HIGH and "5-10x" in f.suggestions[0]


def test_a_single_large_step_is_not_enough():
    assert feed(only("update_ratio_high"), _stream([0.005] * 100 + [0.5] + [0.005] * 100)) == []


def test_quiet_inside_the_limits():
    assert feed(only("update_ratio_high"), _stream([0.01, 0.05, 0.002] * 200)) == []


def test_restore_mid_stream_changes_nothing():
    recs = _stream([0.005] * 100 + [0.3] * 300)
    assert_restore_equivalent(lambda: only("update_ratio_high"), recs, cut=102)
