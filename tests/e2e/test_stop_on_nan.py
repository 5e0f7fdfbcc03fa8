"""The proof of issue 8's loop: a real training run with an injected NaN, a real sidecar with
a stop rule, and the run stops itself soon after the page (a step or two on a quiet machine; the
page names the step it really stopped at): through the plain
loop (``train_gpt.py``), the HuggingFace Trainer and Lightning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]
INJECT = 12
# nan_inf fires at the first NaN step and again when it persisted 3 steps: the stop rule
# acts on that second finding (action_after: 2), i.e. at step INJECT + 2.
ACTION_STEP = INJECT + 2
STEPS = 60


def _run(script: str, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(REPO / "examples" / script), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)


def _check_stopped(sc, pd_receiver, run_id: str, proc) -> int:
    assert proc.returncode == 3, proc.stdout + proc.stderr
    records = sc.records(run_id)
    steps = sorted(r["step"] for r in records if r["kind"] == "step")
    end = next(r for r in records if r["kind"] == "end")
    last = steps[-1]
    print(f"{run_id}: action at step {ACTION_STEP}, last step run {last}")
    # It stopped itself, at or after the step the stop was asked at and long before the
    # run's planned end. How many steps the stop takes to reach the trainer depends on
    # the machine's load (the sender thread delivers the answer), so no count is asserted.
    assert ACTION_STEP <= last < STEPS, last
    requested = f"stop requested at step {ACTION_STEP} by rule StopOnRepeatedNaN"
    assert end["status"] == "stopped" and end["step"] == last, end
    assert requested in (end["error"] or requested), end
    # The page says where the run really stopped: the step the trainer honoured the stop,
    # from its end record, not the step it was asked at (before the end record arrives, a
    # page says "stop requested at step N"; the first page may already come after it).
    stopped = f"run stopped at step {last} by rule StopOnRepeatedNaN ({requested.split(' by')[0]})"
    def paged() -> list[str]:
        summaries = [r.json["payload"]["summary"] for r in pd_receiver.requests if r.json]
        assert any(stopped in s for s in summaries), summaries
        return summaries

    summaries = eventually(paged, what="the page saying where the run stopped")
    if last != ACTION_STEP:
        assert not any(f"run stopped at step {ACTION_STEP} " in s for s in summaries), summaries
    [action] = httpx.get(f"{sc.url}/v1/runs/{run_id}/actions", timeout=10).json()["actions"]
    assert (action["step"], action["honoured_step"]) == (ACTION_STEP, last)
    return last


@pytest.mark.slow
def test_plain_loop_stops_itself(stopping_sidecar, pd_receiver, tmp_path):
    proc = _run("train_gpt.py", "--url", stopping_sidecar.url, "--run-id", "stop-plain",
                "--steps", str(STEPS), "--inject", "nan", "--inject-step", str(INJECT),
                "--nan-patience", "30", "--threads", "1", "--peak-flops", "1e11",
                "--spool-dir", str(tmp_path / "spool"), "--quiet")
    assert "stopped by the monitor" in proc.stderr
    _check_stopped(stopping_sidecar, pd_receiver, "stop-plain", proc)


@pytest.mark.slow
def test_hf_trainer_stops_itself(stopping_sidecar, pd_receiver, tmp_path):
    pytest.importorskip("transformers")
    proc = _run("hf_trainer.py", "--url", stopping_sidecar.url, "--run-id", "stop-hf",
                "--steps", str(STEPS), "--inject-nan", str(INJECT), "--linger", "0.02",
                "--spool-dir", str(tmp_path / "spool"))
    _check_stopped(stopping_sidecar, pd_receiver, "stop-hf", proc)


@pytest.mark.slow
def test_lightning_stops_itself(stopping_sidecar, pd_receiver, tmp_path):
    pytest.importorskip("lightning")
    proc = _run("lightning_train.py", "--url", stopping_sidecar.url, "--run-id", "stop-pl",
                "--steps", str(STEPS), "--inject-nan", str(INJECT), "--linger", "0.02",
                "--spool-dir", str(tmp_path / "spool"))
    _check_stopped(stopping_sidecar, pd_receiver, "stop-pl", proc)
