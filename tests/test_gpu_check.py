"""bench/gpu_check.py, the one command for a device (issue 34), keeps working on a machine
without a GPU: it says what it skips and why, still pages a NaN through a real sidecar, and
its report reads a GPU run's figures against their targets (a recorded H100 run's here)."""

from __future__ import annotations

import json

from bench import gpu_check


def test_on_a_cpu_machine_it_skips_what_needs_a_gpu_and_pages_a_nan(tmp_path, capsys):
    out = tmp_path / "check.json"
    # In this process (torch is imported already); CI's machine has no GPU, which is the point.
    assert gpu_check.main(["--json", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = [ln for ln in printed.splitlines() if " : " in ln or ln.startswith("nan")]
    skipped = {ln.split(":")[0].strip() for ln in lines if "skipped: needs a CUDA GPU" in ln}
    assert skipped == {"overhead", "syncs", "memory", "split", "nvml"}, printed
    nan = json.loads(out.read_text())["nan"]
    assert nan["paged"] and nan["alertname"] == "TrainingNanInf", nan
    # how soon is a figure bench/gpu_check.py reports; here only that it was measured
    assert "nan" in nan["message"].lower() and nan["seconds_after_log_step"] >= 0


# What the first H100 80GB HBM3 run printed (abridged): the report's FAIL and ERROR paths.
H100 = {
    "overhead": {"plain_s": 0.04344, "monitored_s": 0.04845, "ratio": 1.1152,
                 "paired_ratio_median": 1.1082, "paired_ratio_range": [1.0891, 1.1569],
                 "rounds": 8, "steps_per_round": 25, "tokens_per_step": 8192,
                 "model_params": 124439808,
                 "memory": {"record": {"allocated_bytes": 3573274624, "reserved_bytes":
                                       13228834816, "peak_allocated_bytes": 11530154496,
                                       "total_bytes": 85017493504},
                            "torch": {"allocated_bytes": 3573274112, "reserved_bytes":
                                      13228834816, "peak_allocated_bytes": 11530154496,
                                      "total_bytes": 85017493504}}},
    "syncs": {"default": {"per_step": 0.0, "steps": 55, "where": {},
                          "background_thread_syncs": 56},
              "guard_fused": {"per_step": 0.0, "steps": 55, "where": {},
                              "background_thread_syncs": 54},
              "guard_foreach": {"per_step": 1.0, "steps": 55,
                                "where": {"_guard.py:156 before_step": 55},
                                "background_thread_syncs": 52}},
    "split": {"simulated_all_reduce_ms": 20.0, "steps": 40, "split_steps": 37,
              "event_wait_s": 0.019926, "reference_wait_s": 0.020187,
              "event_compute_s": 0.02395, "reference_compute_s": 0.04941,
              "wait_error": 0.0129, "compute_error": 0.5153},
    "nvml": {"reading": {"temperature_c": 52.0, "sm_clock_mhz": 1980.0, "xid_count": 0.0},
             "first_read_s": 0.002, "read_s": 0.0014, "unsupported": ["retired_pages"],
             "describe": {"gpu_index": 0, "gpu_pci_bus_id": "00000000:00:06.0"},
             "torch_uuid": "e7044d61-4974-185d-d533-185762f73ed0"},
    "nan": {"error": "ModuleNotFoundError: No module named 'httptools'"},
}


def test_the_report_sets_each_figure_against_its_target():
    lines = gpu_check.report(H100, cuda=True)
    text = "\n".join(lines)
    by = {ln.split(":")[0].strip(): ln for ln in lines}
    assert "ratio 1.1152" in by["overhead"] and by["overhead"].endswith("FAIL")
    assert "syncs    : guard_foreach        1.00 per step" in text
    assert [ln.endswith("PASS") for ln in lines if ln.startswith("syncs")] == [True] * 3
    assert "peak in the last record == max_memory_allocated: True   PASS" in text
    assert "(1.3%)" in by["split"] and "(51.5%)" in by["split"] and by["split"].endswith("FAIL")
    assert "not given by this driver/GPU: retired_pages" in text
    assert "nan      : ERROR ModuleNotFoundError: No module named 'httptools'" in text


# The ablation and profile sections of a later H100 run (abridged).
PARTS = {
    "ablation": {"host_issue_s": 0.03503, "step_s": 0.04799, "batch": 8, "seq": 1024,
                 "plain_s": 0.04329, "rounds": 4, "steps_per_round": 25,
                 "ratio": {"plain": 1.0, "default": 1.0148, "finite_full": 1.08,
                           "no_finite_flags": 1.0294}},
    "profile": {"steps": 10,
                "plain": {"device_ms": 43.29, "kernels": 862.0, "host_issue_ms": 32.25},
                "monitored": {"device_ms": 45.41, "kernels": 991.0, "host_issue_ms": 44.66},
                "added_us": {"reduce_kernel<512, 1, ReduceOp<float>": 597.9, "Memset": 45.1}},
}


def test_the_report_says_what_each_part_costs_and_where_the_device_time_went():
    lines = gpu_check.report(PARTS, cuda=True)
    by = [ln for ln in lines if ln.startswith(("ablation", "profile"))]
    assert "the host issues one in 35.03 ms of its 47.99 ms (GPU-bound)" in by[0]
    assert "default 1.0148, finite_full 1.0800, no_finite_flags 1.0294" in by[1]
    assert "plain     device 43.29 ms/step in 862 kernels" in by[2]
    assert "monitored device 45.41 ms/step in 991 kernels" in by[3]
    assert "reduce_kernel<512, 1, ReduceOp<float> +598, Memset +45" in by[4]


# The host section of an H200 run (the same arms, measured before the section was one).
HOST = {"host": {"plain_s": 0.03958, "rounds": 14, "steps_per_round": 25,
                 "ratio": {"host_300us": 0.9994, "host_1000us": 1.0000, "host_3000us": 0.9995,
                           "gil_thread": 0.9994, "monitored": 1.0086}}}


def test_the_report_says_whether_host_time_is_on_the_step():
    line = next(ln for ln in gpu_check.report(HOST, cuda=True) if ln.startswith("host"))
    assert "plain step 39.58 ms" in line
    assert "300us 0.9994, 1000us 1.0000, 3000us 0.9995, gil_thread 0.9994, monitored 1.0086" \
        in line
    assert "(14 rounds x 25 steps; 1.0: hidden behind the device)" in line
