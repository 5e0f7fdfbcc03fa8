"""Leaving a sick node out, on real parts: three real sidecars on loopback (node 0's, the
run's leader, and nodes 1 and 2's), fed the records a six-rank job's clients send (two
ranks per node, each to its own node's sidecar). An XID 79 on node 2's GPU makes the
leader decide one restart without node 2; node 2's sidecar, and only it, drains its node
with the command its operator configured; the job re-forms on nodes 0 and 1 (node ranks
as torchrun's re-rendezvous gives them), the leader's view of it is whole again, and a
later hang of the smaller job is decided on, not held as partial."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.alerting.heal_records import (
    RESTART_RULES,
    actions,
    checkpoint,
    hang,
    post,
    run_record,
    sidecar,
    step,
    texts,
)
from tests.eventually import eventually
from tests.receivers import Receiver

ELASTIC = {"name": "torchrun", "restarts": True, "restart_count": 0, "max_restarts": 3,
           "min_nodes": 1, "max_nodes": 3}


def _drain_command(tmp: Path) -> list[str]:
    """The operator's drain: write what the sidecar passes (a stand-in for a scheduler)."""
    script = ("import os, sys; open(sys.argv[1], 'w').write(os.environ"
              "['MONITOR_AGENT_DRAIN_NODE'] + '|' + os.environ['MONITOR_AGENT_DRAIN_REASON'])")
    return [sys.executable, "-c", script, str(tmp / "drained-by-command")]


def _records(attempt: int, ranks: int, placement: dict[int, int], steps: range,
             leader: str, ckpt: int | None = None, gpu: dict[int, dict] | None = None
             ) -> dict[int, list[dict[str, Any]]]:
    """Each node's records: run records at the first step, then steps (``placement``: rank
    -> node rank in this attempt)."""
    nodes = len(set(placement.values()))
    out: dict[int, list[dict[str, Any]]] = {}
    for s in steps:
        for rank, node in placement.items():
            batch = out.setdefault(node, [])
            if s == steps.start:
                # A watchdog slow to judge a rank gone: the hangs here are the ones posted
                # (a loaded machine's gaps between two posts are not a dead rank).
                record = run_record(rank, ranks, attempt, launcher=ELASTIC, leader=leader,
                                    watchdog_floor=30.0)
                record["labels"] = {"hostname": f"gpu-node-{node}"}
                record["cluster"] = {"node_rank": node, "nodes": nodes, "local_world_size": 2,
                                     "leader_url": leader}
                batch.append(record)
            extra = {"gpu": (gpu or {}).get(rank, {"xid_count": 0})} if gpu is not None else {}
            batch.append(step(rank, s, attempt, **extra))
            if ckpt is not None and s == ckpt and rank == 0:
                batch.append(checkpoint(s, attempt))
    return out


