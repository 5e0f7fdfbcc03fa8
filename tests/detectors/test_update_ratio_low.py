"""update_ratio_low: the median update/param ratio below 1e-7 -> the run is not learning."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, only, run, step


def _stream(ratios: list[float]) -> list:
    return [run()] + [step(i + 1, param_norm=20.0, update_norm=20.0 * r)
                      for i, r in enumerate(ratios)]


def test_tiny_updates_fire_once_the_window_is_full():
    found = feed(only("update_ratio_low"), _stream([5e-8] * 50))
    assert found[0].step == 5 and found[0].value < 1e-7
    assert "not learning" in found[0].suggestions[0]


def test_quiet_on_normal_and_on_one_zero_step():
    assert feed(only("update_ratio_low"), _stream([0.0] + [1e-3] * 300)) == []


def test_restore_mid_stream_changes_nothing():
    assert_restore_equivalent(lambda: only("update_ratio_low"), _stream([5e-8] * 300), cut=3)
