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


def _sparse(dead_from: int, dead_until: int = 10**9, every: int = 25, until: int = 400) -> list:
    """Layer statistics every ``every`` steps (the client's ``layer_stats_every``), the
    steps between without them; layer 1's gradient is all zeros from ``dead_from``."""
    ns = names(3)
    recs = [run(layer_order=ns)]
    for i in range(1, until):
        if i % every:
            recs.append(step(i))
            continue
        dead = dead_from <= i < dead_until
        recs.append(step(i, layers=layers(ns, [0.05, 0.0 if dead else 0.05, 0.05],
                                          update=[0.01, 0.0 if dead else 0.01, 0.01])))
    return recs


def test_steps_between_layer_statistics_count_as_steps_not_records():
    """Stranger report 2, problem 4: statistics every 25 steps made 20 "steps" 20 records
    (500 steps), and the message said 20 where 475 had passed. Dead from step 201: measured
    dead at 225 and 250, 26 steps, so it fires at 250 and says so (and again a
    ``repeat_every_steps`` later, with the steps grown)."""
    found = feed(only("dead_layer", dead_steps=20), _sparse(201))
    assert [(f.step, f.layer) for f in found] == [(250, "layers.1.weight"),
                                                 (350, "layers.1.weight")]
    f = found[0]
    assert f.message == ("layers.1.weight got an all-zero gradient at every measured step "
                         "since step 225 (26 steps)")
    assert f.evidence["steps"] == 26 and f.evidence["since_step"] == 225 and f.value == 26
    assert "since step 225 (126 steps)" in found[1].message


def test_a_single_measured_zero_is_one_step_not_a_stretch():
    # dead on the one measured step 225 only (alive again at 250): 1 step, whatever the
    # 24 unmeasured steps on either side of it did
    assert feed(only("dead_layer", dead_steps=2), _sparse(201, dead_until=226)) == []
    (f,) = feed(only("dead_layer", dead_steps=1), _sparse(201, dead_until=226))
    assert f.step == 225 and f.evidence["steps"] == 1


def test_everything_dead_says_the_steps_it_shares():
    ns = names(2)
    recs = [run(layer_order=ns)] + [
        step(i, layers=layers(ns, [1, 1], update=[0.0, 0.0]) if i % 25 == 0 else None)
        for i in range(1, 100)]
    (f,) = feed(only("dead_layer", dead_steps=20), recs)
    assert f.step == 50 and f.layer is None and f.evidence["steps"] == 26
    assert "since step 25 (26 steps" in f.message


def test_restore_mid_stream_changes_nothing():
    recs = _frozen_from(40, {1}, until=300)
    assert_restore_equivalent(lambda: only("dead_layer", dead_steps=20), recs, cut=50)
