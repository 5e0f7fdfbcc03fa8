"""A fail-slow node left out once leaving it out pays (issue 43's fail-slow case, acted on
the sick-node judgement of issue 44) on the namespace cluster: three nodes, one sidecar
each, a torchrun elastic job across them (``--nnodes=2:3``, a rank per node), the sidecars
running the packaged ``ExcludeFailSlowNode`` rule (monitor_agent/default_rules.yaml).

First a rank is SIGKILLed and torchrun restarts the group on its own: the job has measured
what one restart costs it (runs/ettr.py: the relaunch and the work re-done), the price the
node verdict weighs a slow node against. Then node 2's CPU is throttled (a cgroup quota
held at a factor against the other ranks' compute, netcluster/throttle.py). The leader
names node 2 sick (compute-slow), prices it (its straggler tax so far against that measured
restart), and once the tax paid reaches it (ski rental) leaves node 2 out: the others
re-form without it, resume from the last clean checkpoint and finish with exit 0; one alert
for the incident, saying what was done, and its resolve what it cost."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.eventually import eventually
from tests.netcluster import Cluster
from tests.netcluster.elastic import ElasticJob
from tests.receivers import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

RUN = "heal-failslow"
STEPS, EVERY = 2000, 10
FACTOR = 6.0  # node 2's compute this many times the others': a throttled host, not noise


def _rules() -> str:
    """The packaged example rule, as a user copies it out of default_rules.yaml."""
    from importlib.resources import files

    text = (files("monitor_agent") / "default_rules.yaml").read_text()
    start = text.index("  # - name: ExcludeFailSlowNode")
    block = []
    for line in text[start:].splitlines():
        if not line.startswith("  # "):
            break
        block.append(line.replace("  # ", "  ", 1))
    rule = "\n".join(ln for ln in block if ln.strip() and not ln.lstrip().startswith("#"))
    return "routes: {page: [slack], chat: [slack]}\nrules:\n" + rule + "\n"


@pytest.fixture(scope="module")
def failslow(tmp_path_factory: pytest.TempPathFactory,
             privileged: None) -> Iterator[tuple[Cluster, Receiver]]:
    tmp = tmp_path_factory.mktemp("failslow")
    with Cluster(tmp, nodes=3) as cluster, Receiver("slack", host=cluster.bridge_ip) as slack:
        (tmp / "rules.yaml").write_text(_rules())
        cluster.start_sidecars({
            "detectors": {"hang_settle_seconds": 1.0, "hang_repeat_seconds": 5.0,
                          "repeat_every_steps": 50},
            "alerting": {"rules_file": str(tmp / "rules.yaml"), "group_wait_seconds": 0.2,
                         "slack": {"webhook_url": f"{slack.url}/hook",
                                   "min_interval_seconds": 0}}})
        yield cluster, slack


def _actions(cluster: Cluster) -> list[dict[str, Any]]:
    assert cluster.sidecars is not None
    found: list[dict[str, Any]] = cluster.sidecars.get(0, f"/v1/runs/{RUN}/actions")["actions"]
    return found


def _texts(slack: Receiver) -> list[str]:
    return [r.json["text"] for r in slack.requests if isinstance(r.json, dict)
            and f"run {RUN}" in r.json["text"]]


def test_a_throttled_node_is_left_out_once_its_straggler_tax_paid_a_measured_restart(
        failslow) -> None:
    cluster, slack = failslow
    job: ElasticJob = cluster.elastic_job(
        RUN, steps=STEPS, checkpoint_every=EVERY, max_restarts=3, min_nodes=2,
        nproc_per_node=1, script_args=["--step-time=0.02", "--width=384", "--batch=128",
                                       "--watchdog-floor=10", "--collective-timeout=600"])
    job.start()
    try:
        job.wait_step(15, timeout=300)
        cluster.faults.kill_rank(node=1)  # torchrun restarts the group: a measured restart
        eventually(lambda: len({e["attempt"] for e in job.events("start")}) > 1
                   and max(e["step"] for e in job.events("step")) >= 40,
                   timeout=300, interval=1.0, what="the relaunched job at step 40",
                   context=job.logs)
        held = cluster.faults.throttle(node=2, factor=FACTOR, job=job)

        def left_out() -> dict[str, Any]:
            found = [a for a in _actions(cluster) if a["action"] == "exclude"]
            assert found, _actions(cluster)
            return found[0]
        excluded = eventually(left_out, timeout=600, interval=2.0,
                              what="node 2 left out", context=job.logs)
        cluster.faults.unthrottle(node=2)
        codes = job.wait(timeout=600)
    finally:
        cluster.faults.stop_controllers()
        job.kill()
    assert (codes[0], codes[1]) == (0, 0) and codes[2] != 0, (codes, job.logs())
    assert held.achieved is not None and held.achieved > 1.5, held
    assert [a["action"] for a in _actions(cluster)] == ["exclude"]  # torchrun's own restart
    plan = excluded["plan"]
    assert [n["node"] for n in plan["exclude"]] == [2], plan
    why = plan["exclude"][0]["why"]
    # A CPU quota stalls the process wherever it runs, its all-reduce too: its lateness
    # reads as its own compute or as late to the collective ("its link, or its host"),
    # as the window falls. Which of the two is issue 44's cause accuracy
    # (bench/fault_suite.py); what this test holds is that the node is sick of being
    # slow and that leaving it out paid.
    assert re.search(r"sick \((compute|network)-slow\)", why), why
    assert "(measured): leaving it out pays" in why, why
    # Resumed from the clean checkpoint the plan named, and trained every step from it on.
    resumed = [r for r in job.events("resume") if r["plan"] == excluded["id"]]
    assert resumed and {r["step"] for r in resumed} == {plan["checkpoint_step"]}, resumed
    for r in resumed:
        steps = [e["step"] for e in job.events("step") if e["pid"] == r["pid"]]
        assert steps == list(range(r["step"] + 1, STEPS + 1)), (r["pid"], steps[:5])
    finals = job.finals()
    assert {f["world"] for f in finals.values()} == {2}, finals  # re-formed on nodes 0, 1
    assert len({f["digest"] for f in finals.values()}) == 1, finals
    # One incident, one alert (ExcludeFailSlowNode's, about node 2): its first page names
    # the node, its verdict and when leaving it out will pay; people already paged hear of
    # the exclusion when it is decided; its resolve says what it cost. (A later straggler
    # warning about another node of this shared machine is held: one soft signal.)
    resolved = eventually(lambda: [t for t in _texts(slack) if "RESOLVED" in t
                                   and "node 2 (node2) left out" in t], timeout=60,
                          what="the incident resolved")
    (job.dir / "slack.json").write_text(json.dumps(_texts(slack), indent=1))  # to read
    firing = [t for t in _texts(slack) if "RESOLVED" not in t and "Node verdict: node node2"
              in t]
    assert firing and "leaving it out pays in" in firing[0], firing
    assert "left out" not in firing[0] and "node 2 (node2) left out" in firing[-1], firing
    assert len(resolved) == 1 and "this incident cost" in resolved[0], resolved
    drained = cluster.sidecars.get(2, "/v1/node")
    assert drained["drained"] and drained["run_id"] == RUN, drained
