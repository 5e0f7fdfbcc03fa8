"""The closed loop on real parts (issues 22 and 31): a real sidecar whose rule says
``action: rollback`` on divergence, and a user's plain CPU training loop written from
docs/actions.md (``rollback_user_train.py``) whose data turns corrupt twice, at known batches.

The first corrupt stretch rolls the run back to its last clean checkpoint, skipping a
window of data positions; the run resumes past that window, meets the second stretch, and
rolls back to the same checkpoint: its plan's window starts at the checkpoint's batch and
holds the first window too (step and position differ after the first rollback, so a plan
in steps would have sent the data back into the first window). No batch of either window is
trained after its plan, the resumed data is the reference order minus the windows, and the
run ends healthy. With two gloo ranks, both take each plan at the same step. A loop that
resumes the data without skipping the window is paged, with the batches."""

from __future__ import annotations

import os
import socket
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
SCRIPT = Path(__file__).with_name("rollback_user_train.py")
CORRUPT, CKPT_EVERY, STEPS, MARGIN = ((65, 70), (95, 100)), 10, 200, 20
RULES = f"""
routes: {{page: [pagerduty]}}
rules:
  - name: RollbackOnDivergence
    match: {{types: [divergence]}}
    severity: critical
    action: rollback
    rollback_skip_margin: {MARGIN}
    rollback_budget: 2
  - name: TrainingWindowTrained
    match: {{types: [window_trained]}}
    severity: error
    fingerprint: []
"""


@pytest.fixture(scope="module")
def pd() -> Iterator[Receiver]:
    with Receiver("pagerduty") as receiver:
        yield receiver


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory, pd) -> Iterator[SidecarProcess]:
    """One sidecar for the module's runs (each its own run id)."""
    tmp = tmp_path_factory.mktemp("rollback")
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    config = tmp / "config.yaml"
    config.write_text(f"alerting:\n  rules_file: {rules}\n  group_wait_seconds: 0.05\n"
                      f"  pagerduty: {{routing_key: k-0123456789abcdef0123456789abcd, "
                      f"url: '{pd.url}/v2/enqueue'}}\n")
    proc = SidecarProcess(tmp / "data", config=config).start()
    try:
        yield proc
    finally:
        proc.stop()


def _train(url: str, run_id: str, out: Path, world: int, *extra: str,
           steps: int = STEPS) -> list[subprocess.CompletedProcess]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1",
           "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "MONITOR_AGENT_SPOOL_DIR": str(out / "spool")}
    poison = ",".join(f"{a}-{b}" for a, b in CORRUPT)
    procs = [subprocess.Popen(
        [sys.executable, str(SCRIPT), f"--url={url}", f"--run_id={run_id}",
         f"--out_dir={out}", f"--steps={steps}", f"--ckpt_every={CKPT_EVERY}",
         f"--poison={poison}", *extra],
        env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for rank in range(world)]
    done = []
    for proc in procs:
        out_, err = proc.communicate(timeout=400)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out_, err))
    return done


def _consumed(out: Path, rank: int) -> tuple[list[tuple[int, int]], list[tuple]]:
    """(step, position) of every batch trained, in order, and the rollbacks the loop applied
    as (batches trained before it, plan id, checkpoint step, windows)."""
    trained, rollbacks = [], []
    for line in (out / f"batches-r{rank}.log").read_text().splitlines():
        words = line.split()
        if words[0] == "rollback":
            windows = [tuple(map(int, w.split("-"))) for w in words[4].split(",")]
            rollbacks.append((len(trained), int(words[1]), int(words[2]), windows))
        else:
            trained.append((int(words[0]), int(words[1])))
    return trained, rollbacks


def _actions(url: str, run_id: str) -> list[dict]:
    return httpx.get(f"{url}/v1/runs/{run_id}/actions", timeout=10).json()["actions"]


def _pages(pd: Receiver, run_id: str, want: str) -> list[str]:
    """The run's pages once one says ``want``."""
    def paged() -> list[str]:
        pages = [str(r.json) for r in pd.requests if r.json and run_id in str(r.json)]
        assert any(want in p for p in pages), pages
        return pages

    return eventually(paged, timeout=15, what=f"a page of {run_id} saying {want}")


