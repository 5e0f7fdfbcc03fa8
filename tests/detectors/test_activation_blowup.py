"""activation_blowup: non-finite activations, or max-abs/std growing far above history."""

from __future__ import annotations

import math

from synth_records import assert_restore_equivalent, feed, noise, only, run, step

from monitor_agent.records.types import ActivationTable


def acts(rows: dict[str, tuple[float, float, float]]) -> ActivationTable:
    """rows: name -> (max_abs, std, nonfinite)."""
    return ActivationTable.from_mapping({
        n: {"mean": 0.0, "std": s, "max_abs": m, "zero_frac": 0.0, "dead_frac": None,
            "nonfinite": bad} for n, (m, s, bad) in rows.items()})


def _run(grow_from: int | None = None, rate: float = 2.0, until: int = 80,
         nan_at: int | None = None, scale: float = 1.0) -> list:
    recs = [run()]
    for i in range(1, until):
        m = scale * 4.0 * (1 + noise(i, 0.2))
        s = scale * 0.5 * (1 + noise(i, 0.1, seed=1))
        if grow_from is not None and i >= grow_from:
            m, s = m * rate ** (i - grow_from + 1), s * rate ** (i - grow_from + 1)
        bad = 0.0
        if nan_at is not None and i >= nan_at:
            m, s, bad = math.inf, math.nan, 12.0
        recs.append(step(i, activations=acts({"h.0.act": (m, s, bad),
                                              "h.1.act": (4.0, 0.5, 0.0)})))
    return recs


def test_healthy_is_quiet_at_any_scale():
    assert feed(only("activation_blowup"), _run(until=400)) == []
    assert feed(only("activation_blowup"), _run(until=400, scale=1e-4)) == []


def test_slow_healthy_growth_is_quiet():
    assert feed(only("activation_blowup"), _run(grow_from=10, rate=1.01, until=400)) == []


def test_growth_fires_when_sustained():
    found = feed(only("activation_blowup"), _run(grow_from=40, rate=2.0))
    # 2x per reading: 8x at 42, 16x at 43 (ratio >= 10), 32x at 44 (second reading in a row)
    assert [(f.step, f.layer) for f in found] == [(44, "h.0.act")]
    f = found[0]
    assert f.severity.label == "error" and f.evidence["ratio"] >= 10 and f.suggestions
    assert "recent median" in f.message


def test_nonfinite_fires_at_once():
    found = feed(only("activation_blowup"), _run(nan_at=30, until=35))
    assert [(f.step, f.layer) for f in found] == [(30, "h.0.act")]
    assert found[0].value == 12.0 and "non-finite" in found[0].message


def test_snapshot_restore_mid_stream():
    assert_restore_equivalent(lambda: only("activation_blowup"), _run(grow_from=40), cut=41)
    assert_restore_equivalent(lambda: only("activation_blowup"), _run(grow_from=40), cut=1)
