"""A rank SIGKILLed under a launcher that restarts the job names its node ``gone`` (issue
44): the engine on a real store, fed the records a 2-node x 2-rank job's clients send. Rank
2's process dies without a word; ranks 0, 1 and 3 end ``failed`` with gloo's "Connection
closed by peer"; torchrun relaunches, and the new attempt's records settle it. The relaunch
page names rank 2 on node-b, its node's verdict is ``gone``; the victims are not named. A
crash by a genuine exception is not ``gone`` (runs/attempt_end.py states the rule)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming, IngestResult
from monitor_agent.records import schemas
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store

RUN = "gone"
TORCHRUN = {"name": "torchrun", "restarts": True, "restart_count": 0, "max_restarts": 3}
LOST = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [10.0.0.2]:21170. This is typically caused by a remote worker crashing.")


def _ingest(engine: Engine, records: list[dict[str, Any]], now: float) -> IngestResult:
    return engine.ingest([Incoming(i, *schemas.parse_for_store(r))
                          for i, r in enumerate(records)], now)


def _launch(token: str, steps: range) -> list[dict[str, Any]]:
    """Each of the job's 4 ranks (node-a: 0, 1; node-b: 2, 3): its run record, its steps."""
    out: list[dict[str, Any]] = []
    for rank in range(4):
        out.append({"kind": "run", "run_id": RUN, "rank": rank, "time": 1.0,
                    "attempt": f"{token}{rank}", "launcher": TORCHRUN,
                    "hardware": {"world_size": 4, "reporting_ranks": 4},
                    "labels": {"hostname": f"node-{'ab'[rank // 2]}"}})
    for step in steps:
        out += [{"kind": "step", "run_id": RUN, "rank": rank, "step": step,
                 "time": 100.0 + step, "loss": 2.0, "attempt": f"{token}{rank}"}
                for rank in range(4)]
    return out


STOPPED = ("SIGTERM: stopped by its launcher (torchrun's agent stops every worker when one "
           "of them failed or the job re-forms)")


def _end(token: str, rank: int, step: int, error: str,
         status: str = "failed") -> dict[str, Any]:
    return {"kind": "end", "run_id": RUN, "rank": rank, "step": step, "time": 200.0,
            "attempt": f"{token}{rank}", "status": status, "error": error}


def _relaunch_after(ends: list[dict[str, Any]], tmp_path) -> tuple[Engine, IngestResult,
                                                                     IngestResult]:
    engine = Engine(Settings(), Store(tmp_path / "m.sqlite"), SelfMetrics(CollectorRegistry()))
    _ingest(engine, _launch("a", range(1, 31)), now=10.0)
    crashed = _ingest(engine, ends, now=11.0)
    relaunch = _ingest(engine, _launch("b", range(21, 26)), now=25.0)
    return engine, crashed, relaunch


def _verdicts(engine: Engine) -> dict[str, tuple[str, str | None]]:
    live = engine.registry.get(RUN)
    assert live is not None
    return {v.node: (v.state, v.cause) for v in live.state.node_verdicts()}


def test_a_rank_dead_without_a_word_names_its_node_gone_not_the_peers_that_lost_it(tmp_path):
    engine, crashed, relaunch = _relaunch_after(
        [_end("a", r, 30, LOST) for r in (0, 1, 3)], tmp_path)

    # The survivors' crash pages say they lost a peer: victims, not the cause.
    pages = [f for f in crashed.findings if f.type == "crashed"]
    assert sorted(f.rank for f in pages) == [0, 1, 3]
    assert all(f.evidence["peer_lost"] for f in pages)
    assert all("lost a peer" in f.message and "not the cause" in f.message for f in pages)

    [found] = [f for f in relaunch.findings if f.type == "relaunched"]
    assert found.evidence["gone_ranks"] == [2]
    assert found.evidence["peer_lost_ranks"] == [0, 1, 3]
    assert ("rank 2 on node-b ended without a word (killed, out of memory, or lost with its "
            "node); ranks 0-1,3 lost it as a peer") in found.message
    assert "Node verdict: node node-b: suspect (gone)" in found.message
    assert found.evidence["node_state"] == "suspect"
    assert _verdicts(engine) == {"node-a": ("healthy", None), "node-b": ("suspect", "gone")}


