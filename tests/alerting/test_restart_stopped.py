"""A stopped rank ended by its own node's sidecar once a restart is decided, on real parts:
a real sidecar over real HTTP, fed the records a job's clients send, whose run records name
real processes of this machine (a ``sleep`` stands in for each rank's process; SIGSTOP
freezes one, as bench/heal.py's ``stop`` fault does). The restart kills the stopped rank at
once (its launcher then runs the job again without its grace); records alone, a restart
held, a forged process identity, a rank still running, or another node's rank: nothing is
signalled (cluster/stopped_rank.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from monitor_agent.cluster.stopped_rank import boot_id, read_stat
from tests.alerting.heal_records import (
    actions,
    checkpoint,
    hang,
    post,
    run_record,
    sidecar,
    step,
    texts,
)
from tests.cluster.test_stopped_rank import later_tick
from tests.eventually import eventually
from tests.receivers import Receiver
from tests.ticks import settled

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")


@contextmanager
def rank_process(stopped: bool) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        if stopped:
            proc.send_signal(signal.SIGSTOP)
            eventually(lambda: getattr(read_stat(proc.pid), "state", None) == "T",
                       timeout=10, what="the rank stopped")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def identity(proc: subprocess.Popen[bytes], start_off: int = 0) -> dict[str, Any]:
    stat = read_stat(proc.pid)
    assert stat is not None
    return {"pid": proc.pid, "start": stat.start + start_off, "boot": boot_id()}


def _job(urls: dict[int, str], processes: dict[int, dict[str, Any]], per_node: int,
         launcher: dict[str, Any] | None = None) -> None:
    """Steps 1-12 of a job of ``len(processes)`` ranks, each rank to its node's sidecar,
    its run record naming its process; a save at step 8."""
    ranks = len(processes)
    leader = urls[0] if len(urls) > 1 else None
    for s in range(1, 13):
        batches: dict[int, list[dict[str, Any]]] = {}
        for rank, process in processes.items():
            batch = batches.setdefault(rank // per_node, [])
            if s == 1:
                record = run_record(rank, ranks, launcher=launcher,
                                    per_node=per_node if leader else None, leader=leader,
                                    watchdog_floor=30.0)
                batch.append({**record, "process": process})
            batch.append(step(rank, s))
        if s == 8:
            batches[0].append(checkpoint(s))
        for node, batch in batches.items():
            post(urls[node], batch)


def _decided(url: str, action: str) -> dict[str, Any]:
    def found() -> dict[str, Any]:
        taken = [a for a in actions(url) if a["action"] in ("restart", "stop")]
        assert taken, actions(url)
        return taken[-1]
    decided = eventually(found, timeout=30, what="a decision")
    assert decided["action"] == action, decided
    return decided


def _still_stopped(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None and getattr(read_stat(proc.pid), "state", None) == "T"


def test_a_restart_ends_the_stopped_rank_at_once_and_leaves_the_running_one(tmp_path: Path):
    with Receiver("slack") as slack, sidecar(tmp_path, slack) as srv, \
            rank_process(stopped=False) as running, rank_process(stopped=True) as frozen:
        _job({0: srv.url}, {0: identity(running), 1: identity(frozen)}, per_node=2)
        settled(srv.url)
        assert _still_stopped(frozen), "a record alone signalled a process"
        # Rank 0 waits in all_reduce for rank 1, which is frozen.
        post(srv.url, [hang(0, 12), hang(1, 12)])
        _decided(srv.url, "restart")
        assert eventually(lambda: frozen.poll(), timeout=30,
                          what="the stopped rank ended") == -signal.SIGKILL
        settled(srv.url)
        assert running.poll() is None  # a running rank leaves by itself (exit 75)


def test_a_forged_process_identity_is_never_signalled(tmp_path: Path):
    with Receiver("slack") as slack, sidecar(tmp_path, slack) as srv, ExitStack() as stack:
        frozen = stack.enter_context(rank_process(stopped=True))
        later_tick(identity(frozen)["start"])  # the other process starts in a tick of its own
        other = stack.enter_context(rank_process(stopped=True))
        # Rank 0's record names a stopped process by the wrong start time; rank 1's names
        # another stopped process's pid with rank 0's start time.
        _job({0: srv.url}, {0: identity(frozen, start_off=1),
                            1: {**identity(frozen), "pid": other.pid}}, per_node=2)
        post(srv.url, [hang(0, 12), hang(1, 12)])
        _decided(srv.url, "restart")
        settled(srv.url)
        assert _still_stopped(frozen) and _still_stopped(other)


def test_a_restart_held_signals_nothing(tmp_path: Path):
    with Receiver("slack") as slack, sidecar(tmp_path, slack) as srv, \
            rank_process(stopped=True) as frozen:
        # Its launcher does not run it again: the restart is held, the rank left as it is.
        no_restarts = {"name": "none", "restarts": False}
        _job({0: srv.url}, {0: identity(frozen), 1: identity(frozen)}, per_node=2,
             launcher=no_restarts)
        post(srv.url, [hang(0, 12), hang(1, 12)])
        page = eventually(lambda: [t for t in texts(slack) if "RestartOnHang" in t],
                          timeout=30)
        assert "no restart: its launcher (none)" in page[0], page
        settled(srv.url)
        assert actions(srv.url) == [] and _still_stopped(frozen)


def test_the_leader_never_signals_another_nodes_rank(tmp_path: Path):
    """Node 1's rank 3 is stopped; node 1's sidecar does not end stopped ranks
    (``cluster.end_stopped_ranks: false``). The leader, on the same machine here, decides
    the restart and never signals it: only a rank's own node's sidecar may."""
    with ExitStack() as stack:
        slack = stack.enter_context(Receiver("slack"))
        lead = stack.enter_context(sidecar(tmp_path / "n0", slack))
        n1 = stack.enter_context(sidecar(tmp_path / "n1", slack, leader_url=lead.url,
                                         end_stopped_ranks=False))
        procs = [stack.enter_context(rank_process(stopped=r == 3)) for r in range(4)]
        _job({0: lead.url, 1: n1.url}, {r: identity(p) for r, p in enumerate(procs)},
             per_node=2)
        post(lead.url, [hang(0, 12), hang(1, 12)])
        post(n1.url, [hang(2, 12), hang(3, 12)])
        decided = _decided(lead.url, "restart")
        eventually(lambda: decided["id"] in [a["id"] for a in actions(n1.url)], timeout=20,
                   what="node 1 adopting the restart")
        settled(lead.url)
        settled(n1.url)
        assert _still_stopped(procs[3])
        assert all(p.poll() is None for p in procs)
