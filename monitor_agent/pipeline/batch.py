"""What goes into the engine and what comes out of it, per request: the records a batch
brings (``Incoming``), a node sidecar's exchange (``PeerBatch``), what happened to each
(``IngestResult``, ``PreviewResult``), and how the stages take a record (``Mode``: as it arrives, or fed again
from the store). Plain data: the stages (pipeline/engine.py) fill them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from monitor_agent.cluster.tcp_probe import PeerLink
from monitor_agent.records.actions import Action
from monitor_agent.records.types import Finding, Record
from monitor_agent.storage.store import RecordRow, StoredAttempt
from monitor_agent.storage.uplink import UplinkRow


@dataclass(frozen=True, slots=True)
class Incoming:
    """A validated record, its index in the request, and the JSON the store keeps for it
    (the client's own line, or ``schemas.stored_json``)."""

    index: int
    record: Record
    body: bytes
    # The node rank of the sidecar that forwarded it to this one, the run's leader, as a
    # digest (monitor_agent/cluster); None for a record of this sidecar's own client.
    origin: int | None = None


@dataclass(frozen=True, slots=True)
class PeerRun:
    """A run a node sidecar follows, as it reports it: the node its ranks run on (their
    run records' ``cluster.node_rank``), that node's host and the ranks it hears."""

    run_id: str
    node: int
    host: str | None = None
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PeerBatch:
    """What a node sidecar sends its run leader in one exchange (api/peer.py): the
    digests of its ranks' records (``Incoming.origin``: their node), its detectors'
    findings (each with its ``storage.uplink`` flags) and the runs it follows (its
    heartbeat)."""

    sidecar: str
    items: list[Incoming] = field(default_factory=list)
    findings: list[tuple[Finding, int]] = field(default_factory=list)
    runs: Sequence[PeerRun] = ()
    address: str | None = None  # the connection's (api/peer.py), not the body's word
    # Its host's TCP figures to other machines (cluster/tcp_probe.py), when a new sample.
    links: tuple[PeerLink, ...] | None = None

    @property
    def forwarder(self) -> str:
        """Who forwards: the node sidecar's id at the address it connects from."""
        return f"{self.sidecar}@{self.address or '?'}"


@dataclass(slots=True)
class IngestResult:
    """What happened to each record of a batch, as the API reports it."""

    accepted: int = 0
    duplicates: int = 0
    late: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # (run id, token) -> the attempt its records went to (``attempt_view``), per batch.
    attempts: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # What this node sidecar owes the run leaders it follows (monitor_agent/cluster).
    uplink: list[UplinkRow] = field(default_factory=list)
    resumed: bool = False  # a record of the batch settled a resumed or restarted attempt
    # A node sidecar's exchange (``ingest_peer``): runs whose items were left with it, and
    # why; the findings taken, and those refused (index into the exchange's findings).
    deferred: dict[str, str] = field(default_factory=dict)
    taken: int = 0
    rejected_findings: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class PreviewResult:
    """What a preview request did (``Engine.preview``): alerts begun, and the indexes of
    the steps whose run the sidecar has no record of yet (they began nothing; the client
    sends them again once it has delivered the run's first records, so the page names
    the step it previews, not a later one)."""

    begun: int = 0
    unknown_run: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Admitted:
    """A record let in, with the attempt of its run it belongs to (pipeline/attempts.py)
    and the later attempt that already replaced it, if any (a spool delivered late)."""

    item: Incoming
    attempt: int
    superseded_by: int | None

    def row(self) -> RecordRow:
        """The row the store keeps of it (the store stage, pipeline/keep.py)."""
        record = self.item.record
        return RecordRow(
            run_id=record.run_id,
            rank=record.rank,
            kind=record.kind,
            step=record.step,  # a run record's is -1: it sorts before every step
            time=record.time,
            body=self.item.body,
            attempt=self.attempt,
            superseded_by=self.superseded_by,
            origin=self.item.origin,
        )


@dataclass(frozen=True, slots=True)
class Mode:
    """How the stages take a record: as it arrives (``LIVE``: judged, paged, forwarded,
    its arrival is now), or fed again from the store to restore a run (``replay``: its
    arrival is the run's last one, as restored; a replaced attempt's record is history).
    ``quiet``: a run rebuilt for a new attempt (registry.py): state only, as its records
    were judged, their findings stored and paged about, when they first arrived.

        >>> LIVE.live, LIVE.arrived(now=9.0)
        (True, 9.0)
        >>> replayed = Mode.replay(arrival=5.0)
        >>> replayed.live, replayed.arrived(now=9.0), Mode.replay(5.0, quiet=True).quiet
        (False, 5.0, True)
    """

    arrival: float | None = None
    quiet: bool = False

    @classmethod
    def replay(cls, arrival: float, quiet: bool = False) -> Mode:
        return cls(arrival, quiet)

    @property
    def live(self) -> bool:
        """A record as it arrives (not fed again from the store)."""
        return self.arrival is None and not self.quiet

    def arrived(self, now: float) -> float:
        """When the record reached this sidecar, on its clock."""
        return now if self.arrival is None else self.arrival


LIVE = Mode()


def attempt_view(run_id: str, attempt: StoredAttempt) -> dict[str, Any]:
    """What the ingest answer says of an attempt (api/ingest.py's ``IngestAttemptOut``)."""
    return {"run_id": run_id, "number": attempt.number, "kind": attempt.kind,
            "start_step": attempt.start_step, "superseded_from": attempt.superseded_from,
            "superseded_to": attempt.superseded_to}
