"""Healing without a person (issue 43) on the namespace cluster: three nodes, one sidecar
each, a torchrun elastic job across them (``--nnodes=2:3``, ``--max-restarts=3``, a rank
per node) whose script resumes where the monitor's restart says (``mon.resume_plan``). Two
jobs, a few faults each:

- a rank SIGSTOPped (frozen: no hang report of its own): the others report the hang, the
  leader restarts every rank from the last clean checkpoint, node 1 is not left out (one
  incident); later in the same job an XID 79 on node 2's GPU (the fake NVML): the job
  restarts without node 2, which its sidecar drains; nodes 0 and 1 finish the job;
- a NaN on node 1, twice: the first incident restarts the job from the clean checkpoint
  before it, the second, on the same node within the hour, leaves node 1 out.

For each: every node still in the job exits 0, no person acting; every rank ends with the
same weights; every step after a resume follows the checkpoint it resumed from; exactly one
page per incident, saying what was done. Five launches of three processes in all (one job
each fault would be seven of six: this proves the same at half the CPU); bench/heal.py
measures the same under a longer schedule."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.eventually import eventually
from tests.netcluster import Cluster
from tests.netcluster.elastic import ElasticJob
from tests.receivers import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, EVERY = 60, 10
LONG = 90  # the two-fault job: the XID comes 60 steps before its end (read every second)
RULES = """
routes: {page: [slack]}
rules:
  - {name: RestartOnHang, match: {types: [hang]}, severity: critical, fingerprint: [],
     cooldown: 30m, resolve_after: 30s, action: restart}
  - {name: RestartOnGpuFault, match: {types: [gpu_health], min_severity: critical},
     severity: critical, fingerprint: [], cooldown: 30m, resolve_after: 30s, action: restart}
  - {name: RestartOnNaN, match: {types: [nan_inf]}, severity: critical, fingerprint: [],
     cooldown: 60s, resolve_after: 30s, action: restart}
"""


@pytest.fixture(scope="module")
def healing(tmp_path_factory: pytest.TempPathFactory,
            privileged: None) -> Iterator[tuple[Cluster, Receiver]]:
    tmp = tmp_path_factory.mktemp("heal")
    with Cluster(tmp, nodes=3) as cluster, Receiver("slack", host=cluster.bridge_ip) as slack:
        (tmp / "rules.yaml").write_text(RULES)
        cluster.start_sidecars({
            "detectors": {"hang_settle_seconds": 1.0, "hang_repeat_seconds": 5.0},
            "alerting": {"rules_file": str(tmp / "rules.yaml"), "group_wait_seconds": 0.2,
                         "slack": {"webhook_url": f"{slack.url}/hook",
                                   "min_interval_seconds": 0}}})
        yield cluster, slack


@pytest.fixture(autouse=True)
def _one_job_at_a_time(healing: tuple[Cluster, Receiver]) -> Iterator[None]:
    """A job a failed test left running is ended before the next test's faults are set."""
    yield
    for job in healing[0].jobs:
        job.kill()


def _job(cluster: Cluster, run: str, steps: int = STEPS) -> ElasticJob:
    return cluster.elastic_job(run, steps=steps, checkpoint_every=EVERY, max_restarts=3,
                               min_nodes=2, nproc_per_node=1, script_args=[
                                   "--step-time=0.1", "--watchdog-floor=3",
                                   "--collective-timeout=600"])


def _pages(slack: Receiver, run: str) -> list[str]:
    texts = [r.json["text"] for r in slack.requests if isinstance(r.json, dict)]
    return [t for t in texts if f"run {run}" in t and "RESOLVED" not in t]


def _actions(cluster: Cluster, run: str) -> list[dict[str, Any]]:
    assert cluster.sidecars is not None
    found: list[dict[str, Any]] = cluster.sidecars.get(0, f"/v1/runs/{run}/actions")["actions"]
    return found


def _follows_its_checkpoints(job: ElasticJob, resumes: int) -> None:
    """Every resume loaded what was saved, each rank trained every step from it on without
    a gap (until the next restart, or the end), and every rank ends with the same weights."""
    saved = {e["step"]: e["digest"] for e in job.events("checkpoint")}
    found = job.events("resume")
    # One resume per restart, each from the monitor's plan (torchrun's restart count is per
    # agent: a node whose group restarts for another's membership change keeps its own).
    plans = {e["plan"] for e in found}
    assert len(plans) == resumes and None not in plans, found
    last = max(plans)
    for r in found:
        assert r["digest"] == r["saved_digest"] == saved[r["step"]], r
        steps = [e["step"] for e in job.events("step") if e["pid"] == r["pid"]]
        end = job.steps if r["plan"] == last else r["step"] + len(steps)
        assert steps == list(range(r["step"] + 1, end + 1)), (r["pid"], steps[:5])
    finals = job.finals()
    assert len({f["digest"] for f in finals.values()}) == 1, finals
    assert {f["step"] for f in finals.values()} == {job.steps}


def _resumed_at(job: ElasticJob, plan: int, step: int) -> bool:
    """Whether the processes that resumed from restart ``plan`` trained up to ``step``."""
    resumed = {r["pid"] for r in job.events("resume") if r["plan"] == plan}
    return any(e["step"] >= step and e["pid"] in resumed for e in job.events("step"))


