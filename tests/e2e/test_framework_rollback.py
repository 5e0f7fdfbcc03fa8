"""Issue 31's proof for the frameworks: a HuggingFace ``Trainer`` with its default shuffled
sampler and a Lightning fit (``DataStream``-wrapped shuffled loader), each written from the
docs (``hf_rollback_train.py``, ``lightning_rollback_train.py``), against a real sidecar whose
rule rolls back on a NaN. A poisoned batch (NaN targets) makes the sidecar decide; the
callback prints the rollback, the process exits 75 with the plan left for the launcher and
the run page says it waits for the relaunch; ``python -m monitor_client.relaunch`` relaunches
it from the plan's checkpoint and consumes the plan. The resumed run's batches are the
reference run's, position for position, minus the plan's window (the shuffle order intact),
and the run ends healthy, naming the NaN it rolled back from."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from eventually import eventually
from receivers import Receiver
from sidecar_process import SidecarProcess

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
STEPS, CKPT_EVERY, POISONED_AT, MARGIN = 40, 10, 25, 3
RULES = f"""
routes: {{page: [pagerduty]}}
rules:
  - name: RollbackOnNaN
    match: {{types: [nan_inf]}}
    severity: critical
    fingerprint: []
    action: rollback
    rollback_skip_margin: {MARGIN}
"""


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory) -> Iterator[SidecarProcess]:
    tmp = tmp_path_factory.mktemp("framework-rollback")
    (tmp / "rules.yaml").write_text(RULES)
    with Receiver("pagerduty") as pd:
        (tmp / "config.yaml").write_text(
            f"alerting:\n  rules_file: {tmp / 'rules.yaml'}\n  group_wait_seconds: 0.05\n"
            f"  pagerduty: {{routing_key: k-0123456789abcdef0123456789abcd, "
            f"url: '{pd.url}/v2/enqueue'}}\n")
        proc = SidecarProcess(tmp / "data", config=tmp / "config.yaml").start()
        try:
            yield proc
        finally:
            proc.stop()


def _run(sidecar: SidecarProcess, script: str, out: Path, run_id: str, *extra: str,
         relaunch: bool = False) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(HERE / script), f"--out_dir={out}", f"--run_id={run_id}",
               *extra]
    if relaunch:
        command = [sys.executable, "-m", "monitor_client.relaunch", "--dir", str(out), "--",
                   *command]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1",
           "MONITOR_AGENT_URL": sidecar.url, "MONITOR_AGENT_SPOOL_DIR": str(out / "spool")}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _launches(out: Path) -> list[tuple[str, list[list[int]]]]:
    """(resume argument, batches trained) of each launch, from the script's log."""
    launches: list[tuple[str, list[list[int]]]] = []
    for line in (out / "batches.log").read_text().splitlines():
        if line.startswith("launch"):
            launches.append((line.split()[1], []))
        elif line != "done":
            launches[-1][1].append([int(i) for i in line.split(",")])
    return launches


def _get(sidecar: SidecarProcess, path: str) -> dict:
    return httpx.get(f"{sidecar.url}{path}", timeout=10).json()


def _settled(sidecar: SidecarProcess, run_id: str, want: str) -> dict:
    """The run once its status is ``want`` (its end record went through)."""
    def settled() -> dict:
        run = _get(sidecar, f"/v1/runs/{run_id}")
        assert run.get("status") == want, run.get("status")
        return run

    return eventually(settled, timeout=15, what=f"{run_id} {want}")


@pytest.mark.slow
@pytest.mark.parametrize("script,relaunch_at_once", [("hf_rollback_train.py", False),
                                                     ("lightning_rollback_train.py", True)])
def test_rolled_back_relaunched_and_the_window_never_trained(sidecar, tmp_path, script,
                                                             relaunch_at_once):
    framework = script.split("_")[0]
    # The reference: the same script, clean data, a few more steps than the rollback needs.
    ref = _run(sidecar, script, tmp_path / "ref", f"{framework}-ref", "--steps=50")
    assert ref.returncode == 0, ref.stderr[-3000:]
    [(_, reference)] = _launches(tmp_path / "ref")
    poison = ",".join(map(str, reference[POISONED_AT - 1]))  # the batch at position 25
    out, run_id = tmp_path / "run", f"{framework}-rollback"
    args = (f"--steps={STEPS}", f"--poison={poison}")
    if relaunch_at_once:
        done = _run(sidecar, script, out, run_id, *args, relaunch=True)
    else:  # the launcher runs the helper after the process exited for the rollback
        first = _run(sidecar, script, out, run_id, *args)
        assert first.returncode == 75, first.stderr[-3000:]
        assert "monitor_client: rollback 1/2 (rule RollbackOnNaN)" in first.stderr
        assert (out / "monitor_rollback.json").exists()
        waiting = _settled(sidecar, run_id, "stopped")
        assert waiting["phase"].startswith("waiting for relaunch from checkpoint step 20 ("), \
            waiting["phase"]
        done = _run(sidecar, script, out, run_id, *args, relaunch=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "monitor_client.relaunch: rollback 1:" in done.stderr

    [action] = _get(sidecar, f"/v1/runs/{run_id}/actions")["actions"]
    plan = action["plan"]
    assert (plan["checkpoint_step"], plan["resume_position"], plan["positions"]) == (
        20, 20, "positions")
    [(first_at, last)] = plan["skip"]
    assert first_at == 21 and last >= POISONED_AT
    assert action["honoured_step"] == 21
    launches = _launches(out)
    assert [arg for arg, _ in launches] == ["-", plan["checkpoint_path"]]
    (_, before), (_, after) = launches
    # Until the rollback: the reference order, the poisoned batch at position 25 included.
    assert before == reference[:len(before)] and len(before) >= POISONED_AT
    # After it: from the checkpoint's position, the reference order minus the window.
    kept = [p for p in range(21, 60) if not first_at <= p <= last]
    assert after == [reference[p - 1] for p in kept[:STEPS - 20]]
    assert not set(map(int, poison.split(","))) & {i for batch in after for i in batch}
    assert not (out / "monitor_rollback.json").exists()  # consumed by the relaunch
    run = _settled(sidecar, run_id, "completed")
    assert run["verdict"]["state"] == "healthy", run["verdict"]
    assert f"rolled back once: NaN at step {POISONED_AT} abandoned" in run["verdict"]["text"]
