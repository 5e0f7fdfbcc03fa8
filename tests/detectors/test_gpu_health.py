"""gpu_health (issue 34): a rank's GPU failing or slowing it, from the NVML fields the client
sends in each step's ``gpu`` object, named by rank, node and GPU."""

from __future__ import annotations

from dataclasses import replace

from synth_records import T0, assert_restore_equivalent, feed, noise, only, step

from monitor_agent.records.types import RunRecord, Severity

HEALTHY = {"utilization": 0.97, "temperature_c": 70.0, "sm_clock_mhz": 1980.0,
           "sm_clock_max_mhz": 1980.0, "throttle_thermal": 0.0, "throttle_power": 0.0,
           "throttle_hw_slowdown": 0.0, "ecc_uncorrected_volatile": 0.0,
           "ecc_uncorrected_aggregate": 3.0, "remapped_rows_pending": 0.0,
           "remapped_rows_failure": 0.0, "pcie_link_width": 16.0, "pcie_link_width_max": 16.0,
           "pcie_link_gen": 5.0, "pcie_link_gen_max": 5.0, "xid_count": 0.0}


def _runs(ranks: int) -> list:
    return [RunRecord(run_id="r", time=T0, rank=r, labels={"hostname": f"pod-{r}",
                                                           "node": f"gpu-node-{r}"},
                      hardware={"gpu_index": r, "gpu_uuid": f"GPU-000{r}",
                                "gpu_pci_bus_id": f"00000000:{r + 16:02X}:00.0"})
            for r in range(ranks)]


def _steps(n: int, ranks: int = 1, gpu=None, own=None) -> list:
    """``gpu(i, r)`` -> changes to the healthy reading; ``own(i, r)`` -> the rank's own
    (compute) time; synchronous DDP: step_time is the slowest own time plus a little."""
    recs = _runs(ranks)
    for i in range(1, n):
        times = {r: (own(i, r) if own else 0.1) * (1 + noise(i * 3 + r, 0.02))
                 for r in range(ranks)}
        step_time = max(times.values()) + 0.005
        for r in range(ranks):
            reading = {**HEALTHY, **(gpu(i, r) if gpu else {})}
            recs.append(step(i, rank=r, step_time=step_time, compute_time=times[r],
                             sync_wait_time=step_time - times[r], gpu=reading))
    return recs


def _conditions(found):
    return [(f.step, f.rank, f.severity, f.evidence["condition"]) for f in found]


def test_new_uncorrectable_ecc_errors_page_naming_the_rank_node_and_gpu():
    recs = _steps(200, ranks=2, gpu=lambda i, r: {"ecc_uncorrected_volatile": 2.0}
                  if r == 1 and i >= 50 else {})
    found = feed(only("gpu_health"), recs)
    assert _conditions(found) == [(50, 1, Severity.CRITICAL, "ecc_uncorrectable")]
    f = found[0]
    assert f.message.startswith("GPU 1 (PCI 00000000:11:00.0) on node gpu-node-1, rank 1: 2 new "
                                "uncorrectable ECC errors since step 1 (volatile count 0 -> 2)")
    assert (f.evidence["node"], f.evidence["gpu_uuid"]) == ("gpu-node-1", "GPU-0001")
    assert any("Drain the node" in s for s in f.suggestions)
    assert any("nvidia-smi -r" in s for s in f.suggestions)


def test_errors_from_before_the_run_are_not_news_and_each_new_one_is():
    recs = _steps(120, gpu=lambda i, r: {"ecc_uncorrected_aggregate": 7.0 + (i >= 60)
                                         + (i >= 90)})
    found = feed(only("gpu_health"), recs)
    assert [(f.step, f.value) for f in found] == [(60, 1.0), (90, 1.0)]


def test_a_pending_row_remap_a_failed_one_and_a_lost_gpu():
    recs = _steps(300, gpu=lambda i, r: (
        {"remapped_rows_pending": 1.0} if 20 <= i < 150 else
        {"remapped_rows_failure": 1.0} if 150 <= i < 200 else
        {"gpu_lost": 1.0} if i == 250 else {}))
    found = feed(only("gpu_health"), recs)
    assert _conditions(found) == [(20, 0, Severity.ERROR, "row_remap_pending"),
                                  (120, 0, Severity.ERROR, "row_remap_pending"),  # repeated
                                  (150, 0, Severity.CRITICAL, "row_remap_failure"),
                                  (250, 0, Severity.CRITICAL, "gpu_lost")]
    assert "pending: the faulty memory stays in use until the GPU is reset" in found[0].message


def test_xid_events_say_what_the_xid_means():
    recs = _steps(100, gpu=lambda i, r: {"xid_count": float((i >= 30) + (i >= 60)),
                                         **({"xid_last": 13.0} if i >= 30 else {}),
                                         **({"xid_last": 79.0} if i >= 60 else {})})
    found = feed(only("gpu_health"), recs)
    assert _conditions(found) == [(30, 0, Severity.ERROR, "xid"), (60, 0, Severity.CRITICAL, "xid")]
    assert "the last XID 79 (the GPU fell off the bus)" in found[1].message


