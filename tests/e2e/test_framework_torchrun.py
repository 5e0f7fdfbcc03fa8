"""The HF ``Trainer`` and a Lightning fit under ``torchrun --max-restarts``, healed with no
person and no helper of ours: each script is written from the docs (``hf_torchrun_train.py``,
``lightning_torchrun_train.py``), two gloo ranks on CPU, against the real sidecar in a
subprocess with a NaN rollback rule and the packaged hang restart, and a Slack-protocol
receiver.

One job, two faults. Launch 0 trains a poisoned sample (a NaN target) after its save of
step 10: the leader decides a rollback, every rank leaves with exit 75 at the step they
agreed on, and torchrun runs the group again. Launch 1 resumes from the plan's checkpoint
(the callback's ``resume_checkpoint``) at its data position with the window left out; before
step 25 its rank 1 blocks in a callback (the other waits in DDP's all-reduce): past the
watchdog's limit the leader restarts the job, every rank leaves (at least one by 75: a rank
blocked in the all-reduce may lose its peer first and be ended by torchrun), and launch 2
resumes from the restart's checkpoint, step 20, and completes: exit 0. Every step after a
resume follows its checkpoint (the next step, the next data position, the windows left
out), both ranks end with one model, the run is one run of three attempts, and one page
says what the restart did."""

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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STEPS, HANG_AT, BATCH, RANKS = 30, 25, 4, 2
# Sample 97 is at data position 13 (``_batch``: HF's rank 0, Lightning's rank 1), so
# launch 0 faults at step 13, after its save of step 10.
POISON = 97
RULES = """
routes: {page: [slack]}
rules:
  - name: RollbackOnNaN
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: []
    action: rollback
    rollback_skip_margin: 2
    rollback_budget: 2
  - name: TrainingHung
    match: {types: [hang]}
    severity: critical
    fingerprint: []
    action: restart
"""


def _config(tmp: Path, slack: Receiver) -> Path:
    (tmp / "rules.yaml").write_text(RULES)
    config = tmp / "config.yaml"
    config.write_text(
        "tick_interval_seconds: 0.2\n"
        "detectors: {hang_settle_seconds: 0.5, hang_repeat_seconds: 5}\n"
        "alerting:\n"
        f"  rules_file: {tmp / 'rules.yaml'}\n"
        "  group_wait_seconds: 0.1\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/fw', min_interval_seconds: 0}}\n")
    return config


def _batch(framework: str, rank: int, position: int) -> list[int]:
    """The samples rank ``rank`` trains at data position ``position`` (1, 2, ...) in order:
    under HF the sequential order's batches dealt to the ranks in turn (accelerate), under
    Lightning each rank's ``DistributedSampler`` shard (every other sample) in batches."""
    if framework == "hf":
        first = ((position - 1) * RANKS + rank) * BATCH
        return list(range(first, first + BATCH))
    return [((position - 1) * BATCH + k) * RANKS + rank for k in range(BATCH)]


def _launches(out: Path, rank: int) -> list[tuple[int, list[tuple[int, list[int]]]]]:
    """(resumed step, [(step, samples), ...]) of each launch, from the rank's log."""
    launches: list[tuple[int, list[tuple[int, list[int]]]]] = []
    for line in (out / f"steps-r{rank}.log").read_text().splitlines():
        words = line.split()
        if words[0] == "resume":
            assert int(words[1]) == len(launches), line  # the launches that reached training
            launches.append((int(words[2]), []))
        else:
            launches[-1][1].append((int(words[1]), [int(i) for i in words[2].split(",")]))
    return launches


@pytest.mark.parametrize("script", ["hf_torchrun_train.py", "lightning_torchrun_train.py"],
                         ids=["hf", "lightning"])
