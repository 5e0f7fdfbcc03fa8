"""The example trainer the README demo runs: its flags, faults and exit status."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(url, tmp_path, *flags):
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}"}
    cmd = [sys.executable, str(REPO / "examples" / "train_gpt.py"), "--url", url,
           "--spool-dir", str(tmp_path), "--threads", "1", "--peak-flops", "1e11", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_nan_fault_stops_training_and_ends_failed_on_the_real_sidecar(sidecar, tmp_path):
    proc = _run(sidecar.url, tmp_path, "--run-id", "gpt-nan", "--steps", "40", "--inject",
                "nan", "--inject-step", "15", "--progress", "--quiet")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("step 1/40 loss ") and all(ln.startswith("step ") for ln in lines)
    records = sidecar.records("gpt-nan", since_step=-1)
    steps = {r["step"]: r for r in records if r["kind"] == "step"}
    assert sorted(steps) == list(range(1, 25))  # 10 non-finite steps, then it stops
    assert isinstance(steps[14]["loss"], float) and steps[15]["loss"] == "NaN"
    assert steps[1]["mfu"] > 0 and steps[1]["layers"]
    end = next(r for r in records if r["kind"] == "end")
    assert end["status"] == "failed" and "non-finite" in end["error"]


def test_frozen_layer_fault_zeroes_that_layers_update(receiver, tmp_path):
    proc = _run(receiver.url, tmp_path, "--run-id", "gpt-frozen", "--steps", "30", "--inject",
                "frozen-layer", "--inject-step", "12", "--layer-stats-every", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr
    steps = {r["step"]: r for r in receiver.of_kind("step")}
    frozen = "blocks.1.mlp_fc.weight"
    assert steps[5]["layers"][frozen]["update_norm"] > 0
    assert all(steps[s]["layers"][frozen]["update_norm"] == 0.0 for s in range(12, 31))
    assert steps[20]["layers"][frozen]["grad_norm"] > 0  # still gets gradients
    assert receiver.of_kind("end")[0]["status"] == "completed"
    (ev,) = receiver.of_kind("eval")
    assert ev["step"] == 30
    # Per-module eval loss: the stdlib modules the validation split is cut from.
    per_module = {k: v for k, v in ev["metrics"].items() if k.startswith("loss/")}
    assert len(per_module) >= 2 and all(0 < v < 10 for v in per_module.values())
