"""A torchrun elastic job across three namespace nodes, one sidecar per node as
docs/scaling-out.md deploys them, and one rank SIGKILLed mid-run: torchrun's own
``--max-restarts`` restarts the whole group (no monitor action), every rank resumes from
the last checkpoint, the job completes with exit 0 and every rank ends with the same
weights; the leader sidecar holds every rank's records as one run, its second attempt a
resume. One job serves the module (about a minute of CPU on an idle 2-core machine)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from eventually import eventually
from netcluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RUN = "elastic-kill"
STEPS, EVERY, KILL_AT = 60, 10, 25


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, privileged: None) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("elastic"), nodes=3) as cluster:
        cluster.start_sidecars()
        yield cluster


@pytest.fixture(scope="module")
def killed(cluster: Cluster) -> dict[str, Any]:
    """The job, its rank local 0 of node 1 SIGKILLed once a checkpoint is behind it."""
    job = cluster.elastic_job(RUN, steps=STEPS, checkpoint_every=EVERY, max_restarts=2,
                              script_args=["--step-time=0.1"])
    job.start()
    job.wait_step(KILL_AT, timeout=300)
    checkpoints = [e["step"] for e in job.events("checkpoint")]
    pid = cluster.faults.kill_rank(node=1, local_rank=0)
    codes = job.wait(timeout=400)
    return {"job": job, "codes": codes, "pid": pid, "saved_before_kill": max(checkpoints)}


def test_the_job_completes_after_torchrun_restarts_the_group(killed: dict[str, Any]) -> None:
    job = killed["job"]
    assert killed["codes"] == {0: 0, 1: 0, 2: 0}, job.logs()
    starts = job.events("start")
    assert killed["pid"] in {e["pid"] for e in starts}
    # every rank of every node started twice: the whole group restarted, not the one rank
    by_rank: dict[int, int] = {}
    for e in starts:
        by_rank[e["rank"]] = by_rank.get(e["rank"], 0) + 1
    assert by_rank == {r: 2 for r in range(6)}, by_rank


def test_every_step_after_the_restart_follows_the_last_checkpoint(
        killed: dict[str, Any]) -> None:
    job = killed["job"]
    resumes = job.events("resume")
    assert len(resumes) == 6
    saved = {e["step"]: e["digest"] for e in job.events("checkpoint")}
    for r in resumes:
        # at least the one saved before the kill (a later one may have landed before the
        # agents stopped the group), and exactly the weights that were saved
        assert r["step"] >= killed["saved_before_kill"]
        assert r["digest"] == r["saved_digest"] == saved[r["step"]]
    resumed_pids = {e["pid"]: e["step"] for e in resumes}
    for pid, step in resumed_pids.items():
        steps = [e["step"] for e in job.events("step") if e["pid"] == pid]
        assert steps == list(range(step + 1, STEPS + 1)), (pid, steps[:5])
    finals = job.finals()
    assert sorted(finals) == list(range(6))
    assert len({f["digest"] for f in finals.values()}) == 1, finals  # one model at the end
    assert {f["step"] for f in finals.values()} == {STEPS}


def test_the_leader_sidecar_sees_every_rank_as_one_run(
        cluster: Cluster, killed: dict[str, Any]) -> None:
    sidecars = cluster.sidecars
    assert sidecars is not None

    def completed() -> dict[str, Any]:
        run = sidecars.get(0, f"/v1/runs/{RUN}")
        assert run["status"] == "completed" and run["last_step"] == STEPS, run["status"]
        assert set(run["ranks"]) == {str(r) for r in range(6)}, sorted(run["ranks"])
        return run

    run = eventually(completed, timeout=60, what="the leader's view of the run",
                     retry_on=(httpx.HTTPError,), context=sidecars.logs)
    assert [a["kind"] for a in run["attempts"]] == ["first", "resumed"], run["attempts"]
    assert run["attempts"][1]["start_step"] > killed["saved_before_kill"]
    assert run["run"]["cluster"]["nodes"] == 3
    # each node's sidecar holds its own two ranks' records; node 0's leads the run
    for node in (1, 2):
        local = sidecars.get(node, f"/v1/runs/{RUN}")
        assert set(local["ranks"]) == {str(2 * node), str(2 * node + 1)}, local["ranks"]