def test_a_node_that_loses_a_rank_so_again_in_a_later_attempt_is_sick(tmp_path):
    engine, _, _ = _relaunch_after([_end("a", r, 30, LOST) for r in (0, 1, 3)], tmp_path)
    _ingest(engine, [_end("b", r, 25, LOST) for r in (0, 1, 2)], now=30.0)  # rank 3 dies
    relaunch = _ingest(engine, _launch("c", range(21, 26)), now=45.0)

    [found] = [f for f in relaunch.findings if f.type == "relaunched"]
    assert found.evidence["gone_ranks"] == [3]
    assert "Node verdict: node node-b: sick (gone)" in found.message
    assert "as a rank of it did in attempt 1" in found.message
    assert _verdicts(engine) == {"node-a": ("healthy", None), "node-b": ("sick", "gone")}


def test_a_crash_of_a_genuine_exception_is_not_gone(tmp_path):
    engine, crashed, relaunch = _relaunch_after(
        [_end("a", 2, 30, "ValueError: the batch has no labels")]
        + [_end("a", r, 30, LOST) for r in (0, 1, 3)], tmp_path)

    [own] = [f for f in crashed.findings if f.type == "crashed" and f.rank == 2]
    assert not own.evidence["peer_lost"] and "(rank 2): ValueError" in own.message
    [found] = [f for f in relaunch.findings if f.type == "relaunched"]
    assert found.evidence["gone_ranks"] == [] and found.evidence["crashed_ranks"] == [2]
    assert "without a word" not in found.message and "Node verdict" not in found.message
    assert _verdicts(engine) == {"node-a": ("healthy", None), "node-b": ("healthy", None)}


def test_the_rank_dead_without_a_word_is_named_when_the_launcher_stopped_every_other(
        tmp_path):
    """torchrun's agents stop the survivors first, and each says so (client/_sigterm.py):
    no peer-lost error names an address, the dead rank is the only silent one. Those ends
    do not end the run (the last would have made it ``stopped``, and a stopped run is not
    relaunched after a crash): the relaunch judges it."""
    engine, crashed, relaunch = _relaunch_after(
        [_end("a", r, 30, STOPPED, "stopped") for r in (3, 1, 0)], tmp_path)
    assert not [f for f in crashed.findings if f.type == "crashed"]
    [found] = [f for f in relaunch.findings if f.type == "relaunched"]
    assert found.evidence["gone_ranks"] == [2]
    assert found.evidence["signalled_ranks"] == [0, 1, 3]
    assert "rank 2 on node-b ended without a word" in found.message
    assert _verdicts(engine) == {"node-a": ("healthy", None), "node-b": ("suspect", "gone")}
    live = engine.registry.get(RUN)
    assert live is not None  # the launcher's stops are no clean end: it resumed after a crash
    assert [r.kind for r in engine.registry.rollbacks(live)] == ["crash"]


def test_a_job_whose_launcher_stopped_every_rank_ends_stopped(tmp_path):
    """Every rank said its launcher stopped it (the job cancelled: the agent passes its
    SIGTERM on): the run ended ``stopped``, nobody died."""
    engine = Engine(Settings(), Store(tmp_path / "m.sqlite"), SelfMetrics(CollectorRegistry()))
    _ingest(engine, _launch("a", range(1, 31)), now=10.0)
    _ingest(engine, [_end("a", r, 30, STOPPED, "stopped") for r in range(3)], now=11.0)
    live = engine.registry.get(RUN)
    assert live is not None and live.state.status == "running"  # rank 3 has not said so yet
    _ingest(engine, [_end("a", 3, 30, STOPPED, "stopped")], now=11.5)
    assert live.state.status == "stopped"
