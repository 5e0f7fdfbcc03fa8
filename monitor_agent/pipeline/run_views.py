"""What the stages read off a run's state: the context alerting judges it in, its nodes
and their addresses, where it is led from. Functions of a ``RunState`` (and a ``LiveRun``),
no I/O; the stages (pipeline/engine.py lists them) share them."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from monitor_agent.alerting.alerts import NodeView, RunContext
from monitor_agent.cluster.tcp_probe import PeerLink
from monitor_agent.detectors.support.context import host_label
from monitor_agent.pipeline.registry import LiveRun
from monitor_agent.records import schemas, wire
from monitor_agent.records.types import EndRecord, Finding, Record, RunRecord
from monitor_agent.runs.network_slow import Rtt
from monitor_agent.runs.run_state import RunState
from monitor_agent.storage.store import StoredAttempt


def ends_run(live: LiveRun, record: EndRecord, attempt: int) -> bool:
    """Whether an end record ends the run: it comes from a rank that trained in its
    attempt, or nobody trained in it (a job that failed before its first step). A process
    that joined without training ends only itself, as one that died before its first step
    does (pipeline/attempts.py)."""
    stepped = live.attempts.stepped
    return (attempt, record.rank) in stepped or not any(n == attempt for n, _ in stepped)


def step_interval(run: RunState) -> float | None:
    """Seconds of sidecar time per step of the run's busiest rank since it was first heard
    (None before it has a pace): the scale a pause of the run is judged in."""
    best: float | None = None
    for rank in run.ranks.values():
        if rank.first_arrival is None or rank.last_step <= rank.first_step:
            continue
        interval = (rank.last_arrival - rank.first_arrival) / (rank.last_step - rank.first_step)
        best = interval if best is None else min(best, interval)
    return best


def settle_goodput(run: RunState, attempt: StoredAttempt, rolled_back: bool) -> None:
    """The goodput ledger's account of a new attempt: the work it replaced is rollback
    badput when it applied a plan, else resume (runs/goodput.py ``settled``)."""
    why = ("rollback" if rolled_back else "restart" if attempt.kind == "restarted"
           else "resume")
    run.goodput.settled(attempt.number, attempt.start_step, why)


def name_nodes(run: RunState, findings: list[Finding]) -> list[Finding]:
    """Each finding folded into the run's node verdicts (runs/node_verdict.py); one that
    names a node not healthy says that node's verdict, so the page it makes does, and a
    rule's ``exclude`` reads whether leaving it out pays (alerting/restart.py)."""
    out = []
    for f in findings:
        named = [v for v in run.observe_nodes([f]) if v.state != "healthy"]
        if named and not f.log_only:
            v = named[0]
            said: dict[str, Any] = {"node_verdict": v.words(), "node_state": v.state,
                                    "node_cause": v.cause}
            if v.price is not None:
                said["node_exclude_pays"] = v.price.exclude_pays
            f = dataclasses.replace(f, message=f"{f.message.rstrip('.')}. Node verdict: "
                                    f"{v.words()}", evidence={**f.evidence, **said})
        note = run.nodes.data_note
        if f.type == "nan_inf" and note is not None and note[0] == f.step and not named:
            f = dataclasses.replace(f, message=f"{f.message.rstrip('.')}. Node verdict: "
                                    f"{note[1]}", evidence={**f.evidence,
                                                            "node_verdict": note[1]})
        out.append(f)
    return out


def context(run: RunState) -> RunContext:
    config = run.run.config if run.run is not None else {}
    ledger = run.ledger  # views of it, O(1) however many checkpoints (checkpoint_ledger.py)
    return RunContext(
        run_id=run.run_id, project=run.project or None, labels=run.labels, config=config,
        clean_checkpoints=ledger.clean_view(),
        checkpoint_line=ledger.line(),
        checkpoint_positions=ledger.positions_view(),
        data={r: (s.data_step, s.data_position, s.per_step) for r, s in run.ranks.items()
              if s.data_position is not None},
        skipped=run.skipped, skipped_unit=run.skipped_unit,
        skips_by=run.run.skips_by if run.run is not None else None,
        rank_steps={r: s.last_step for r, s in run.ranks.items()},
        checkpoint_ranks=ledger.ranks(),
        first_seen=run.first_seen, source=run.source,
        world=world(run), nodes=nodes(run),
        launcher=run.run.launcher if run.run is not None else None,
        attempt=run.attempt, relaunching=run.relaunching,
    )


def world(run: RunState) -> int:
    """The job's ranks: what its run record says report (else the ranks heard)."""
    hardware = run.run.hardware if run.run is not None else {}
    for key in ("reporting_ranks", "world_size"):
        value = hardware.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return max(len(run.ranks), 1)


