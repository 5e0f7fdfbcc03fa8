"""grad_distribution: collapse, heavy tails and a shifted centre, each against the
parameter's own history of grad_hist quantiles; quiet on healthy, noisy, drifting runs."""

from __future__ import annotations

import numpy as np
from synth_records import DT, T0, assert_restore_equivalent, assert_restore_silent, feed, only, run

from monitor_agent.records import schemas
from monitor_agent.records.types import QUANTILE_LEVELS

EVERY = 10  # hist_every of the synthetic runs
NAMES = [f"h.{k}.weight" for k in range(6)]


def _sample(rng: np.random.Generator, i: int, k: int, fault: str | None) -> np.ndarray:
    scale = 0.01 * (1.0 + 0.5 * k) * (1.0 - i / 4000)  # per-layer scale, slow decay
    x = rng.normal(0.0, scale, 1024)
    if fault == "heavy_tail":  # 3% of the entries 40x larger
        hit = rng.random(1024) < 0.03
        x[hit] *= 40.0
    elif fault == "collapsed":  # dead units: almost every entry exactly zero
        x[rng.random(1024) < 0.995] = 0.0
    elif fault == "shifted":  # every entry pushed one way by 2 std
        x += 2.0 * scale
    return x


def _hist(x: np.ndarray) -> dict:
    counts, edges = np.histogram(x, bins=16)
    return {"edges": edges.tolist(), "counts": counts.astype(float).tolist(),
            "quantiles": np.quantile(x, QUANTILE_LEVELS).tolist()}


def _records(faults: dict[int, str] | None = None, start: int = 400, until: int = 600,
             seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    recs = [run(layer_order=NAMES)]
    for i in range(1, until):
        rec = {"kind": "step", "run_id": "r", "step": i, "time": T0 + i * DT, "loss": 2.0,
               "grad_norm": 1.0}
        if i % EVERY == 0:
            rec["grad_hist"] = {
                n: _hist(_sample(rng, i, k, (faults or {}).get(k) if i >= start else None))
                for k, n in enumerate(NAMES)}
        recs.append(schemas.parse_record(rec))
    return recs


def test_healthy_noisy_decaying_gradients_stay_quiet():
    for seed in range(3):
        assert feed(only("grad_distribution"), _records(until=1500, seed=seed)) == []


def test_each_kind_fires_on_its_layer_with_the_kind_in_evidence():
    faults = {1: "heavy_tail", 3: "collapsed", 4: "shifted"}
    found = feed(only("grad_distribution"), _records(faults))
    first = {}
    for f in found:
        first.setdefault(f.layer, f)
    assert set(first) == {NAMES[1], NAMES[3], NAMES[4]}
    assert {n: f.evidence["kind"] for n, f in first.items()} == {
        NAMES[1]: "heavy_tail", NAMES[3]: "collapsed", NAMES[4]: "shifted"}
    # The second reading after the fault: one odd reading is noise, two are a change.
    assert all(f.step == 400 + EVERY for f in first.values())
    tail = first[NAMES[1]]
    assert tail.severity.label == "warning" and tail.value > tail.threshold
    assert "heavy tails" in tail.message and tail.suggestions
    assert first[NAMES[3]].value < first[NAMES[3]].threshold


def test_needs_its_readings_before_judging():
    # A run that starts broken has no healthy history to compare with: nothing to say
    # until the minimum readings exist, and then its own (broken) baseline is normal.
    faults = {1: "heavy_tail"}
    assert feed(only("grad_distribution"), _records(faults, start=0, until=400)) == []
    # A fault right after the minimum readings is judged.
    found = feed(only("grad_distribution", dist_min_readings=4), _records(faults, start=50))
    assert found and found[0].step == 50 + EVERY


def test_a_single_odd_reading_is_not_a_change():
    recs = _records({1: "heavy_tail"}, start=400, until=401)  # one bad reading, at 400
    recs += _records(start=10_000, until=600, seed=0)[401:]    # then healthy again
    assert feed(only("grad_distribution"), recs) == []


def test_all_zero_gradient_is_left_to_dead_layer():
    recs = _records()
    for rec in recs[1:]:
        if rec.grad_quantiles is not None and rec.step >= 400:
            rec.grad_quantiles.values[2] = 0.0  # frozen parameter: dead_layer reports it
    assert feed(only("grad_distribution"), recs) == []


def test_records_without_quantiles_are_ignored():
    rec = schemas.parse_record({"kind": "step", "run_id": "r", "step": 1, "time": T0,
                                "grad_hist": {"w": {"edges": [0, 1], "counts": [3]}}})
    assert rec.grad_quantiles is None
    assert feed(only("grad_distribution"), [rec]) == []


def test_snapshot_restore_changes_nothing():
    recs = _records({1: "heavy_tail", 3: "collapsed"})
    assert_restore_equivalent(lambda: only("grad_distribution"), recs, cut=300)
    # after both fired: the restored episodes keep them from paging again
    assert_restore_silent(lambda: only("grad_distribution"), recs, cut=450)
