"""A sidecar restarted from a run's snapshot knows where the run's nodes sit, as before.

A snapshot covers the records up to it, and a restart replays only those after it; the run
records that place the run (its ``cluster``) came first, so they are not replayed. Seen in
tests/e2e/test_multi_node.py: the leader, SIGKILLed and restarted once a snapshot covered
the run records, no longer knew it led a two-node run (it paged its ranks' previews, and
said nothing of a node it did not hear); a node sidecar would stop following its leader and
page every fault itself.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.records import schemas
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store

RUN = "job"
LEADER = "http://gpu-node-0:9400"


def _engine(path: Path, **cluster: object) -> Engine:
    # The sidecar's own MASTER_ADDR names the job's leader host (cluster/placement.py).
    settings = Settings(cluster={"master_addr": "gpu-node-0", **cluster})
    return Engine(settings, Store(str(path)), SelfMetrics(CollectorRegistry()))


def _ingest(engine: Engine, records: list[dict], now: float) -> None:
    engine.ingest([Incoming(i, *schemas.parse_for_store(r)) for i, r in enumerate(records)],
                  now)


def _node(engine: Engine, node: int, now: float) -> None:
    """Node ``node``'s two ranks: run records, steps 1-3, a snapshot, steps 4-5."""
    ranks = (2 * node, 2 * node + 1)
    _ingest(engine, [{"kind": "run", "run_id": RUN, "rank": r, "time": 1.0,
                      "hardware": {"reporting_ranks": 4},
                      "labels": {"hostname": f"gpu-node-{node}"},
                      "cluster": {"node_rank": node, "nodes": 2, "local_world_size": 2,
                                  "leader_url": LEADER}} for r in ranks], now)
    for step in range(1, 6):
        _ingest(engine, [{"kind": "step", "run_id": RUN, "rank": r, "step": step,
                          "time": 1000.0 + step, "loss": 2.0} for r in ranks], now + step)
        if step == 3:
            live = engine.registry.get(RUN)
            assert live is not None
            engine.registry.snapshot(live)


def _restarted(path: Path, **cluster: object) -> Engine:
    engine = _engine(path, **cluster)
    assert engine.recover(2000.0) == 1
    return engine


def test_a_restarted_leader_still_leads_its_two_node_run(tmp_path):
    _node(_engine(tmp_path / "monitor.sqlite"), 0, 1000.0)
    run = _restarted(tmp_path / "monitor.sqlite").registry.get(RUN).state
    assert (run.node, run.leader, run.roster.expected) == (0, None, 2)
    assert run.run is not None and run.run.labels["hostname"] == "gpu-node-0"


def test_a_restarted_node_sidecar_still_follows_its_leader(tmp_path):
    _node(_engine(tmp_path / "monitor.sqlite"), 1, 1000.0)
    engine = _restarted(tmp_path / "monitor.sqlite")
    run = engine.registry.get(RUN).state
    assert (run.node, run.leader) == (1, LEADER)
    assert [(leader, r.run_id, r.node, r.ranks) for leader, r in engine.followed()] == [
        (LEADER, RUN, 1, (2, 3))]


