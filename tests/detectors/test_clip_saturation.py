"""clip_saturation: clipped on most steps -> LR too high."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, noise, only, step


def _stream(level: float, n: int = 200, clip: float | None = 1.0) -> list:
    return [step(i, grad_norm=level * (1 + noise(i, 0.3)), clip_threshold=clip)
            for i in range(1, n)]


def test_mostly_clipped_fires_when_the_window_fills():
    found = feed(only("clip_saturation"), _stream(1.4))
    assert [f.step for f in found] == [50, 150]  # then re-reported every 100 steps
    f = found[0]
    assert "learning rate" in f.suggestions[0]
    # value: the median grad norm, compared against the clip threshold (not 0.8 vs 0.8)
    assert 1.2 < f.value < 1.6 and f.threshold == 1.0
    assert f.evidence["fraction"] >= 0.8 and f.evidence["limit_fraction"] == 0.8
    assert f"{f.evidence['fraction']:.0%}" in f.message and "limit 80%" in f.message


def test_quiet_when_clipping_is_occasional_or_off():
    assert feed(only("clip_saturation"), _stream(0.8)) == []
    assert feed(only("clip_saturation"), _stream(5.0, clip=None)) == []


def test_restore_mid_stream_changes_nothing():
    assert_restore_equivalent(lambda: only("clip_saturation"), _stream(1.4, 300), cut=30)
