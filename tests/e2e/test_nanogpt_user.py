"""What a new user meets instrumenting a nanoGPT-style script from the README alone: a
run id reused, a NaN to the end, an LR jump, ``grad_clip = 0.0``, progress from
``max_iters``, and the script's own scalar.

``nanogpt_user_train.py`` is written as karpathy's nanoGPT is (config globals, ``--key=val``
overrides, ``grad_clip = 0.0`` for "disabled", ``max_iters``), with the README's lines added.
Each test runs it as a user would, a subprocess against a real sidecar, and checks what
the user sees: the sidecar's answers and the script's own output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("nanogpt_user_train.py")


def train(sidecar, tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MONITOR_AGENT_URL": sidecar.url, "OMP_NUM_THREADS": "1",
           "MONITOR_AGENT_SPOOL_DIR": str(tmp_path / "spool"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "client"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), *overrides], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_grad_clip_zero_is_no_clipping_and_total_steps_gives_progress(sidecar, tmp_path):
    proc = train(sidecar, tmp_path, "--run_id=nano-plain")
    assert "monitor_client" not in proc.stderr, proc.stderr  # nothing to warn about
    records = sidecar.records("nano-plain")
    run = next(r for r in records if r["kind"] == "run")
    assert run["config"]["grad_clip"] == 0.0 and run["config"]["total_steps"] == 120
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 120 and all(r.get("clip_threshold") is None for r in steps)
    # the script's own scalar, passed as a keyword as a wandb.log user would, is charted
    assert all(r["metrics"]["iter_ms"] > 0 for r in steps)
    def charted() -> dict:  # the chart history folds on its own thread
        series = httpx.get(f"{sidecar.url}/v1/runs/nano-plain/series", timeout=10).json()
        assert series.get("user_names"), series
        return series

    series = eventually(charted, timeout=15, interval=0.1, what="the script's scalar charted")
    assert series["user_names"] == ["iter_ms"] and series["user_scalars"]["iter_ms"]["steps"]
    detail = httpx.get(f"{sidecar.url}/v1/runs/nano-plain", timeout=10).json()
    assert detail["ranks"]["0"]["progress_ratio"] == 1.0
    assert detail["ranks"]["0"]["progress_basis"] == "steps"


def test_running_the_script_again_with_its_run_id_keeps_both_runs(sidecar, tmp_path):
    # A fixed run id, re-run as users do (a relaunch, a tweak): nothing silently dropped.
    first = train(sidecar, tmp_path, "--run_id=gpt-exp-1", "--max_iters=40")
    assert "already exists" not in first.stderr
    second = train(sidecar, tmp_path, "--run_id=gpt-exp-1", "--max_iters=30", "--seed=7")
    assert ("run gpt-exp-1 already exists on the sidecar; this is attempt 2 (a new run "
            "reusing the id; attempt 1 kept)") in second.stderr, second.stderr
    attempts = httpx.get(f"{sidecar.url}/v1/runs/gpt-exp-1", timeout=10).json()["attempts"]
    assert [a["kind"] for a in attempts] == ["first", "restarted"]
    kept = httpx.get(f"{sidecar.url}/v1/runs/gpt-exp-1/records",
                     params={"attempt": 1, "kind": "step", "limit": 1000}, timeout=10).json()
    assert len(kept["records"]) == 40  # the first run, readable as attempt 1
    current = [r for r in sidecar.records("gpt-exp-1") if r["kind"] == "step"]
    assert len(current) == 30  # the current history is the new run alone


def test_a_loss_nan_to_the_end_ends_the_run_unhealthy_and_says_where_it_was_made(
        sidecar, tmp_path):
    train(sidecar, tmp_path, "--run_id=nano-nan", "--nan_from=80")
    [listed] = [r for r in httpx.get(f"{sidecar.url}/v1/runs", timeout=10).json()["runs"]
                if r["run_id"] == "nano-nan"]
    assert listed["status"] == "completed"
    assert listed["verdict"]["state"] == "unhealthy"
    assert "NaN since step 80" in listed["verdict"]["text"], listed["verdict"]
    metrics = httpx.get(f"{sidecar.url}/metrics", timeout=10).text
    assert 'run_id="nano-nan"' in metrics and 'verdict="unhealthy_nan_inf"' in metrics
    findings = httpx.get(f"{sidecar.url}/v1/runs/nano-nan/findings", timeout=10).json()
    [first_nan] = [f for f in findings["findings"] if f["type"] == "nan_inf" and f["step"] == 80]
    # every sampled module output was finite at step 80: the loss arithmetic made the NaN
    # (or unsampled features of the last output: the default check says so)
    assert "every module output finite where sampled" in first_nan["message"]
    assert "the NaN is made in the loss computation" in first_nan["message"]


def test_an_lr_jump_off_the_schedule_is_named_and_the_pages_cite_it(sidecar, tmp_path):
    train(sidecar, tmp_path, "--run_id=nano-lr", "--lr_jump_at=60", "--lr_jump=1000")
    findings = httpx.get(f"{sidecar.url}/v1/runs/nano-lr/findings", timeout=10).json()
    jumps = [f for f in findings["findings"] if f["type"] == "lr_jump"]
    assert [f["step"] for f in jumps] == [60]
    # x1000 on top of a cosine schedule that was decaying ~1% a step: about x990 off it
    said = re.match(r"LR x(\d+) at step 60: .* outside the run's schedule", jumps[0]["message"])
    assert said and 900 <= int(said.group(1)) <= 1000, jumps[0]["message"]
    # the pages that follow (the run blows up) name it as their likely cause
    pages = [f for f in findings["findings"] if f["severity"] in ("error", "critical")]
    assert {f["type"] for f in pages} >= {"divergence"} or {f["type"] for f in pages} >= {
        "grad_explosion"}, findings
    cause = f"likely cause: LR x{said.group(1)} at step 60"
    assert all(cause in f["message"] for f in pages), pages


