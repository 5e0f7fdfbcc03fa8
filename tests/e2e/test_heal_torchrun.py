"""A hung rank healed with no person acting, on real parts: ``torchrun --max-restarts=2``
with two gloo ranks of a user-style script (tests/e2e/heal_train.py, written from
docs/actions.md "Healing"), the real sidecar in a subprocess with the packaged rules, a
Slack-protocol receiver. Rank 1 blocks before step 22 on the job's first launch (the
other waits in DDP's all-reduce); the sidecar restarts every rank from its last clean
checkpoint: both processes leave with exit status 75, the blocked one included, torchrun
runs the group again, the relaunched script resumes from the plan, and the job completes
with exit 0. Every step after the resume follows the checkpoint, both ranks end with the
same weights, and one page says what was done. The namespace-cluster proofs (a frozen
rank, an XID, a NaN twice, a node left out) are tests/netcluster/test_heal.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from monitor_agent.serving.embedded import free_port
from tests.eventually import eventually
from tests.receivers import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
SCRIPT = Path(__file__).resolve().parent / "heal_train.py"
REPO = Path(__file__).resolve().parents[2]
STEPS, HANG_AT, EVERY = 36, 22, 5


def _config(tmp: Path, slack: Receiver) -> Path:
    config = tmp / "config.yaml"
    config.write_text(
        "tick_interval_seconds: 0.2\n"
        "detectors: {hang_settle_seconds: 0.5, hang_repeat_seconds: 5}\n"
        "alerting:\n"
        "  group_wait_seconds: 0.1\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/heal', min_interval_seconds: 0}}\n")
    return config


def test_a_hung_rank_restarts_the_job_from_its_clean_checkpoint_and_it_completes(
        tmp_path, sidecar_factory):
    with Receiver("slack") as slack:
        sc = sidecar_factory(config=_config(tmp_path, slack)).start()
        out = tmp_path / "out"
        # With the agent's store shared (torch >= 2.5's default), a group restarted in the
        # same rendezvous can read the previous round's addresses (pytorch/pytorch#135712).
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "client")])}
        torchrun = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
             "--nproc-per-node=2", "--max-restarts=2", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=heal-e2e",
             "--monitor-interval=0.5", str(SCRIPT), "--url", sc.url, "--run-id", "heal-e2e",
             "--out", str(out), "--steps", str(STEPS), "--ckpt-every", str(EVERY),
             "--fault", "hang", "--fault-rank", "1", "--fault-step", str(HANG_AT),
             "--watchdog-floor", "2"],
            env=env, capture_output=True, text=True, timeout=360, check=False)
        logs = torchrun.stdout[-3000:] + torchrun.stderr[-3000:]
        assert torchrun.returncode == 0, logs
        # Every rank left; at least one by the restart's exit 75. A rank blocked in the
        # all-reduce may lose its peer before its own client thread reads the plan, and end
        # of that (torchrun then stops it): the same restart, as the resumes below show.
        left = (torchrun.stdout + torchrun.stderr).count("this process exits with 75")
        assert left in (1, 2), logs

        [restart] = httpx.get(f"{sc.url}/v1/runs/heal-e2e/actions").json()["actions"]
        assert restart["action"] == "restart" and restart["rule"] == "TrainingHung"
        resumed_at = restart["plan"]["checkpoint_step"]
        assert resumed_at == (HANG_AT - 1) // EVERY * EVERY  # the last save before the hang
        assert restart["honoured_step"] == resumed_at + 1

        for rank in (0, 1):
            lines = (out / f"steps-r{rank}.log").read_text().split("\n")
            resumes = [line.split() for line in lines if line.startswith("resume")]
            assert resumes == [["resume", "0", "0", "0", "start"],
                               ["resume", "1", str(resumed_at), str(resumed_at), "plan"]]
            after = [tuple(map(int, line.split())) for line in lines
                     if line and line[0] == "1"]
            assert after == [(1, s, s) for s in range(resumed_at + 1, STEPS + 1)]
        weights = {(out / f"weights-r{r}.txt").read_text() for r in (0, 1)}
        assert len(weights) == 1 and weights.pop().startswith(f"{STEPS} ")

        pages = eventually(lambda: [r.body.decode() for r in slack.accepted()
                                    if b"TrainingHung" in r.body], timeout=30)
        firing = [p for p in pages if "esolved" not in p]
        assert len(firing) == 1, pages
        assert f"restart all 2 ranks from checkpoint {resumed_at}" in firing[0]
        resolved = eventually(lambda: [p for p in (r.body.decode() for r in slack.accepted())
                                       if "TrainingHung" in p and "esolved" in p], timeout=60)
        assert "training resumed at step" in resolved[0] and "to recover" in resolved[0]
        goodput = httpx.get(f"{sc.url}/v1/runs/heal-e2e/goodput").json()["ettr"]
        assert goodput["failures"] == 1 and goodput["time_to_recover_seconds"][0]["open"] \
            is False