def _check_rank(out: Path, rank: int, plans: list[dict]) -> list[tuple[int, int]]:
    """Each plan applied where the loop says, no batch of its windows trained after it, the
    resumed data the reference order (the batches in order) minus the windows."""
    trained, rollbacks = _consumed(out, rank)
    assert [(r[1], r[2]) for r in rollbacks] == [(p["id"], p["plan"]["checkpoint_step"])
                                                 for p in plans]
    for (at, _, checkpoint, windows), action in zip(rollbacks, plans, strict=True):
        plan = action["plan"]
        assert [tuple(w) for w in plan["skip"]] == windows
        after = trained[at:]
        assert after[0][0] == checkpoint + 1
        skipped = [p for _, p in after if any(a <= p <= b for a, b in windows)]
        assert skipped == [], (action["id"], skipped[:5])
    # The final history: steps 1..STEPS once each, at the reference positions minus the
    # windows (the data of one run of positions, nothing of it trained twice).
    final = trained[rollbacks[-1][0]:] if rollbacks else trained
    checkpoint = rollbacks[-1][2] if rollbacks else 0
    windows = rollbacks[-1][3] if rollbacks else []
    kept = [p for p in range(checkpoint + 1, checkpoint + 1000)
            if not any(a <= p <= b for a, b in windows)]
    assert final == list(zip(range(checkpoint + 1, STEPS + 1), kept, strict=False))
    return trained


@pytest.mark.slow
def test_two_windows_two_rollbacks_to_the_same_checkpoint_and_no_window_trained_again(
        sidecar, pd, tmp_path):
    url, run_id, out = sidecar.url, "rollback-plain", tmp_path / "out"
    [proc] = _train(url, run_id, out, world=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    actions = _actions(url, run_id)
    assert [a["action"] for a in actions] == ["rollback", "rollback"], actions
    first, second = (a["plan"] for a in actions)
    # Both go back to the last checkpoint before the first corrupt batch.
    assert first["checkpoint_step"] == second["checkpoint_step"] == 60
    assert first["resume_position"] == second["resume_position"] == 60
    assert first["positions"] == second["positions"] == "positions"
    # The first window covers the first stretch; the second, from the same checkpoint, the
    # second stretch and, with it, the first window.
    [(a1, b1)] = first["skip"]
    [(a2, b2)] = second["skip"]
    assert a1 == a2 == 61 and b1 >= CORRUPT[0][1] and b2 >= max(CORRUPT[1][1], b1)
    trained = _check_rank(out, 0, actions)
    # Each corrupt stretch began to be trained once, before the plan it caused, and never
    # again.
    positions = [p for _, p in trained]
    assert all(positions.count(p) <= 1 for a, b in CORRUPT for p in range(a, b + 1))
    assert positions.count(CORRUPT[0][0]) == positions.count(CORRUPT[1][0]) == 1
    want = (f"rolled back to step 60 ({first['checkpoint_path']}, data position 60), skipping "
            f"batches 61-{b2}")
    assert any(want in p for p in _pages(pd, run_id, want)), want
    run = httpx.get(f"{url}/v1/runs/{run_id}", timeout=10).json()
    steps = [r["step"] for r in sidecar.records(run_id) if r["kind"] == "step"]
    assert steps == list(range(1, STEPS + 1))  # one history: the last resumed branch
    assert run["verdict"]["state"] == "healthy", run["verdict"]
    assert "rolled back twice" in run["verdict"]["text"], run["verdict"]
    found = httpx.get(f"{url}/v1/runs/{run_id}/findings?limit=1000", timeout=10).json()
    assert not [f for f in found["findings"] if f["type"] == "window_trained"]


@pytest.mark.slow
def test_two_gloo_ranks_take_each_plan_at_the_same_step(sidecar, pd, tmp_path):
    url, run_id, out = sidecar.url, "rollback-ddp", tmp_path / "out"
    procs = _train(url, run_id, out, 2)
    assert all(p.returncode == 0 for p in procs), [p.stdout + p.stderr for p in procs]
    actions = _actions(url, run_id)
    assert [a["action"] for a in actions] == ["rollback", "rollback"], actions
    # A clean checkpoint before the corrupt data; both ranks applied both plans after the
    # same number of trained batches, at the same positions.
    for action in actions:
        assert 41 <= action["plan"]["checkpoint_step"] <= 60, action
    assert _check_rank(out, 0, actions) == _check_rank(out, 1, actions)
    assert httpx.get(f"{url}/v1/runs/{run_id}", timeout=10).json()["status"] == "completed"


@pytest.mark.slow
def test_a_loop_that_trains_the_window_again_is_paged(sidecar, pd, tmp_path):
    url, run_id, out = sidecar.url, "rollback-ignored", tmp_path / "out"
    [proc] = _train(url, run_id, out, 1, "--ignore_window=1", steps=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pages = _pages(pd, run_id, "TrainingWindowTrained")
    trained = [p for p in pages if "TrainingWindowTrained" in p]
    assert trained and "step 61 trained batch 61, inside rollback" in trained[0], pages
    run = httpx.get(f"{url}/v1/runs/{run_id}", timeout=10).json()
    assert run["verdict"]["state"] == "unhealthy"
    assert "skipped data trained again at step 61" in run["verdict"]["text"], run["verdict"]
