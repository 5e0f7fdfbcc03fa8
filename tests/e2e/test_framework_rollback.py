"""The closed loop under a relaunch (issues 31 and 49): a HuggingFace ``Trainer`` and a
Lightning fit, each written from the docs (``hf_rollback_train.py``,
``lightning_rollback_train.py``), over a map-style dataset (the default shuffled sampler) and
over a stream (an ``IterableDataset``), against a real sidecar whose rule rolls back on a
NaN, relaunched by ``python -m monitor_client.relaunch``.

Three poisoned batches (NaN targets) make three rollbacks in one job: the first back to the
first process's save; the second before the relaunched process saved anything, so back to
the very checkpoint it resumed from (saved by the process before it: refused before issue
49, and the job trained NaN to its end); the third back to the third process's own save. A
map-style dataset leaves each window out in its sampler, a stream is read past it; the
training log and the page say which. Every resumed launch trains the reference order minus
every window so far (the map-style reference is a clean run of the same script; the
stream's is its own order), no poisoned batch is trained after the plan that skips it, and
the job ends healthy with exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.eventually import eventually
from tests.receivers import Receiver
from tests.sidecar_process import SidecarProcess

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from rollback_script import stream_order  # noqa: E402

STEPS, MARGIN, BATCH = 40, 3, 4
# The positions poisoned, and why there: 13 is step 13 of the first launch (back to its
# save of step 10, skipping 11-16); 17 is the first batch the second launch trains (it
# resumed at step 10, position 10, past 11-16): it faults before it saves, and goes back to
# step 10 again; 33 is step 23 of the third launch (positions 21-30 were its steps 11-20, it
# saved step 20): back to that save, skipping 31-36.
POISONED = (13, 17, 33)
RULES = f"""
routes: {{page: [pagerduty]}}
rules:
  - name: RollbackOnNaN
    match: {{types: [nan_inf]}}
    severity: critical
    fingerprint: []
    action: rollback
    rollback_skip_margin: {MARGIN}
    rollback_budget: 3
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
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


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


def _reference(sidecar: SidecarProcess, script: str, out: Path, stream: bool) -> list[list[int]]:
    """The batches of positions 1, 2, ... of a clean run: a stream's own order, or for a
    map-style dataset what a clean run of the same script trained."""
    if stream:
        order = stream_order(0)
        return [order[i:i + BATCH] for i in range(0, len(order), BATCH)]
    ref = _run(sidecar, script, out, f"{script}-ref", "--steps=60")
    assert ref.returncode == 0, ref.stderr[-3000:]
    [(_, reference)] = _launches(out)
    return reference


@pytest.mark.slow
@pytest.mark.parametrize("script,stream", [
    ("hf_rollback_train.py", False), ("hf_rollback_train.py", True),
    ("lightning_rollback_train.py", False), ("lightning_rollback_train.py", True)],
    ids=["hf-map", "hf-stream", "lightning-map", "lightning-stream"])
def test_three_rollbacks_under_a_relaunch_never_train_a_window(sidecar, tmp_path, script,
                                                               stream):
    framework = script.split("_")[0]
    kind = "stream" if stream else "map"
    reference = _reference(sidecar, script, tmp_path / "ref", stream)
    poison = sorted(i for p in POISONED for i in reference[p - 1])
    out, run_id = tmp_path / "run", f"{framework}-{kind}-rollbacks"
    args = (f"--steps={STEPS}", f"--poison={','.join(map(str, poison))}",
            *(["--stream"] if stream else []))
    if framework == "hf" and not stream:
        # The launcher runs the helper after the process exited for the rollback: the plan
        # waits in the output dir, and the run page says so.
        first = _run(sidecar, script, out, run_id, *args)
        assert first.returncode == 75, first.stderr[-3000:]
        assert "monitor_client: rollback 1/3 (rule RollbackOnNaN)" in first.stderr
        assert (out / "monitor_rollback.json").exists()
        waiting = _settled(sidecar, run_id, "stopped")
        assert waiting["phase"].startswith("waiting for relaunch from checkpoint step 10 ("), \
            waiting["phase"]
    done = _run(sidecar, script, out, run_id, *args, relaunch=True)
    said = done.stderr
    assert done.returncode == 0, said[-5000:]
    assert "monitor_client.relaunch: rollback 3:" in said, said[-5000:]
    assert "not loaded" not in said  # no plan refused

    actions = _get(sidecar, f"/v1/runs/{run_id}/actions")["actions"]
    assert [a["action"] for a in actions] == ["rollback"] * 3, actions
    plans = [a["plan"] for a in actions]
    assert [p["checkpoint_step"] for p in plans] == [10, 10, 20]
    assert all(p["positions"] == "positions" for p in plans)
    assert [a["honoured_step"] for a in actions] == [11, 11, 21]
    launches = _launches(out)
    assert [arg for arg, _ in launches] == ["-", *(p["checkpoint_path"] for p in plans)]
    skips_by = "by reading past them" if stream else "left out in the sampler"
    for number, (plan, (_, trained)) in enumerate(zip(plans, launches[1:], strict=True), 1):
        # The relaunch resumed after the plan's position, every window so far left out:
        # the reference order minus the windows.
        windows = [range(a, b + 1) for a, b in plan["skip"]]
        kept = [p for p in range(plan["resume_position"] + 1, len(reference) + 1)
                if not any(p in w for w in windows)]
        assert trained == [reference[p - 1] for p in kept[:len(trained)]], number
        assert trained, number
        # No poisoned batch of a window this plan skips is trained after it.
        skipped = {i for w in windows for p in w for i in reference[p - 1]}
        later = {i for _, batches in launches[number:] for batch in batches for i in batch}
        assert not skipped & set(poison) & later, number
        # The page and the training log say how the windows were left out.
        assert skips_by in actions[number - 1]["message"], actions[number - 1]["message"]
        assert f"monitor_client: rollback {number}/3: resumed from checkpoint step " \
               f"{plan['checkpoint_step']}" in said
    assert said.count(skips_by) >= 3
    (_, last) = launches[-1]
    assert len(last) == STEPS - 20  # the last launch trained on to the end, from step 21
    assert not (out / "monitor_rollback.json").exists()  # each plan consumed
    run = _settled(sidecar, run_id, "completed")
    assert run["verdict"]["state"] == "healthy", run["verdict"]