def test_a_rollback_and_a_hang_restart_ride_torchrun_to_the_end(tmp_path, sidecar_factory,
                                                                  script):
    framework = script.split("_")[0]
    run_id = f"{framework}-torchrun"
    with Receiver("slack") as slack:
        sc = sidecar_factory(config=_config(tmp_path, slack)).start()
        out = tmp_path / "out"
        out.mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "client")]),
               "MONITOR_AGENT_URL": sc.url, "MONITOR_AGENT_SPOOL_DIR": str(tmp_path / "spool")}
        torchrun = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
             f"--nproc-per-node={RANKS}", "--max-restarts=3", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id={run_id}",
             "--monitor-interval=0.5", str(HERE / script), f"--out_dir={out}",
             f"--run_id={run_id}", f"--steps={STEPS}", f"--poison={POISON}",
             f"--hang_step={HANG_AT}", "--hang_launch=1"],
            env=env, capture_output=True, text=True, timeout=540, check=False)
        said = torchrun.stdout + torchrun.stderr
        logs = torchrun.stdout[-4000:] + torchrun.stderr[-6000:]
        assert torchrun.returncode == 0, logs
        assert "monitor_client: rollback 1/2 (rule RollbackOnNaN)" in said, logs
        assert "monitor_client.relaunch" not in said  # torchrun relaunched, not our helper
        assert said.count("this process exits with 75") >= 1, logs  # the restart

        rollback, restart = httpx.get(f"{sc.url}/v1/runs/{run_id}/actions").json()["actions"]
        assert rollback["action"] == "rollback" and rollback["rule"] == "RollbackOnNaN"
        assert restart["action"] == "restart" and restart["rule"] == "TrainingHung"
        assert rollback["plan"]["checkpoint_step"] == 10
        assert restart["plan"]["checkpoint_step"] == 20  # the last save before the hang
        assert rollback["honoured_step"] == 11 and restart["honoured_step"] == 21
        # The relaunched training log says which decision it resumed for.
        assert f"monitor_client: restart {restart['id']}: resumed from checkpoint step 20" \
            in said, logs
        windows = [range(a, b + 1) for a, b in restart["plan"]["skip"]]
        assert windows and any(13 in w for w in windows), restart["plan"]

        for rank in range(RANKS):
            launches = _launches(out, rank)
            assert [resumed for resumed, _ in launches] == [0, 10, 20], launches
            # Launch 0 trained the data in order past the poisoned step, to the step the
            # ranks agreed on the plan (every 10th: Monitor.rollback_plan).
            first = launches[0][1]
            assert [s for s, _ in first] == list(range(1, len(first) + 1))
            assert [b for _, b in first] == [_batch(framework, rank, p)
                                             for p in range(1, len(first) + 1)]
            assert len(first) >= 13
            # Each later launch trains on from its checkpoint: the next step, at the next
            # data position its checkpoint holds, every window left out.
            kept = [p for p in range(11, 200) if not any(p in w for w in windows)]
            for resumed, trained in launches[1:]:
                assert [s for s, _ in trained][:1] == [resumed + 1]
                assert [s for s, _ in trained] == list(range(resumed + 1, resumed + 1 +
                                                             len(trained)))
                at = kept[resumed - 10:]
                assert [b for _, b in trained] == [_batch(framework, rank, p)
                                                   for p in at[:len(trained)]]
                assert not any(POISON in b for _, b in trained)
            assert launches[1][1][-1][0] < HANG_AT <= 30  # rank 1 hung before step 25
            assert launches[2][1][-1][0] == STEPS
        weights = {(out / f"weights-r{r}.txt").read_text() for r in range(RANKS)}
        assert len(weights) == 1 and weights.pop().startswith(f"{STEPS} ")

        run = eventually(lambda: _completed(sc.url, run_id), timeout=30)
        # One run: the first launch, then each relaunch a resumed attempt from its checkpoint.
        assert [(a["number"], a["kind"], a["start_step"]) for a in run["attempts"]] == [
            (1, "first", 1), (2, "resumed", 11), (3, "resumed", 21)], run["attempts"]
        pages = eventually(lambda: [r.body.decode() for r in slack.accepted()
                                    if b"TrainingHung" in r.body], timeout=30)
        firing = [p for p in pages if "esolved" not in p]
        assert len(firing) == 1, pages
        assert f"restart all {RANKS} ranks from checkpoint 20" in firing[0]


def _completed(url: str, run_id: str) -> dict:
    run = httpx.get(f"{url}/v1/runs/{run_id}").json()
    assert run["status"] == "completed", run.get("status")
    return run
