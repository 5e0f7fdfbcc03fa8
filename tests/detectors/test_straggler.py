"""straggler: one rank's own compute time far above the other ranks'."""

from __future__ import annotations

from dataclasses import replace

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


def _breakdown(n: int, slow_rank: int | None, slow: str, ranks: int = 4) -> list:
    """Synchronous DDP: every rank's step_time is the slowest rank's own time plus the
    all-reduce; only the breakdown (data, compute, wait) differs between ranks."""
    recs = []
    for i in range(1, n):
        own = {r: (0.012 * (1 + noise(i + r, 0.2)), 0.05 * (1 + noise(i * 7 + r, 0.1)))
               for r in range(ranks)}
        if slow_rank is not None and slow == "data":
            own[slow_rank] = (0.41, own[slow_rank][1])
        if slow_rank is not None and slow == "compute":
            own[slow_rank] = (own[slow_rank][0], 0.3)
        step_time = max(d + c for d, c in own.values()) + 0.005
        for r, (d, c) in own.items():
            recs.append(step(i, rank=r, step_time=step_time, data_time=d, compute_time=c,
                             sync_wait_time=step_time - d - c))
    return recs


def test_slow_data_loading_is_named_as_the_cause():
    found = feed(only("straggler"), _breakdown(60, 2, "data"))
    assert found and {f.rank for f in found} == {2}
    assert found[0].evidence["cause"] == "data"
    assert "rank 2 is the straggler: its data loading takes 410 ms" in found[0].message
    assert "waiting for it in the all-reduce" in found[0].message
    assert any("num_workers" in s for s in found[0].suggestions)


def test_slow_own_compute_is_named_as_the_cause():
    found = feed(only("straggler"), _breakdown(60, 1, "compute"))
    assert found and {f.rank for f in found} == {1}
    assert found[0].evidence["cause"] == "compute"
    assert "its own compute takes 300 ms" in found[0].message


def test_a_rank_slow_in_the_all_reduce_itself_is_named_as_such():
    recs = []
    for i in range(1, 60):
        for r in range(4):
            wait = 0.3 if r == 3 else 0.01  # its own work as fast as the others'
            recs.append(step(i, rank=r, step_time=0.06 + wait, data_time=0.01,
                             compute_time=0.05 * (1 + noise(i + r, 0.1)), sync_wait_time=wait))
    found = feed(only("straggler"), recs)
    assert found and {f.rank for f in found} == {3}
    assert found[0].evidence["cause"] == "collective"
    assert "waits 300 ms in the gradient all-reduce" in found[0].message


def test_balanced_breakdowns_name_no_one():
    assert feed(only("straggler"), _breakdown(60, None, "data")) == []
    assert feed(only("straggler"), _breakdown(60, 0, "data"))[0].evidence["cause"] == "data"


def test_a_slow_loader_is_found_from_data_time_alone():
    """A CUDA run: the client sends data_time but no compute or wait (launch times)."""
    recs = [replace(r, compute_time=None, sync_wait_time=None)
            for r in _breakdown(60, 2, "data")]
    found = feed(only("straggler"), recs)
    assert found and {f.rank for f in found} == {2}
    assert found[0].evidence["cause"] == "data"
    assert "its data loading takes 410 ms" in found[0].message


def _throttled(recs: list, ranks: set[int], key: str = "throttle_thermal") -> list:
    """The same records with the NVML throttle flags the client sends in ``gpu``."""
    return [replace(r, gpu={"throttle_thermal": 0.0, "throttle_power": 0.0,
                            "throttle_hw_slowdown": 0.0, **({key: 1.0} if r.rank in ranks else {}),
                            "sm_clock_mhz": 1980.0})
            for r in recs]


def test_a_slow_compute_rank_whose_gpu_throttles_names_the_throttle():
    found = feed(only("straggler"), _throttled(_breakdown(60, 1, "compute"), {1}))
    assert found and {f.rank for f in found} == {1}
    f = found[0]
    assert (f.evidence["cause"], f.evidence["throttle"]) == ("gpu_throttle", "thermal")
    assert "its own compute takes 300 ms" in f.message
    assert "its GPU throttles (thermal) on 20 of its last 20 steps, 0 of " in f.message
    assert any("cooling" in s for s in f.suggestions)


def test_a_throttle_every_rank_shares_is_not_the_cause():
    found = feed(only("straggler"), _throttled(_breakdown(60, 1, "compute"), {0, 1, 2, 3},
                                               key="throttle_power"))
    assert found and found[0].evidence["cause"] == "compute" and "throttle" not in found[0].evidence
    # nor is a throttle on a rank whose own compute is not what is slow
    found = feed(only("straggler"), _throttled(_breakdown(60, 2, "data"), {2}))
    assert found and found[0].evidence["cause"] == "data"
