"""straggler: one rank's own compute time far above the other ranks'."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, noise, only, step


def _ddp(n: int, slow_from: int, ranks: int = 2, with_compute: bool = True) -> list:
    recs = []
    for i in range(1, n):
        for r in range(ranks):
            own = 0.02 * (1 + noise(i + r, 0.2)) + (0.06 if r == 1 and i >= slow_from else 0.0)
            wait = 0.085 - own
            recs.append(step(i, rank=r, step_time=0.085, sync_wait_time=wait,
                             compute_time=own if with_compute else None))
    return recs


def test_the_slow_rank_is_named():
    found = feed(only("straggler"), _ddp(400, 300))
    assert found and {f.rank for f in found} == {1}
    assert 300 <= found[0].step <= 315 and found[0].evidence["ratio"] > 2


def test_without_compute_time_step_minus_sync_wait_is_used():
    found = feed(only("straggler"), _ddp(400, 300, with_compute=False))
    assert found and found[0].rank == 1


def test_quiet_with_balanced_ranks_or_a_single_rank():
    assert feed(only("straggler"), _ddp(400, 10**9, ranks=4)) == []
    assert feed(only("straggler"), _ddp(400, 300, ranks=1)) == []


def test_restore_mid_stream_changes_nothing():
    assert_restore_equivalent(lambda: only("straggler"), _ddp(500, 300), cut=550)
