"""The alerts: a stored alert, the view the sidecar shows, a rule's action, and the run
context a finding is judged in.

``StoredAlert`` is one row of the alerts table as ``alert_store.py`` returns it (the
lifecycle works on these); ``AlertView`` is what the API, exposition and UI see. The API's
response models derive from these views (``api/models.py``), so a field and its
description are written here once; ``metadata={"description": ...}`` is what /openapi.json
says of a field.

A run's project counts as a label for rule matching, and an alert's view carries the
finding's message and first suggestion::

    >>> from prometheus_client import CollectorRegistry
    >>> from monitor_agent.alerting import Alerting, AlertingSettings
    >>> from monitor_agent.records.types import Finding, Severity
    >>> ctx = RunContext(run_id="gpt-7", project="gpt", labels={"team": "nlp"})
    >>> ctx.match_labels()
    {'team': 'nlp', 'project': 'gpt'}
    >>> alerting = Alerting(AlertingSettings(), ":memory:", CollectorRegistry())
    >>> spike = Finding("loss_spike", Severity.WARNING, "gpt-7", step=120,
    ...                 message="loss 4x its EMA", suggestions=("lower the learning rate",))
    >>> _ = alerting.handle(ctx, [spike], now=1000.0)
    >>> [(a.alertname, a.state, a.summary, a.suggestion) for a in alerting.active_alerts()]
    [('TrainingLossSpike', 'pending', 'loss 4x its EMA', 'lower the learning rate')]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from monitor_agent.alerting.lifecycle import Timing
from monitor_agent.alerting.related import RelatedFindings
from monitor_agent.records import wire
from monitor_agent.records.types import LauncherDeclaration

AlertState = Literal["pending", "firing", "resolved"]
"""Where an alert episode is in its lifecycle (silenced is separate: see ``AlertView``)."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node of a multi-node job as its leader knows it: node rank, host, the id of its
    sidecar (heard over the peer link; None for the leader's own node), its ranks."""

    node: int
    host: str | None = None
    sidecar: str | None = None
    ranks: tuple[int, ...] = ()

    def name(self) -> str:
        return f"node {self.node}" + (f" ({self.host})" if self.host else "")


@dataclass(frozen=True, slots=True)
class RunContext:
    """What alerting needs to know about the run a finding belongs to."""

    run_id: str
    project: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    # The run's clean checkpoints, oldest first, as (step, path): what a rollback may go
    # back to (runs/checkpoint_ledger.py judges them; current history only).
    # A sequence (the engine hands a view of its ledger: read it within the call).
    clean_checkpoints: Sequence[tuple[int, str]] = ()
    # What pages say of them ("last clean checkpoint: step 11800, <path>"); None when the
    # run reported no checkpoint.
    checkpoint_line: str | None = None
    # Data positions (docs/format.md ``data_position``), for a rollback plan: each clean
    # checkpoint's (step -> the position its state resumes from), each rank's latest
    # (step, position, positions per step), and the windows the run's applied rollbacks
    # skip already (a later plan skips them too).
    checkpoint_positions: Mapping[int, int] = field(default_factory=dict)
    data: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    skipped: tuple[tuple[int, int], ...] = ()
    skipped_unit: str = "positions"  # or "steps": a plan of a run without data positions
    # How the run leaves windows out ("sampler", "reading"; None: it did not say), as its
    # latest run record declares: a plan's page says it.
    skips_by: str | None = None
    # Each rank's latest step, and the ranks that report checkpoints: a rollback waits for
    # those to reach the fault's onset (alerting/rollback.py ``behind``).
    rank_steps: dict[int, int] = field(default_factory=dict)
    checkpoint_ranks: tuple[int, ...] = ()
    # When the run's first record reached the sidecar (None: not known, taken as long ago)
    # and the address that sent it (None: not known): what tells a new run's page from an
    # established run's when made-up runs flood the outbox (notify/fairness.py).
    first_seen: float | None = None
    source: str | None = None
    # What a restart decision needs (alerting/restart.py): the job's ranks, its nodes as
    # the leader hears them (empty: one node), its launcher as its run record declares
    # it, and the leader's number of the run's current attempt.
    world: int = 1
    nodes: tuple[NodeView, ...] = ()
    launcher: LauncherDeclaration | None = None
    attempt: int = 1
    # A new process of the run sent records and no step yet: its launcher is relaunching
    # it already (a restart decided now would hit the new processes).
    relaunching: bool = False

    def node_of(self, rank: int) -> NodeView | None:
        """The node ``rank`` runs on (a run on one node: node 0), or None when not known."""
        for node in self.nodes:
            if rank in node.ranks:
                return node
        if not self.nodes:
            return NodeView(0)
        return self.nodes[0] if len(self.nodes) == 1 else None

    def match_labels(self) -> dict[str, str]:
        """Run labels for rule matching; the project counts as a label too."""
        labels = dict(self.labels)
        if self.project and "project" not in labels:
            labels["project"] = self.project
        return labels

    def newcomer(self, now: float, new_run_seconds: float) -> str | None:
        """The run's source if it is new at ``now`` (first seen less than
        ``new_run_seconds`` ago), else None; a source not known is "unknown".

            >>> RunContext("r", first_seen=100.0, source="10.0.0.7").newcomer(130.0, 300.0)
            '10.0.0.7'
            >>> RunContext("r", first_seen=100.0).newcomer(500.0, 300.0) is None
            True
        """
        if self.first_seen is None or now - self.first_seen >= new_run_seconds:
            return None
        return self.source or "unknown"


@dataclass(frozen=True, slots=True)
class StoredAlert:
    """One alert episode as stored: identity, routing fixed at its start, lifecycle state.

    ``finding`` is the latest finding's JSON, parsed only where a message or view needs it.
    """

    fingerprint: str
    run_id: str
    rule: str
    type: str
    severity: str
    layer: str | None
    rank: int | None
    identity: dict[str, str]    # the fingerprint labels (layer, rank)
    project: str | None
    labels: dict[str, str]      # the run's labels
    channels: tuple[str, ...]   # fixed when the episode began
    cooldown: float
    repeat_interval: float
    resolve_after: float
    state: AlertState
    started_at: float
    pending_since: float | None
    last_seen: float            # time of the latest matching finding
    last_step: int | None
    count: int                  # findings in this episode (0: begun by a preview)
    finding: bytes
    notified: str | None = None        # what people were last told: firing | resolved
    notified_at: float | None = None   # when the last firing/repeat message went out
    refreshed_at: float | None = None  # last re-send to channels that need it
    resolved_at: float | None = None
    acked_at: float | None = None
    acked_by: str | None = None
    dashboard_url: str | None = None
    action: str | None = None   # what a rule asked of the run, as pages say it
    related: str | None = None  # findings grouped under it (alerting/related.py), JSON
    checkpoint: str | None = None  # the run's last clean checkpoint, as pages say it
    # A node sidecar paged it and told its resolve while the run's leader was away: the
    # leader closes it without a second resolve (monitor_agent/cluster).
    resolved_elsewhere: bool = False
    # The run was new when this episode began (``RunContext.is_new``): where it came from.
    # Its messages go after established runs' and count against the source's budget of
    # new runs' pages (notify/fairness.py). None: an established run.
    newcomer: str | None = None
    # The step the episode began at (its first finding's, or its preview's); what may be
    # grouped under it follows it in steps, not only in arrival (alerting/related.py).
    first_step: int | None = None

    def finding_data(self) -> dict[str, Any]:
        data: dict[str, Any] = wire.loads(self.finding)
        return data

    def timing(self) -> Timing:
        """The part of the state that lifecycle decisions read."""
        return Timing(
            state=self.state, notified=self.notified, notified_at=self.notified_at,
            last_seen=self.last_seen, last_step=self.last_step, acked=self.acked_at is not None,
            cooldown=self.cooldown, repeat_interval=self.repeat_interval,
            resolve_after=self.resolve_after,
        )


@dataclass(frozen=True, slots=True)
class AlertView:
    """One alert as /v1/alerts, /v1/runs/{id} and the /metrics exposition show it.

    ``state`` is pending, firing or resolved; ``silenced`` is separate because a silenced
    alert still fires (it is just not sent).
    """

    fingerprint: str
    run_id: str
    project: str | None
    rank: int | None
    alertname: str
    type: str
    severity: str
    layer: str | None
    summary: str
    suggestion: str | None
    state: AlertState
    silenced: bool
    started_at: float
    last_seen: float
    last_step: int | None
    count: int
    resolved_at: float | None = None
    acked_by: str | None = None
    acked_at: float | None = None
    dashboard_url: str | None = None
    # What a rule asked of the run ("stop requested at step N ...").
    action: str | None = field(
        default=None, metadata={"description": "What a rule asked of the run, if anything."})
    related: int = field(default=0, metadata={"description": (
        "Findings that follow from this page, grouped under it instead of alerting on their "
        "own (alerting/related.py).")})
    related_summary: str | None = field(default=None, metadata={"description": (
        "What they were, e.g. '+11 related findings (grad_distribution heavy_tail in 11 "
        "layers)'.")})
    checkpoint: str | None = field(default=None, metadata={"description": (
        "The run's last clean checkpoint as its pages name it ('last clean checkpoint: step "
        "11800, <path>'); null when the run reported no checkpoint.")})
    step: int | None = field(default=None, metadata={"description": (
        "The step of its latest finding (``last_step`` is where the run's history stands for "
        "it: after a rollback, the checkpoint's step).")})
    paged: bool = field(default=False, metadata={"description": (
        "Its rule routes it to the 'page' route (someone is woken; a 'chat' route only "
        "posts), and it went out: firing or resolved, not silenced.")})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, alert: StoredAlert, silenced: bool, route: str | None = None) -> AlertView:
        """``route``: its rule's (None: the rule is gone; then its severity says, as the
        default routes do: error and critical page)."""
        finding = alert.finding_data()
        suggestions = finding.get("suggestions") or []
        related = RelatedFindings.from_json(alert.related)
        return cls(
            fingerprint=alert.fingerprint, run_id=alert.run_id, project=alert.project,
            rank=alert.rank, alertname=alert.rule, type=alert.type, severity=alert.severity,
            layer=alert.layer, summary=finding.get("message", ""),
            suggestion=suggestions[0] if suggestions else None, state=alert.state,
            silenced=silenced, started_at=alert.started_at, last_seen=alert.last_seen,
            last_step=alert.last_step, count=alert.count, resolved_at=alert.resolved_at,
            acked_by=alert.acked_by, acked_at=alert.acked_at, dashboard_url=alert.dashboard_url,
            action=alert.action, related=related.count, related_summary=related.summary() or None,
            checkpoint=alert.checkpoint, step=_int(finding.get("step")),
            paged=(route == "page" if route is not None else alert.severity in (
                "error", "critical")) and alert.state != "pending" and not silenced,
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
