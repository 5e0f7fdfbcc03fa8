"""input_bound: every rank waits on its data loader for a large share of the step."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, noise, only, step


def _run(n: int, share: dict[int, float], fed_from: int | None = None, ranks: int = 4) -> list:
    """``share[r]``: rank r's data share of a 100 ms step; from ``fed_from`` on, a loader
    that keeps up (1% of the step)."""
    recs = []
    for i in range(1, n):
        for r in range(ranks):
            s = share.get(r, 0.01) if fed_from is None or i < fed_from else 0.01
            s *= 1 + noise(i * 5 + r, 0.1)
            recs.append(step(i, rank=r, step_time=0.1, data_time=0.1 * s))
    return recs


def test_every_rank_waiting_on_data_is_one_warning_for_the_run():
    found = feed(only("input_bound"), _run(60, {r: 0.6 for r in range(4)}))
    assert found and found[0].type == "input_bound"
    assert 25 <= found[0].step <= 30          # the first full window after the warm-up
    assert "input-bound: every rank waits on its data loader for 6" in found[0].message
    assert found[0].evidence["ranks"] == 4
    assert any("num_workers" in s for s in found[0].suggestions)
    assert any("pin_memory" in s and "prefetch_factor" in s for s in found[0].suggestions)
    # once per repeat_every_steps for the run, not once per rank
    assert len({f.step for f in found}) == len(found)


def test_the_findings_stop_when_the_loader_keeps_up_again():
    found = feed(only("input_bound"), _run(400, {r: 0.6 for r in range(4)}, fed_from=150))
    assert found and max(f.step for f in found) < 150 + 20


def test_one_slow_rank_is_a_straggler_not_an_input_bound_run():
    assert feed(only("input_bound"), _run(200, {2: 0.9})) == []
    assert feed(only("input_bound"), _run(200, {r: 0.9 for r in range(4)}))


def test_quiet_below_the_share():
    assert feed(only("input_bound"), _run(200, {r: 0.3 for r in range(4)})) == []
    assert feed(only("input_bound"), _run(200, {r: 0.55 for r in range(4)}))


def test_restore_mid_stream_changes_nothing():
    recs = _run(200, {r: 0.6 for r in range(4)})
    assert any(f.step > 40 for f in feed(only("input_bound"), recs))  # findings after the cut
    assert_restore_equivalent(lambda: only("input_bound"), recs, cut=150)