def nodes(run: RunState) -> tuple[NodeView, ...]:
    """The nodes of a multi-node run as its leader hears them (empty: one node): its own,
    whose ranks are those not forwarded by another node, each node the roster heard since
    the job last re-formed, and the others it expects (not heard yet: their ranks by
    ``local_world_size``)."""
    roster = run.roster
    if roster.expected <= 1 or run.leader is not None:
        return ()
    here = run.node if run.node is not None else (None if leads_from_afar(run) else 0)
    live = set(run.ranks)
    heard = {n: seen for n, seen in roster.nodes.items() if n != here and n < roster.expected}
    remote = {r for seen in heard.values() for r in seen.ranks}
    own = tuple(sorted(r for r, s in run.ranks.items() if not s.remote and r not in remote))
    host = host_label(run.run.labels) if run.run is not None else None
    # Led from afar: every node is another machine's (no view of this sidecar's own).
    views = {} if here is None else {here: NodeView(here, host, None, own)}
    for n in range(roster.expected):
        seen = heard.get(n)
        if seen is not None:
            views[n] = NodeView(n, seen.host, seen.sidecar, tuple(sorted(seen.ranks & live)))
        elif n not in views:
            views[n] = NodeView(n, None, None, tuple(sorted(roster.ranks_of(n) & live)))
    return tuple(views[n] for n in sorted(views))


def addresses(run: RunState) -> dict[int, str]:
    """Rank -> the address its node is reached at, as this sidecar, the run's leader, hears
    it: a forwarded rank's node sidecar connects from it (``RankState.via``, id@address);
    its own ranks' node is the leader's (their run record's ``cluster.leader_url``: only
    an own rank's record says where the leader is; a forwarded one's may name its own
    node's sidecar). What a collective's error names of its lost peer is matched against
    it (attempt_end.py)."""
    out: dict[int, str] = {}
    record = run.run
    sender = run.ranks.get(record.rank) if record is not None else None
    cluster = record.cluster if record is not None and sender and not sender.remote else None
    own = urlsplit(cluster.leader_url).hostname if cluster and cluster.leader_url else None
    for rank, state in run.ranks.items():
        address = state.via.rpartition("@")[2] if state.via else None
        if not state.remote:
            address = own
        if address and address != "?":
            out[rank] = address
    return out


def link_figures(run: RunState, local: Collection[str], peers: Sequence[PeerLink],
                 aliases: Mapping[str, str] | None = None) -> tuple[str, dict[str, Rtt]] | None:
    """A node's TCP figures (cluster/tcp_probe.py) as the run's node pairs: the node at
    the ``local`` addresses, and its figures to each peer node, remote addresses mapped to
    nodes by ``addresses`` (and ``aliases``: address -> node, the leader's own addresses
    its own sample shows). An address of two nodes (one host) tells nothing and is left
    out; None when ``local`` is no one node of the run."""
    hosts = run.hosts()
    named: dict[str, set[str]] = {}
    for rank, address in addresses(run).items():
        if rank in hosts:
            named.setdefault(address, set()).add(hosts[rank])
    for address, node in (aliases or {}).items():
        named.setdefault(address, set()).add(node)
    nodes = {a: next(iter(n)) for a, n in named.items() if len(n) == 1}
    mine = {nodes[a] for a in local if a in nodes}
    if len(mine) != 1:
        return None
    node = mine.pop()
    figures: dict[str, Rtt] = {}
    for peer in peers:
        other = nodes.get(peer.address)
        if other is None or other == node:
            continue
        seen = figures.get(other)
        if seen is None or peer.rtt_ms > seen.rtt_ms:  # several addresses: its slowest
            figures[other] = Rtt(peer.rtt_ms, peer.rttvar_ms, peer.bytes, peer.sending_ms)
    return node, figures


def moved(live: LiveRun, record: Record) -> bool:
    """Whether ``record``, of one of this sidecar's own ranks, is a run record placing its
    node elsewhere in the job than the run's placement here says (another node rank, or
    another number of nodes): a re-formed job, whose ranks here may all be new to this
    sidecar (pipeline/attempts.py ``place``). Only on a node sidecar, placed and following
    a leader (which hears every rank and sees the relaunch as such): a process of the same
    launch shares its node's placement, while one sidecar judging alone may hear several
    nodes' ranks."""
    run, cluster = live.state, getattr(record, "cluster", None)
    if not isinstance(record, RunRecord) or cluster is None or run.placed_by is None:
        return False
    if run.leader is None or run.node is None:
        return False
    return cluster.node_rank != run.node or cluster.nodes != run.roster.expected


def run_records(bodies: list[bytes]) -> list[RunRecord]:
    """The stored run records among ``bodies`` that today's rules still read."""
    out = []
    for body in bodies:
        try:
            record = schemas.parse_record(wire.loads(body))
        except (schemas.RecordError, ValueError):
            continue  # as recovery skips a stored record today's rules reject
        if isinstance(record, RunRecord):
            out.append(record)
    return out


def leads_from_afar(run: RunState) -> bool:
    """Whether this sidecar leads ``run`` with no node of its own in the job
    (``Placement.keep_leading``, pipeline/placement.py): placed, following no one, no node rank, no local node."""
    return (run.placed_by is not None and run.leader is None and run.node is None
            and not run.roster.local)


def bare_context(record: Record) -> RunContext:
    return RunContext(run_id=record.run_id)