def test_a_pcie_link_below_its_maximum_for_a_minute():
    # DT is 0.5 s: 120 steps is a minute
    narrow = _steps(400, gpu=lambda i, r: {"pcie_link_width": 8.0} if i >= 100 else {})
    found = feed(only("gpu_health"), narrow)
    assert _conditions(found)[0] == (220, 0, Severity.WARNING, "pcie_degraded")
    assert "x8 of x16 lanes" in found[0].message
    # an idle GPU's link drops its generation by design; a brief dip is no link trained down
    idle = _steps(400, gpu=lambda i, r: {"pcie_link_gen": 1.0, "utilization": 0.0})
    dips = _steps(400, gpu=lambda i, r: {"pcie_link_width": 8.0} if i % 50 == 0 else {})
    assert feed(only("gpu_health"), idle) == [] and feed(only("gpu_health"), dips) == []
    busy = _steps(400, gpu=lambda i, r: {"pcie_link_gen": 3.0})
    assert "generation 3 of 5 while 97% busy" in feed(only("gpu_health"), busy)[0].message


def test_a_throttling_gpu_that_slows_its_rank_is_named_with_the_reason():
    recs = _steps(120, ranks=4,
                  gpu=lambda i, r: {"throttle_thermal": 1.0, "sm_clock_mhz": 1410.0}
                  if r == 2 and i >= 40 else {},
                  own=lambda i, r: 0.12 if r == 2 and i >= 40 else 0.1)
    found = feed(only("gpu_health"), recs)
    assert found and {f.rank for f in found} == {2}
    f = found[0]
    assert f.severity == Severity.WARNING and f.evidence["throttle"] == ["thermal"]
    assert 40 <= f.step <= 60
    # named as soon as the median of its window is 5% slower: halfway into the throttle
    assert ("its GPU throttles (thermal) on 10 of its last 20 steps, SM clock 1410 of 1980 MHz, "
            "and the rank is slow with it: its own time 110 ms vs 100 ms on the other ranks "
            "(+10%)") in f.message


def test_throttling_without_a_slowdown_or_shared_by_every_rank_is_not_reported():
    no_slower = _steps(120, ranks=4, gpu=lambda i, r: {"throttle_thermal": 1.0} if r == 2 else {})
    shared = _steps(120, ranks=4, gpu=lambda i, r: {"throttle_power": 1.0},
                    own=lambda i, r: 0.12 if r == 2 else 0.1)
    slow_only = _steps(120, ranks=4, own=lambda i, r: 0.13 if r == 2 else 0.1)
    for recs in (no_slower, shared, slow_only):
        assert feed(only("gpu_health"), recs) == []


def test_a_single_rank_is_judged_against_its_own_unthrottled_steps():
    recs = _steps(200, gpu=lambda i, r: {"throttle_hw_slowdown": 1.0} if i >= 100 else {},
                  own=lambda i, r: 0.15 if i >= 100 else 0.1)
    found = feed(only("gpu_health"), recs)
    assert found and found[0].evidence["compared_with"] == "self"
    assert "(hardware slowdown)" in found[0].message and 100 <= found[0].step <= 120
    calm = _steps(200, gpu=lambda i, r: {"throttle_hw_slowdown": 1.0} if i >= 100 else {})
    assert feed(only("gpu_health"), calm) == []


def test_records_without_gpu_fields_and_a_restore_mid_run():
    assert feed(only("gpu_health"), [replace(r, gpu=None) if hasattr(r, "gpu") else r
                                     for r in _steps(100, ranks=2)]) == []
    recs = _steps(200, ranks=4,
                  gpu=lambda i, r: {"throttle_thermal": 1.0, "ecc_uncorrected_volatile":
                                    float(i >= 150)} if r == 2 and i >= 40 else {},
                  own=lambda i, r: 0.12 if r == 2 and i >= 40 else 0.1)
    assert_restore_equivalent(lambda: only("gpu_health"), recs, cut=300)


def test_two_problems_on_one_step_are_one_finding_the_worse_first():
    recs = _steps(40, gpu=lambda i, r: {"ecc_uncorrected_volatile": 2.0,
                                        "remapped_rows_pending": 1.0} if i >= 10 else {})
    found = feed(only("gpu_health"), recs)
    assert _conditions(found) == [(10, 0, Severity.CRITICAL, "ecc_uncorrectable")]
    f = found[0]
    assert f.evidence["conditions"] == ["ecc_uncorrectable", "row_remap_pending"]
    assert ("2 new uncorrectable ECC errors since step 1 (volatile count 0 -> 2): its memory "
            "returned data it could not repair; a row remap is pending") in f.message
    assert len(f.suggestions) == len(set(f.suggestions))
