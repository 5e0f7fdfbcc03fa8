"""The proof of issue 22's loop on real parts: a real sidecar whose rule says
``action: rollback`` on divergence, and a user's plain CPU training loop
(``rollback_user_train.py``) whose data turns corrupt at a known batch. The run rolls back to
its last clean checkpoint, never trains on the skipped window again, and finishes; with two
gloo ranks both get the same plan and resume at the same step."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("rollback_user_train.py")
POISON_FROM, POISON_LEN, CKPT_EVERY, STEPS, MARGIN = 65, 12, 10, 200, 20
RULES = f"""
routes: {{page: [pagerduty]}}
rules:
  - name: RollbackOnDivergence
    match: {{types: [divergence]}}
    severity: critical
    action: rollback
    rollback_skip_margin: {MARGIN}
    rollback_budget: 2
"""


@pytest.fixture
def rolling_sidecar(tmp_path, sidecar_factory, pd_receiver):
    rules = tmp_path / "rollback-rules.yaml"
    rules.write_text(RULES)
    config = tmp_path / "rollback-config.yaml"
    config.write_text(f"alerting:\n  rules_file: {rules}\n  group_wait_seconds: 0.05\n"
                      f"  pagerduty: {{routing_key: k-0123456789abcdef0123456789abcd, "
                      f"url: '{pd_receiver.url}/v2/enqueue'}}\n")
    return sidecar_factory(config=config).start()


def _train(url: str, run_id: str, out: Path, world: int) -> list[subprocess.CompletedProcess]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1",
           "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "MONITOR_AGENT_SPOOL_DIR": str(out / "spool")}
    procs = [subprocess.Popen(
        [sys.executable, str(SCRIPT), f"--url={url}", f"--run_id={run_id}",
         f"--out_dir={out}", f"--steps={STEPS}", f"--ckpt_every={CKPT_EVERY}",
         f"--poison_from={POISON_FROM}", f"--poison_len={POISON_LEN}"],
        env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for rank in range(world)]
    done = []
    for proc in procs:
        out_, err = proc.communicate(timeout=400)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out_, err))
    return done


def _consumed(out: Path, rank: int) -> tuple[list[tuple[int, int]], list[tuple[int, ...]]]:
    """(step, batch) pairs trained on, in order, and the rollbacks the loop applied."""
    trained, rollbacks = [], []
    for line in (out / f"batches-r{rank}.log").read_text().splitlines():
        words = line.split()
        if words[0] == "rollback":
            rollbacks.append((len(trained), *map(int, words[1:])))
        else:
            trained.append((int(words[0]), int(words[1])))
    return trained, rollbacks


def _check_rank(out: Path, rank: int, plan: dict) -> tuple[int, ...]:
    trained, rollbacks = _consumed(out, rank)
    [(at, plan_id, c, skip_to)] = rollbacks
    assert (c, skip_to) == (plan["checkpoint_step"], plan["skip_to"])
    after = trained[at:]
    # It resumed at C + 1, on the batch after the window, and ran to the planned end.
    assert after[0] == (c + 1, skip_to + 1) and after[-1][0] == STEPS, after[:3]
    window = range(plan["skip_from"], skip_to + 1)
    assert not [b for _, b in after if b in window]
    assert not [b for _, b in after if POISON_FROM <= b < POISON_FROM + POISON_LEN]
    # Nothing was trained twice on the resumed branch, and each step ran once on it.
    assert [s for s, _ in after] == list(range(c + 1, STEPS + 1))
    return plan_id, c, at


def _plan(url: str, run_id: str) -> dict:
    actions = httpx.get(f"{url}/v1/runs/{run_id}/actions", timeout=10).json()["actions"]
    [action] = [a for a in actions if a["action"] == "rollback"]
    assert not [a for a in actions if a["action"] == "stop"], actions
    return action


def _pages(pd_receiver, want: str) -> list[str]:
    """The pages' texts once one says ``want`` (or after 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        pages = [str(r.json) for r in pd_receiver.requests if r.json]
        if any(want in p for p in pages) or time.monotonic() > deadline:
            return pages
        time.sleep(0.05)