def _xid_after_a_clean_save(urls: dict[int, str], xid_rank: int) -> None:
    """A 3 x 2 job (node n: ranks 2n, 2n+1) trains steps 1-10 on its machines' sidecars,
    saves at step 10, the leader hears every rank, then steps 11-13 read an XID 79 on
    ``xid_rank``'s GPU."""
    leader = urls[0]
    placement = {r: r // 2 for r in range(6)}
    for node, batch in _records(1, 6, placement, range(1, 11), leader, ckpt=10,
                                gpu={}).items():
        post(urls[node], batch)
    # Everyone heard: the leader's view is whole before the fault.
    eventually(lambda: httpx.get(f"{leader}/v1/runs/heal", timeout=5).json()
               ["ranks"].keys() >= {str(r) for r in range(6)}, timeout=20)
    xid = {xid_rank: {"xid_count": 1, "xid_last": 79}}
    for node, batch in _records(1, 6, placement, range(11, 14), leader, gpu=xid).items():
        post(urls[node], [r for r in batch if r["kind"] != "run"])


def test_an_xid_on_node_2_restarts_the_job_without_it_and_only_node_2_is_drained(tmp_path):
    with Receiver("slack") as slack, \
            sidecar(tmp_path / "n0", slack) as lead, \
            sidecar(tmp_path / "n1", slack, leader_url=lead.url) as n1, \
            sidecar(tmp_path / "n2", slack, leader_url=lead.url,
                    drain={"mode": "command", "command": _drain_command(tmp_path)}) as n2:
        urls = {0: lead.url, 1: n1.url, 2: n2.url}
        _xid_after_a_clean_save(urls, xid_rank=4)

        def decided() -> dict:
            found = [a for a in actions(lead.url) if a["action"] in ("exclude", "stop")]
            assert found, actions(lead.url)
            return found[0]
        excluded = eventually(decided, timeout=30, what="the exclusion")
        assert excluded["action"] == "exclude", excluded
        plan = excluded["plan"]
        assert [(n["node"], n["host"], n["ranks"]) for n in plan["exclude"]] == [
            (2, "gpu-node-2", [4, 5])]
        assert plan["checkpoint_step"] == 10 and plan["ranks"] == 6 and plan["nodes"] == 3
        assert "node 2 (gpu-node-2) left out: hard GPU error (xid 79) at step 11" in \
            excluded["message"]
        # Every node's ranks learn it from their own sidecar.
        for url in (n1.url, n2.url):
            eventually(lambda u=url: [a["id"] for a in actions(u)] == [excluded["id"]],
                       timeout=20)

        # Node 2 drains itself with its operator's command; nodes 0 and 1 do not.
        drained = eventually(lambda: (tmp_path / "drained-by-command").read_text(),
                             timeout=20)
        assert drained.startswith(httpx.get(f"{n2.url}/v1/node").json()["node_name"] + "|")
        assert "hard GPU error (xid 79) at step 11" in drained
        node2 = eventually(lambda: httpx.get(f"{n2.url}/v1/node").json(), timeout=10)
        assert node2["drained"] and node2["run_id"] == "heal" and \
            node2["action_id"] == excluded["id"]
        eventually(lambda: httpx.get(f"{n2.url}/v1/node").json()["outcome"] == "done",
                   timeout=20)
        assert "monitor_agent_node_drained 1.0" in httpx.get(f"{n2.url}/metrics").text
        for url in (lead.url, n1.url):
            assert httpx.get(f"{url}/v1/node").json()["drained"] is False

        # The job re-forms on machines 0 and 1 (4 ranks), resumed from step 10.
        again = {r: r // 2 for r in range(4)}
        for node, batch in _records(2, 4, again, range(11, 16), lead.url).items():
            post(urls[node], batch)
        eventually(lambda: [a for a in actions(lead.url) if a["id"] == excluded["id"]
                            and a["honoured_step"] == 11], timeout=20)
        # A hang of the re-formed job: decided on (its view is whole: node 2 is not
        # missed), from the job as it is now.
        post(urls[0], [hang(0, 15, attempt=2)])

        def restart() -> dict:
            found = [a for a in actions(lead.url) if a["id"] > excluded["id"]]
            assert found, actions(lead.url)
            return found[0]
        second = eventually(restart, timeout=60, what="the second decision")
        assert second["action"] == "restart", second
        assert (second["plan"]["ranks"], second["plan"]["nodes"]) == (4, 2), second["plan"]
        assert second["honoured_step"] is None  # no relaunch has carried it out yet
        pages = [t for t in texts(slack) if "partial view" in t]
        assert not pages, pages


def test_the_drain_is_kept_across_a_restart_of_the_sidecar_and_cleared_by_an_operator(
        tmp_path):
    from monitor_agent.cluster.drain import DrainSettings, NodeDrain

    drain = NodeDrain(DrainSettings(), tmp_path)
    assert drain.drain("job", 3, "hard GPU error (xid 79)") is True
    assert drain.drain("job", 3, "again") is False  # the same decision, adopted twice
    with Receiver("slack") as slack, sidecar(tmp_path, slack, rules=RESTART_RULES) as srv:
        node = httpx.get(f"{srv.url}/v1/node").json()
        assert (node["drained"], node["action_id"], node["outcome"]) == (True, 3, "recorded")
        cleared = httpx.delete(f"{srv.url}/v1/node/drain")
        assert cleared.status_code == 200 and cleared.json()["drained"] is False
        assert httpx.get(f"{srv.url}/v1/node").json()["drained"] is False
    assert not (tmp_path / "drained.json").exists()


def test_a_job_that_leaves_the_leaders_own_node_out_stays_one_run_on_that_leader(tmp_path):
    """An XID 79 on node 0's GPU: node 0 (the leader sidecar's machine, alive) is left out,
    and the job re-forms on machines 1 and 2, which torchrun now numbers 0 and 1. The
    leader (``cluster.leader_url`` on the node sidecars) keeps the run: it takes the
    re-formed job's node 0 from machine 1's sidecar, hears every rank of it, decides
    nothing more, and the run completes there: one run, one brain, one page."""
    with Receiver("slack") as slack, \
            sidecar(tmp_path / "n0", slack) as lead, \
            sidecar(tmp_path / "n1", slack, leader_url=lead.url) as n1, \
            sidecar(tmp_path / "n2", slack, leader_url=lead.url) as n2:
        urls = {0: lead.url, 1: n1.url, 2: n2.url}
        _xid_after_a_clean_save(urls, xid_rank=0)
        excluded = eventually(lambda: [a for a in actions(lead.url)][0], timeout=30,
                              what="the exclusion")
        assert excluded["action"] == "exclude" and [
            n["node"] for n in excluded["plan"]["exclude"]] == [0], excluded
        for url in (n1.url, n2.url):
            eventually(lambda u=url: [a["id"] for a in actions(u)] == [excluded["id"]],
                       timeout=20)

        # Re-formed on machines 1 and 2: node ranks 0 and 1 now, world 4.
        machine = {0: 1, 1: 2}  # the new node rank -> the machine (sidecar) it runs on
        again = {r: r // 2 for r in range(4)}
        for node, batch in _records(2, 4, again, range(11, 31), lead.url).items():
            for record in batch:
                if record["kind"] == "run":
                    record["labels"] = {"hostname": f"gpu-node-{machine[node]}"}
            post(urls[machine[node]], batch)

        def heard() -> dict:
            detail: dict = httpx.get(f"{lead.url}/v1/runs/heal", timeout=5).json()
            assert detail["last_step"] == 30, detail.get("last_step")
            assert {r: v["last_step"] for r, v in detail["ranks"].items()
                    if r in {"0", "1", "2", "3"}} == {str(r): 30 for r in range(4)}, \
                detail["ranks"]
            return detail
        eventually(heard, timeout=30, what="the re-formed job heard whole on its leader")
        assert [a["honoured_step"] for a in actions(lead.url)] == [11]
        for node in (0, 1):
            post(urls[machine[node]], [
                {"kind": "end", "run_id": "heal", "rank": r, "step": 30, "time": time.time(),
                 "attempt": f"a2r{r}", "status": "completed"} for r, n in again.items()
                if n == node])
        done = eventually(lambda: httpx.get(f"{lead.url}/v1/runs/heal", timeout=5).json()
                          if httpx.get(f"{lead.url}/v1/runs/heal", timeout=5).json()
                          ["status"] == "completed" else None, timeout=30,
                          what="the run completed on its leader")
        assert done is not None
        assert [a["id"] for a in actions(lead.url)] == [excluded["id"]]
        pages = [t for t in texts(slack) if "RESOLVED" not in t]
        assert len(pages) == 1 and "node 0 (gpu-node-0) left out" in pages[0], pages
