"""Scripts of shapes the quickstart does not show, instrumented from docs/client.md alone
and run as a user runs them (a subprocess against a real sidecar) (issue 45 points 1, 2):

* a DCGAN (``dcgan_user_train.py``): two models, two optimizers, each watched by name;
  without names the second ``watch()`` is refused, loudly;
* the float64 LBFGS time-series example (``lbfgs_user_train.py``): a closure step, whose
  float64 statistics once raised inside ``optimizer.step()``;
* a loop that updates its parameters by hand (``by_hand_user_train.py``): no optimizer;
* a classifier numbered per epoch (``epochs_user_train.py``): ``enumerate(loader)`` as the
  step, ``get_last_lr()``'s list as the LR; with a sparse embedding table, logged every
  third batch with ``grad_clip=``.

Each healthy run trains to its end, every step stored with its statistics, nothing warned
about in the script's output and no page on the sidecar.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent


def _run(sidecar, tmp_path: Path, script: str, *args: str,
         returncode: int = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MONITOR_AGENT_URL": sidecar.url, "OMP_NUM_THREADS": "1",
           "MONITOR_AGENT_SPOOL_DIR": str(tmp_path / "spool"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "client"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == returncode, proc.stderr[-3000:]
    return proc


def _no_page(sidecar, run_id: str) -> None:
    found = httpx.get(f"{sidecar.url}/v1/runs/{run_id}/findings", timeout=10).json()["findings"]
    assert not [f for f in found if f["severity"] == "critical"], found


def test_a_dcgan_is_two_models_each_under_its_name(sidecar, tmp_path):
    proc = _run(sidecar, tmp_path, "dcgan_user_train.py", "--run_id=dcgan", "--niter=40")
    assert "monitor_client" not in proc.stderr, proc.stderr
    records = sidecar.records("dcgan")
    run = next(r for r in records if r["kind"] == "run")
    assert [(m["name"], m["class"]) for m in run["model"]["models"]] == [
        ("D", "Discriminator"), ("G", "Generator")]
    assert run["config"]["loss_kind"] == "gan"
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 40
    for r in steps:  # stored by the sidecar with each model's own numbers
        d, g = r["models"]["D"]["grad_norm"], r["models"]["G"]["grad_norm"]
        assert d > 0 and g > 0 and math.isclose(r["grad_norm"], math.hypot(d, g), rel_tol=1e-6)
    layered = [r for r in steps if r.get("layers")]
    assert layered and {n.split(".")[0] for n in layered[0]["layers"]} == {"D", "G"}
    _no_page(sidecar, "dcgan")


def test_a_dcgan_watched_without_names_is_refused_at_once(sidecar, tmp_path):
    proc = _run(sidecar, tmp_path, "dcgan_user_train.py", "--run_id=dcgan-unnamed",
                "--unnamed", returncode=3)
    assert "refused: watch(): this run already watches a Discriminator" in proc.stderr
    assert "give each a name" in proc.stderr


def test_a_float64_lbfgs_closure_trains_and_is_measured(sidecar, tmp_path):
    proc = _run(sidecar, tmp_path, "lbfgs_user_train.py", "--run_id=lbfgs", "--steps=6")
    assert "monitor_client" not in proc.stderr, proc.stderr
    assert proc.stdout.count("test loss") == 6
    steps = [r for r in sidecar.records("lbfgs") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 7))
    assert all(r["grad_norm"] > 0 and r["lr"] == 0.8 and not r.get("skipped") for r in steps)
    assert steps[0]["layers"]["lstm1.weight_ih"]["update_norm"] > 0
    _no_page(sidecar, "lbfgs")


def test_a_loop_without_an_optimizer_is_measured(sidecar, tmp_path):
    proc = _run(sidecar, tmp_path, "by_hand_user_train.py", "--run_id=by-hand", "--steps=120")
    assert "monitor_client" not in proc.stderr, proc.stderr
    steps = [r for r in sidecar.records("by-hand") if r["kind"] == "step"]
    assert len(steps) == 120 and not any(r.get("skipped") for r in steps)
    assert all(r["grad_norm"] > 0 for r in steps)
    layered = [r for r in steps if r.get("layers")]
    assert layered and all(r["update_norm"] > 0 and r["param_norm"] > 0 for r in layered)
    # the update is lr x the gradient it was made from: the update ratio is the sidecar's to judge
    first = steps[0]
    assert math.isclose(first["update_norm"], 1e-6 * first["grad_norm"], rel_tol=1e-3)
    _no_page(sidecar, "by-hand")


def test_steps_numbered_per_epoch_are_all_kept(sidecar, tmp_path):
    """``enumerate(loader)`` as the step: every epoch's steps go back to 0, which the
    sidecar would take for resends of the first epoch's and drop (they were: 10 of 30
    stored). The client counts on and says so once; every step and eval is stored, each
    eval after its epoch's last step, and the LR given as ``get_last_lr()`` is the first
    group's."""
    proc = _run(sidecar, tmp_path, "epochs_user_train.py", "--run_id=epochs")
    assert proc.stderr.count("steps count optimizer steps over the whole run") == 1
    steps = [r for r in sidecar.records("epochs") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(30))
    assert [r["lr"] for r in steps[::10]] == [0.05, 0.025, 0.0125]
    evals = [r for r in sidecar.records("epochs") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [9, 19, 29]
    _no_page(sidecar, "epochs")


def test_a_sparse_table_logged_every_few_steps_is_measured_and_clipped(sidecar, tmp_path):
    """A sparse embedding table, ``grad_clip=``, and ``log_step`` every third batch: each
    record carries its gradient norm (the sparse gradient once failed every measurement),
    nothing is warned about but the per-epoch numbering."""
    proc = _run(sidecar, tmp_path, "epochs_user_train.py", "--run_id=sparse-every",
                "--sparse", "--every=3")
    assert "failed" not in proc.stderr, proc.stderr
    steps = [r for r in sidecar.records("sparse-every") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [0, 3, 6, 9, 10, 13, 16, 19, 20, 23, 26, 29]
    assert all(r["grad_norm"] > 0 and r["clip_threshold"] == 1.0 for r in steps)
    assert any("table.weight" in (r.get("layers") or {}) for r in steps)
    _no_page(sidecar, "sparse-every")