def _says_the_plan(pd_receiver, plan: dict) -> None:
    want = (f"rolled back to step {plan['checkpoint_step']} ({plan['checkpoint_path']}), "
            f"skipping batches {plan['skip_from']}-{plan['skip_to']}")
    pages = _pages(pd_receiver, want)
    assert any(want in p for p in pages), pages


@pytest.mark.slow
def test_plain_loop_rolls_back_to_the_last_clean_checkpoint_and_skips_the_window(
        rolling_sidecar, pd_receiver, tmp_path):
    url, run_id, out = rolling_sidecar.url, "rollback-plain", tmp_path / "out"
    [proc] = _train(url, run_id, out, world=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    action = _plan(url, run_id)
    plan = action["plan"]
    # The last checkpoint before the corrupt data began, and a window past the fault.
    assert plan["checkpoint_step"] == (POISON_FROM - 1) // CKPT_EVERY * CKPT_EVERY
    assert plan["checkpoint_path"] == str(out / f"ckpt-{plan['checkpoint_step']}.pt")
    assert plan["skip_to"] == action["step"] + MARGIN and plan["number"] == 1
    assert plan["skip_to"] >= POISON_FROM + POISON_LEN - 1  # the margin covers the stretch
    plan_id, c, _ = _check_rank(out, 0, plan)
    assert plan_id == action["id"]
    assert action["honoured_step"] == c + 1
    _says_the_plan(pd_receiver, plan)
    run = httpx.get(f"{url}/v1/runs/{run_id}", timeout=10).json()
    steps = [r["step"] for r in rolling_sidecar.records(run_id) if r["kind"] == "step"]
    assert steps == list(range(1, STEPS + 1))  # one history: the resumed branch from C + 1
    assert run["verdict"]["state"] == "healthy", run["verdict"]


@pytest.mark.slow
def test_two_gloo_ranks_get_one_plan_and_resume_at_the_same_step(
        rolling_sidecar, pd_receiver, tmp_path):
    url, run_id, out = rolling_sidecar.url, "rollback-ddp", tmp_path / "out"
    procs = _train(url, run_id, out, world=2)
    assert all(p.returncode == 0 for p in procs), [p.stdout + p.stderr for p in procs]
    action = _plan(url, run_id)
    plan = action["plan"]
    # A clean checkpoint before the corrupt data. Usually the last one (60), but rank 1's
    # divergence can reach the sidecar before rank 0's sender delivered its checkpoint
    # record of step 60: the decision then takes the last clean one it knew (50).
    ledger = httpx.get(f"{url}/v1/runs/{run_id}/checkpoints", timeout=10).json()
    [chosen] = [c for c in ledger["checkpoints"] if c["path"] == plan["checkpoint_path"]]
    assert chosen["status"] == "clean" and chosen["step"] == plan["checkpoint_step"]
    assert POISON_FROM - 2 * CKPT_EVERY <= plan["checkpoint_step"] < POISON_FROM, plan
    # Both ranks applied the one plan, after the same number of trained steps (the same
    # step of the abandoned branch), and both ran the resumed branch to the end.
    assert _check_rank(out, 0, plan) == _check_rank(out, 1, plan)
    assert _check_rank(out, 0, plan)[0] == action["id"]
    _says_the_plan(pd_receiver, plan)
    run = httpx.get(f"{url}/v1/runs/{run_id}", timeout=10).json()
    assert run["status"] == "completed", run
    for rank in (0, 1):
        steps = [r["step"] for r in rolling_sidecar.records(run_id)
                 if r["kind"] == "step" and r["rank"] == rank]
        assert steps == list(range(1, STEPS + 1)), rank
