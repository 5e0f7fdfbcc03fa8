"""clip_saturation: clipped on most steps -> LR too high."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, noise, only, step


def _stream(level: float, n: int = 200, clip: float | None = 1.0) -> list:
    return [step(i, grad_norm=level * (1 + noise(i, 0.3)), clip_threshold=clip)
            for i in range(1, n)]


def test_mostly_clipped_fires_when_the_window_fills():
    found = feed(only("clip_saturation"), _stream(1.4))
    assert [f.step for f in found] == [50, 150]  # then re-reported every 100 steps
    assert found[0].value >= 0.8 and "learning rate" in found[0].suggestions[0]


def test_quiet_when_clipping_is_occasional_or_off():
    assert feed(only("clip_saturation"), _stream(0.8)) == []
    assert feed(only("clip_saturation"), _stream(5.0, clip=None)) == []


def test_restore_mid_stream_changes_nothing():
    assert_restore_equivalent(lambda: only("clip_saturation"), _stream(1.4, 300), cut=30)
