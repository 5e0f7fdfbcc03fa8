"""Healing under Slurm, for real (issue 43): Debian's munged, slurmctld and one slurmd per
namespace node, one sidecar per node with ``cluster.drain.mode: slurm``. A two-node batch
job (``srun``, one gloo rank per node, tests/e2e/heal_train.py) runs on node0 and node1;
an XID 79 on node1's GPU (its probe) makes the run's leader decide a restart without
node1: node1's sidecar drains its own node with ``scontrol`` (its operator's mode, never a
record's command), every rank exits 75, the batch script requeues the job on 75, and the
requeued job runs on node0 and node2, resumed from the last clean checkpoint, and
completes. Node1 stays drained, with the sidecar's reason."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.eventually import eventually
from tests.netcluster import Cluster
from tests.netcluster.slurm import Slurm, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "tests" / "e2e" / "heal_train.py"
STEPS, EVERY, FAULT = 40, 5, 22
# The batch script the docs give (docs/actions.md, "Launchers"), with the rank wiring a
# srun job without torchrun needs; it requeues itself when the job exits 75.
JOB = """#!/bin/sh
export MONITOR_AGENT_RESTARTS=1 MONITOR_AGENT_RUN_ID=heal-slurm OMP_NUM_THREADS=1
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
export MASTER_PORT=29513
srun --ntasks-per-node=1 sh -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=0 \\
    exec {python} {train} --url http://127.0.0.1:9400 --run-id heal-slurm --out {out} \\
    --steps {steps} --ckpt-every {every} --fault xid --fault-rank 1 --fault-step {fault} \\
    --watchdog-floor 3 --step-time 0.1'
rc=$?
echo "run ${{SLURM_RESTART_COUNT:-0}} exit $rc on $SLURM_JOB_NODELIST" >> {out}/batch.log
if [ $rc -eq 75 ]; then scontrol requeue "$SLURM_JOB_ID"; fi
exit $rc
"""
RULES = """
routes: {page: [console]}
rules:
  - {name: RestartOnGpuFault, match: {types: [gpu_health], min_severity: critical},
     severity: critical, fingerprint: [], cooldown: 30m, action: restart}
"""


@pytest.fixture
def slurm_cluster(tmp_path: Path, privileged: None) -> Iterator[tuple[Cluster, Slurm]]:
    why = unavailable()
    if why:
        pytest.skip(f"{why} (.ci/run installs them)")
    with Cluster(tmp_path / "cluster", nodes=3) as cluster:
        slurm = cluster.start_slurm()
        (tmp_path / "rules.yaml").write_text(RULES)
        cluster.start_sidecars(
            {"alerting": {"rules_file": str(tmp_path / "rules.yaml"),
                          "group_wait_seconds": 0.2},
             "cluster": {"drain": {"mode": "slurm"}}},
            env={"SLURM_CONF": str(slurm.conf), "PATH": os.environ.get("PATH", "")})
        yield cluster, slurm


def test_a_node_left_out_is_drained_and_the_requeued_job_runs_without_it(
        slurm_cluster: tuple[Cluster, Slurm], tmp_path: Path) -> None:
    cluster, slurm = slurm_cluster
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(JOB.format(python=sys.executable, train=TRAIN, out=out, steps=STEPS,
                                 every=EVERY, fault=FAULT))
    env_path = os.pathsep.join([str(REPO), str(REPO / "client")])
    job = slurm.sbatch(script, "--nodes=2", "--requeue",
                       f"--export=ALL,PYTHONPATH={env_path},"
                       f"MONITOR_AGENT_TOKEN={cluster.sidecars.token}",
                       f"--output={tmp_path}/slurm-%j.out")
    first = eventually(lambda: slurm.job(job) if slurm.job(job)["JobState"] == "RUNNING"
                       else None, timeout=120, interval=0.5, what="the job running",
                       context=slurm.logs)
    # select/linear places it on the first idle nodes: node0 (the run's leader's) and
    # node1, whose rank 1 (SLURM_PROCID) has the faulty GPU.
    assert slurm.hostnames(first["NodeList"]) == ["node0", "node1"], first["NodeList"]

    def requeued() -> dict[str, str]:
        info = slurm.job(job)
        assert info.get("Restarts") == "1" and info["JobState"] == "PENDING", info["JobState"]
        return info
    eventually(requeued, timeout=300, interval=0.5, what="the job requeued by its script",
               context=lambda: slurm.logs() + cluster.sidecars.logs())
    # Slurm holds a requeued job 121 s (for a failing node to settle): no need here.
    slurm.start_now(job, time.time())
    done = eventually(lambda: slurm.job(job) if slurm.job(job)["JobState"] == "COMPLETED"
                      else None, timeout=300, interval=1.0, what="the requeued job done",
                      context=lambda: slurm.logs() + (out / "batch.log").read_text())
    assert done is not None
    assert sorted(slurm.hostnames(done["NodeList"])) == ["node0", "node2"]
    assert slurm.node_states()["node1"] in ("drain", "drng")
    reason = slurm.node("node1")["Reason"]
    assert reason.startswith("monitor-agent"), reason
    node1 = cluster.sidecars.get(1, "/v1/node")
    assert node1["drained"] and node1["outcome"] == "done", node1

    [left] = cluster.sidecars.get(0, "/v1/runs/heal-slurm/actions")["actions"]
    assert left["action"] == "exclude" and [n["node"] for n in left["plan"]["exclude"]] == [1]
    # The last clean checkpoint before the step the XID was read at: the client samples
    # NVML each second (ten steps here), so that step may be some after FAULT.
    resumed_at, seen_at = left["plan"]["checkpoint_step"], left["plan"]["fault_step"]
    assert seen_at >= FAULT and resumed_at is not None
    assert seen_at - EVERY <= resumed_at < seen_at, (resumed_at, seen_at)
    for rank in (0, 1):
        lines = (out / f"steps-r{rank}.log").read_text().splitlines()
        assert f"resume 1 {resumed_at} {resumed_at} plan" in lines, lines[-5:]
        after = [line for line in lines if line.startswith("1 ")]
        assert [int(line.split()[1]) for line in after] == list(range(resumed_at + 1,
                                                                       STEPS + 1))
    weights = {(out / f"weights-r{r}.txt").read_text() for r in (0, 1)}
    assert len(weights) == 1
    assert (out / "batch.log").read_text().count("exit 75") == 1