def test_a_frozen_rank_restarts_every_rank_then_an_xid_79_leaves_its_node_out(healing) -> None:
    cluster, slack = healing
    job = _job(cluster, "heal-stop-xid", steps=LONG).start()
    job.wait_step(20, timeout=300)
    cluster.faults.stop_rank(node=1, local_rank=0)

    def restarted() -> dict[str, Any]:
        found = _actions(cluster, "heal-stop-xid")
        assert len(found) == 1 and _resumed_at(job, found[0]["id"], 30), found
        return found[0]

    restart = eventually(restarted, timeout=400, interval=0.5, what="the restarted job at "
                         "step 30", context=job.logs)
    assert restart["action"] == "restart" and restart["plan"]["exclude"] == [], restart
    assert restart["honoured_step"] == restart["plan"]["checkpoint_step"] + 1
    cluster.faults.xid(node=2, code=79)
    codes = job.wait(timeout=600)
    assert (codes[0], codes[1]) == (0, 0) and codes[2] != 0, (codes, job.logs())
    first, left = _actions(cluster, "heal-stop-xid")
    assert first["id"] == restart["id"] and left["action"] == "exclude", left
    assert [n["node"] for n in left["plan"]["exclude"]] == [2]
    assert "hard GPU error (xid 79)" in left["plan"]["exclude"][0]["why"]
    _follows_its_checkpoints(job, resumes=2)
    assert {e["plan"] for e in job.events("resume")} == {restart["id"], left["id"]}
    assert {f["world"] for f in job.finals().values()} == {2}  # re-formed on nodes 0 and 1
    pages = eventually(lambda: _pages(slack, "heal-stop-xid"), timeout=30)
    assert len(pages) == 2, pages
    assert "restart all 3 ranks from checkpoint" in pages[0], pages
    assert "node 2 (node2) left out" in pages[1], pages
    node2 = cluster.sidecars.get(2, "/v1/node")
    assert node2["drained"] and node2["run_id"] == "heal-stop-xid", node2
    for node in (0, 1):
        assert cluster.sidecars.get(node, "/v1/node")["drained"] is False
    cleared = httpx.delete(f"{cluster.sidecars[2].url}/v1/node/drain", timeout=10,
                           headers={"Authorization": f"Bearer {cluster.sidecars.token}"})
    assert cleared.status_code == 200 and not cleared.json()["drained"]


def test_a_nan_on_the_same_node_twice_leaves_that_node_out(healing) -> None:
    cluster, slack = healing
    job = _job(cluster, "heal-nan")
    cluster.faults.nan(node=1, step=24, local_rank=0)
    cluster.faults.nan(node=1, step=44, local_rank=0)
    job.start()
    codes = job.wait(timeout=600)
    assert (codes[0], codes[2]) == (0, 0) and codes[1] != 0, (codes, job.logs())
    first, second = _actions(cluster, "heal-nan")
    assert (first["action"], first["plan"]["exclude"]) == ("restart", []), first
    assert second["action"] == "exclude", second
    assert [n["node"] for n in second["plan"]["exclude"]] == [1]
    assert "2nd incident on it within 1 h" in second["plan"]["exclude"][0]["why"]
    _follows_its_checkpoints(job, resumes=2)
    pages = eventually(lambda: _pages(slack, "heal-nan"), timeout=30)
    assert len(pages) == 2, pages


def test_a_job_that_leaves_the_leaders_machine_out_keeps_one_brain(healing) -> None:
    """An XID 79 on node 0, the machine of group rank 0 and of the run's leader sidecar:
    node 0 is left out, the job re-forms on nodes 1 and 2 (the rendezvous store on a host
    outside the job, as a job that may lose any node runs it) with group rank 0 on node 1,
    and the run stays one run on node 0's sidecar (``cluster.leader_url``: it is alive, only
    its GPU failed): one page for the fault, both attempts in its history, the run
    completed there at the last step."""
    cluster, slack = healing
    run = "heal-leader"
    job = cluster.elastic_job(run, steps=STEPS, checkpoint_every=EVERY, max_restarts=3,
                              min_nodes=2, nproc_per_node=1, rdzv_host=cluster.bridge_ip,
                              script_args=["--step-time=0.1", "--watchdog-floor=3",
                                           "--collective-timeout=600"]).start()
    job.wait_step(20, timeout=300)
    assert {e["hostname"] for e in job.events("start") if e["group_rank"] == 0} == {"node0"}
    cluster.faults.xid(node=0, code=79)
    codes = job.wait(timeout=600)
    assert (codes[1], codes[2]) == (0, 0) and codes[0] != 0, (codes, job.logs())
    [left] = _actions(cluster, run)
    assert left["action"] == "exclude" and [n["node"] for n in left["plan"]["exclude"]] == [0]
    _follows_its_checkpoints(job, resumes=1)
    resumed = {r["pid"] for r in job.events("resume")}
    moved = {e["hostname"] for e in job.events("start")
             if e["group_rank"] == 0 and e["pid"] in resumed}
    assert moved == {"node1"}, job.events("start")  # group rank 0 is another machine now
    assert {f["world"] for f in job.finals().values()} == {2}
    assert cluster.sidecars is not None

    def completed() -> dict[str, Any]:
        detail: dict[str, Any] = cluster.sidecars.get(0, f"/v1/runs/{run}")
        assert detail["status"] == "completed" and detail["last_step"] == STEPS, detail
        return detail
    detail = eventually(completed, timeout=60, what="the run completed on its leader")
    assert [a["number"] for a in detail["attempts"]] == [1, 2], detail["attempts"]
    pages = eventually(lambda: _pages(slack, run), timeout=30)
    # Every sidecar pages to this receiver: one page is one brain (no node sidecar judged
    # the re-formed job on its own).
    assert len(pages) == 1 and "node 0 (node0) left out" in pages[0], pages
