"""dead_units: a ReLU module's dead-unit fraction high, or far above its early level."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, noise, only, run, step

from monitor_agent.records.types import ActivationTable


def acts(dead: dict[str, float | None]) -> ActivationTable:
    return ActivationTable.from_mapping({
        name: {"mean": 0.3, "std": 0.5, "max_abs": 3.0, "zero_frac": 0.5, "dead_frac": d,
               "nonfinite": 0.0} for name, d in dead.items()})


def _run(fault_at: int | None, level: float = 0.9, until: int = 60, every: int = 1) -> list:
    recs = [run()]
    for i in range(1, until):
        if i % every:
            recs.append(step(i))  # an unmonitored step: no activations
            continue
        d = 0.05 + abs(noise(i, 0.03))
        hurt = fault_at is not None and i >= fault_at
        recs.append(step(i, activations=acts({"mlp.1": level if hurt else d, "mlp.3": d,
                                              "mlp.gelu": None})))
    return recs


def test_healthy_is_quiet_and_gelu_is_ignored():
    assert feed(only("dead_units"), _run(None, until=300)) == []


def test_killed_units_fire_after_the_persistence_readings():
    found = feed(only("dead_units", dead_unit_readings=3), _run(30))
    assert [(f.step, f.layer) for f in found] == [(32, "mlp.1")]
    f = found[0]
    assert f.severity.label == "warning" and f.value == 0.9 and "90% of units dead" in f.message
    assert 0.0 < f.evidence["early_dead_frac"] < 0.1 and f.suggestions


def test_a_rise_far_above_the_early_level_fires_below_the_absolute_limit():
    found = feed(only("dead_units"), _run(30, level=0.4))
    assert [f.layer for f in found] == ["mlp.1"] and found[0].threshold < 0.5


def test_a_single_dead_reading_is_not_enough():
    recs = _run(None, until=40)
    recs[20] = step(20, activations=acts({"mlp.1": 0.95, "mlp.3": 0.05}))
    assert feed(only("dead_units"), recs) == []


def test_readings_count_not_steps():
    found = feed(only("dead_units"), _run(100, until=200, every=25))
    assert [f.step for f in found] == [150]  # readings at 100, 125, 150


def test_snapshot_restore_mid_stream():
    assert_restore_equivalent(lambda: only("dead_units"), _run(30, until=80), cut=31)
