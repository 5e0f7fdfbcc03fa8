"""dead_layer: zero gradient, no gradient or zero update for N steps, one finding per layer."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, layers, names, only, run, step

from monitor_agent.records.types import LayerTable


def _frozen_from(at: int, frozen: set[int], n: int = 6, until: int = 120) -> list:
    ns = names(n)
    recs = [run(layer_order=ns)]
    for i in range(1, until):
        upd = [0.0 if (i >= at and k in frozen) else 0.01 for k in range(n)]
        recs.append(step(i, layers=layers(ns, [0.05] * n, update=upd)))
    return recs


def test_zero_update_for_n_steps_fires_per_layer():
    found = feed(only("dead_layer", dead_steps=20), _frozen_from(40, {2, 3}))
    assert [(f.step, f.layer) for f in found] == [(59, "layers.2.weight"), (59, "layers.3.weight")]
    assert "zero update" in found[0].message and found[0].evidence["steps"] == 20


def test_grad_none_counts_as_dead():
    rows = {"a": {"grad_norm": 1.0, "update_norm": 0.1}, "b": {"grad_none": True}}
    recs = [step(i, layers=LayerTable.from_mapping(rows)) for i in range(1, 25)]
    found = feed(only("dead_layer", dead_steps=20), recs)
    assert [(f.step, f.layer) for f in found] == [(20, "b")] and "no gradient" in found[0].message


def test_the_count_restarts_when_the_layer_moves_again():
    ns = names(2)
    recs = [step(i, layers=layers(ns, [1, 1], update=[0.0 if i % 10 else 0.1, 0.1]))
            for i in range(1, 100)]
    assert feed(only("dead_layer", dead_steps=20), recs) == []


def test_findings_are_capped_per_record_and_the_rest_follow():
    found = feed(only("dead_layer", dead_steps=5, max_layer_findings=3),
                 _frozen_from(1, set(range(8)), n=10, until=9))
    assert [f.step for f in found] == [5, 5, 5, 6, 6, 6, 7, 7]
    assert len({f.layer for f in found}) == 8


def test_everything_dead_is_one_run_level_finding():
    found = feed(only("dead_layer", dead_steps=5), _frozen_from(1, set(range(6)), until=10))
    assert len(found) == 1 and found[0].layer is None


def test_skipped_overflow_steps_do_not_count():
    ns = names(2)
    recs = [step(i, loss_scale=1024.0, skipped=True, grad_norm=float("inf"),
                 layers=layers(ns, [1, 1], update=[0.0, 0.0])) for i in range(1, 40)]
    assert feed(only("dead_layer", dead_steps=5), recs) == []


def test_restore_mid_stream_changes_nothing():
    recs = _frozen_from(40, {1}, until=300)
    assert_restore_equivalent(lambda: only("dead_layer", dead_steps=20), recs, cut=50)
