"""The GPU's NVML fields on /metrics (issue 34): one gauge per field per rank, throttle
reasons, ECC counts and remapped rows under closed-set labels, nothing for a key not sent."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from monitor_agent.metrics.names import RUN_METRICS, STEP_DURATION_BUCKETS
from monitor_agent.reads.exposition import Exposition
from monitor_agent.records import schemas
from monitor_agent.runs.run_state import RunState

READING = {"utilization": 0.97, "temperature_c": 83.0, "power_w": 690.0, "power_limit_w": 700.0,
           "sm_clock_mhz": 1410.0, "sm_clock_max_mhz": 1980.0, "throttle_reasons": 96.0,
           "throttle_thermal": 1.0, "throttle_power": 0.0, "throttle_hw_slowdown": 0.0,
           "ecc_corrected_volatile": 3.0, "ecc_corrected_aggregate": 120.0,
           "ecc_uncorrected_volatile": 2.0, "ecc_uncorrected_aggregate": 5.0,
           "remapped_rows_correctable": 1.0, "remapped_rows_uncorrectable": 1.0,
           "remapped_rows_pending": 1.0, "remapped_rows_failure": 0.0, "pcie_link_width": 8.0,
           "pcie_link_width_max": 16.0, "pcie_link_gen": 5.0, "pcie_link_gen_max": 5.0,
           "xid_count": 2.0, "xid_last": 79.0}


def _render(gpus: dict[int, dict]) -> str:
    run = RunState.new("r", now=0.0)
    for rank, gpu in gpus.items():
        rec = schemas.parse_record({"kind": "step", "run_id": "r", "step": 1, "time": 1.0,
                                    "rank": rank, "gpu": gpu})
        run.apply_step(rec, arrival=1.0, buckets=STEP_DURATION_BUCKETS)
    return Exposition(lambda: [run], CollectorRegistry()).render().decode()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith("training_gpu_")}


def test_each_field_is_a_gauge_per_rank_with_closed_labels():
    got = _samples(_render({0: READING, 1: {"temperature_c": 60.0}}))
    r0 = (("project", ""), ("rank", "0"), ("run_id", "r"))
    expect = {
        "training_gpu_sm_clock_mhz": 1410.0, "training_gpu_sm_clock_max_mhz": 1980.0,
        "training_gpu_power_limit_watts": 700.0, "training_gpu_row_remap_pending": 1.0,
        "training_gpu_row_remap_failure": 0.0, "training_gpu_pcie_link_width": 8.0,
        "training_gpu_pcie_link_width_max": 16.0, "training_gpu_pcie_link_generation": 5.0,
        "training_gpu_xid_events": 2.0, "training_gpu_last_xid": 79.0,
    }
    for name, value in expect.items():
        assert got[(name, r0)] == value, name
    assert got[("training_gpu_throttle", tuple(sorted((*r0, ("reason", "thermal")))))] == 1.0
    assert got[("training_gpu_throttle", tuple(sorted((*r0, ("reason", "power")))))] == 0.0
    assert got[("training_gpu_ecc_errors", tuple(sorted(
        (*r0, ("error", "uncorrected"), ("counter", "volatile")))))] == 2.0
    assert got[("training_gpu_remapped_rows", tuple(sorted((*r0, ("kind", "uncorrectable")))))] \
        == 1.0
    # rank 1 sent only its temperature: no other GPU series for it, and no lost-GPU series
    assert {k[0] for k in got if ("rank", "1") in k[1]} == {"training_gpu_temperature_celsius"}
    assert not any(k[0] == "training_gpu_lost" for k in got)


def test_the_families_are_declared_and_promtool_accepts_them():
    text = _render({0: READING})
    declared = {m.name for m in RUN_METRICS}
    used = set(re.findall(r"^(training_gpu_[a-z_]+)\{", text, flags=re.M))
    assert used and used <= declared
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    done = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                          capture_output=True, timeout=30)
    assert b"error" not in done.stdout.lower() + done.stderr.lower(), done.stdout + done.stderr