def test_a_node_its_leader_left_out_does_not_page_its_ranks_gone(tmp_path):
    """Node 1's sidecar adopts the leader's restart that leaves node 1 out: its ranks leave,
    and their silence is that decision carried out. Before, node 1's hang detector judged
    them gone a gone-limit later, and (the leader refusing a node out of its placement)
    node 1 paged it as a partial view: a third page for two incidents (seen in
    tests/netcluster/test_heal.py on a loaded machine). A node nobody left out still
    judges its silent ranks gone."""
    from monitor_agent.cluster.drain import DrainSettings, NodeDrain
    from monitor_agent.records.actions import Action, ExcludedNode, RestartPlan

    kept, out = _engine(tmp_path / "kept.sqlite"), _engine(tmp_path / "out.sqlite")
    for engine in (kept, out):  # node 1's two ranks, their watchdog declared
        _ingest(engine, [{"kind": "run", "run_id": RUN, "rank": r, "time": 1.0,
                          "hardware": {"reporting_ranks": 4},
                          "labels": {"hostname": "gpu-node-1"},
                          "watchdog": {"floor_seconds": 3.0, "factor": 10.0},
                          "cluster": {"node_rank": 1, "nodes": 2, "local_world_size": 2,
                                      "leader_url": LEADER}} for r in (2, 3)], 1000.0)
        for step in range(1, 6):
            _ingest(engine, [{"kind": "step", "run_id": RUN, "rank": r, "step": step,
                              "time": 1000.0 + step, "loss": 2.0} for r in (2, 3)],
                    1000.0 + step)
    out.identity, out.node_drain = "node-1-sidecar", NodeDrain(DrainSettings(), tmp_path)
    plan = RestartPlan(cause="xid 79", fault_step=5, ranks=4, nodes=2, checkpoint_step=3,
                       checkpoint_path="/ckpt/3.pt", exclude=(ExcludedNode(
                           node=1, host="gpu-node-1", sidecar="node-1-sidecar",
                           ranks=(2, 3), why="hard GPU error (xid 79) at step 5"),))
    out.acted(RUN, [Action(id=1, run_id=RUN, action="exclude", rule="Exclude", type="gpu_health",
                           step=5, message="", created_at=1006.0, plan=plan)], 1006.0)
    assert out.node_drain.state() is not None
    later = 1006.0 + 3600.0
    assert "its process is gone" in " ".join(f.message for f in kept.tick(later))
    assert [f.to_dict() for f in out.tick(later)] == []


def _job(engine: Engine, token: str, nodes: int, place: dict[int, int], steps: range,
         here: int | None, now: float) -> None:
    """A job's run records and steps as its leader gets them: ``place`` (rank -> node
    rank) ranks of node ``here`` its own, the rest forwarded by their node's sidecar."""
    def item(i: int, record: dict, node: int) -> Incoming:
        return Incoming(i, *schemas.parse_for_store(record),
                        origin=None if node == here else node)
    engine.ingest([item(i, {"kind": "run", "run_id": RUN, "rank": r, "time": 1.0,
                            "attempt": f"{token}{r}",
                            "cluster": {"node_rank": n, "nodes": nodes,
                                        "local_world_size": 2, "leader_url": LEADER}}, n)
                   for i, (r, n) in enumerate(place.items())], now)
    for step in steps:
        engine.ingest([item(i, {"kind": "step", "run_id": RUN, "rank": r, "step": step,
                                "time": now + step, "attempt": f"{token}{r}", "loss": 2.0}, n)
                       for i, (r, n) in enumerate(place.items())], now + step)


def test_a_leader_whose_machine_the_job_left_leads_it_from_afar_across_a_restart(tmp_path):
    """Node 0's machine left out, the job re-forms on the other two (node ranks 0 and 1
    now, every rank forwarded): the sidecar that led it keeps leading it, admits the new
    node 0, and waits for the new job's two nodes; so again when restarted from a
    snapshot taken after the re-formed job's run records."""
    from monitor_agent.pipeline.engine import PeerRun

    path = tmp_path / "monitor.sqlite"
    engine = _engine(path)
    _job(engine, "a", 3, {r: r // 2 for r in range(6)}, range(1, 6), here=0, now=1000.0)
    _job(engine, "b", 2, {r: r // 2 for r in range(4)}, range(4, 9), here=None, now=1100.0)
    engine.registry.snapshot(engine.registry.get(RUN))
    for sidecar in (engine, _restarted(path)):
        run = sidecar.registry.get(RUN).state
        assert sidecar.placement.leads(run) and (run.node, run.roster.expected) == (None, 2)
        assert [sidecar.peers.refusal(PeerRun(RUN, n), 2000.0) for n in (0, 1)] == [None] * 2
        assert "not a node of its placement" in str(sidecar.peers.refusal(PeerRun(RUN, 2),
                                                                        2000.0))
