"""Slurm for real on the namespace nodes: Debian's munged, slurmctld and one slurmd per
node. A two-node batch job runs ``srun`` across its nodes; one of them is drained
(``scontrol update NodeName=... State=DRAIN``) and the job requeued: it runs again on
nodes that leave the drained one out, and the drained node stays drained."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.eventually import eventually
from tests.netcluster import Cluster
from tests.netcluster.slurm import Slurm, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOB = """#!/bin/sh
run=${{SLURM_RESTART_COUNT:-0}}
srun --ntasks-per-node=1 hostname | sed "s/^/step $run /" >> {log}
# the first run holds its nodes until it is requeued; the second finishes
[ "$run" -gt 0 ] || sleep 600
"""


@pytest.fixture
def slurm(tmp_path: Path, privileged: None) -> Iterator[Slurm]:
    why = unavailable()
    if why:
        pytest.skip(f"{why} (.ci/run installs them)")
    with Cluster(tmp_path / "cluster", nodes=3) as cluster:
        yield cluster.start_slurm()


def _state(slurm: Slurm, job: int, state: str, restarts: str) -> dict[str, str]:
    info = slurm.job(job)
    assert (info["JobState"], info.get("Restarts")) == (state, restarts), info["JobState"]
    return info


def test_a_drained_node_stays_out_of_the_requeued_job(slurm: Slurm, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    script = tmp_path / "job.sh"
    script.write_text(JOB.format(log=log))
    job = slurm.sbatch(script, "--nodes=2", "--requeue", f"--output={tmp_path}/slurm-%j.out")
    first = eventually(lambda: _state(slurm, job, "RUNNING", "0"), timeout=60, interval=0.5,
                       what="the job running", context=slurm.logs)
    nodes = slurm.hostnames(first["NodeList"])
    assert len(nodes) == 2
    eventually(lambda: log.exists() and log.read_text().count("step 0") == 2, timeout=60,
               what="srun on both nodes", context=slurm.logs)
    sick = nodes[1]
    slurm.drain(sick, "netcluster: XID 79 on GPU 0")
    slurm.requeue(job)
    again = eventually(lambda: _state(slurm, job, "COMPLETED", "1"), timeout=120, interval=0.5,
                       what="the requeued job finished", context=slurm.logs)
    second = slurm.hostnames(again["NodeList"])
    assert len(second) == 2 and sick not in second, second
    lines = log.read_text().splitlines()
    assert sorted(line.split()[-1] for line in lines if line.startswith("step 0 ")) == sorted(nodes)
    assert sorted(line.split()[-1] for line in lines if line.startswith("step 1 ")) == sorted(second)
    assert slurm.node_states()[sick] == "drain"
    assert slurm.node(sick)["Reason"].startswith("netcluster:")
