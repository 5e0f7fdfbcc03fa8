"""What the sidecar knows about each run right now: latest values, counters, status.

The engine thread mutates it; the exposition reads it from another thread. Readers only
touch immutable records and plain numbers, and every change bumps ``version`` last
(``RunState.changed``), so a reader sees either the old or the new values of a rank, never
a torn mix that matters.

The engine creates one per run (``RunState.new``) and applies each record it analyses; a
step of rank 0 taking 0.3 s, with the engine's buckets (``metrics.names``)::

    >>> from monitor_agent.metrics.names import STEP_DURATION_BUCKETS
    >>> from monitor_agent.records.schemas import parse_record
    >>> run = RunState.new("r1", now=100.0)
    >>> step = {"kind": "step", "run_id": "r1", "step": 7, "time": 1.0, "step_time": 0.3}
    >>> run.apply_step(parse_record(step), arrival=101.0, buckets=STEP_DURATION_BUCKETS)
    >>> run.last_step, run.ranks[0].steps_total, run.ranks[0].step_time_sum, run.version
    (7, 1, 0.3, 1)
    >>> run.is_late(parse_record(step))   # the same step again: out of order
    True
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from monitor_agent.cluster.roster import Roster
from monitor_agent.records.limits import MAX_NAME_LEN, scrub
from monitor_agent.records.types import (
    ActivationTable,
    EvalRecord,
    LayerTable,
    ProcessIdentity,
    QuantileTable,
    RunRecord,
    StepRecord,
)
from monitor_agent.runs.checkpoint_ledger import CheckpointLedger
from monitor_agent.runs.ettr import ettr_of
from monitor_agent.runs.goodput import GoodputLedger, GoodputReport
from monitor_agent.runs.network_slow import LinkJudge, Rtt
from monitor_agent.runs.node_verdict import NodeVerdict, NodeVerdicts, Price, price
from monitor_agent.runs.verdict import Verdict, VerdictTracker

_DATA_DELTAS = 16  # a median of 16 ignores the jump a skipped window makes, and a few more


@dataclass(slots=True)
class RankState:
    """Latest values and cumulative counters of one rank of a run."""

    last: StepRecord | None = None
    last_eval: EvalRecord | None = None
    last_layers: LayerTable | None = None
    last_activations: ActivationTable | None = None  # of the latest monitored step
    last_grad_quantiles: QuantileTable | None = None  # of the latest hist step
    last_param_quantiles: QuantileTable | None = None
    last_effective_lr: float | None = None  # of the latest step that had an update norm
    last_layers_clip: float = 1.0  # what clipping multiplied last_layers' gradients by
    last_step: int = -1
    last_eval_step: int = -1
    last_arrival: float = 0.0
    first_step: int = -1                 # the rank's pace (pipeline/plausible.py) is measured from
    first_arrival: float | None = None   # here, in sidecar time
    steps_total: int = 0
    tokens_total: float = 0.0
    samples_total: float = 0.0
    skipped_total: int = 0
    skipped_by_reason: dict[str, int] = field(default_factory=dict)  # schemas' skip_reason
    step_time_counts: list[int] = field(default_factory=list)
    step_time_sum: float = 0.0
    loss_ema: float | None = None
    # The data stream's position (docs/format.md ``data_position``) at the rank's latest
    # step that sent one, that step, and the positions each of its last steps consumed
    # (a rollback plan turns its margin, in steps, into positions with their median).
    data_position: int | None = None
    data_step: int = -1
    data_deltas: list[int] = field(default_factory=list)
    # Its records reach this sidecar, the run's leader, as digests from its node's sidecar
    # (monitor_agent/cluster): judged and charted here, exposed on /metrics by that sidecar.
    remote: bool = False
    # Which node sidecar forwards them (its id @ the connection's address, api/peer.py):
    # a finding about this rank is taken only from that one (``PeerExchange._finding_refusal``).
    via: str | None = None

    def took_data(self, step: int, position: int) -> None:
        """Step ``step`` left the data stream at ``position``."""
        if self.data_step == step - 1 and self.data_position is not None:
            delta = position - self.data_position
            if delta > 0:
                self.data_deltas = [*self.data_deltas[1 - _DATA_DELTAS:], delta]
        self.data_position, self.data_step = position, step

    @property
    def per_step(self) -> int:
        """Data positions one step consumes (1 until two consecutive steps said)."""
        deltas = sorted(self.data_deltas)
        return deltas[len(deltas) // 2] if deltas else 1


@dataclass(slots=True)
class RunState:
    """A run as the engine tracks it."""

    run_id: str
    first_seen: float
    last_arrival: float
    run: RunRecord | None = None
    # The address of the request that brought the run into memory (api/ingest.py), if
    # known: the outbox budgets new runs' pages per source (notify/fairness.py).
    source: str | None = None
    status: str = "running"
    ended_at: float | None = None
    ranks: dict[int, RankState] = field(default_factory=dict)
    # The process of each of this sidecar's own ranks, as its latest run record says
    # (docs/format.md ``process``): a restart ends the stopped ones (cluster/stopped_rank.py).
    # Another node's ranks are never here: their records reach this sidecar as digests.
    processes: dict[int, ProcessIdentity] = field(default_factory=dict)
    findings: dict[tuple[str, str], int] = field(default_factory=dict)
    last_record_id: int = 0
    snapshot_record_id: int = 0
    version: int = 0
    # Ranks the latest ``hang`` finding named hung or gone; a rank's next step takes it out
    # (``training_hung_ranks``).
    hung_ranks: set[int] = field(default_factory=set)
    # Layer names the detectors track, capped (a name bomb must not grow memory forever).
    layer_names: set[str] = field(default_factory=set)
    verdict: VerdictTracker = field(default_factory=VerdictTracker)
    # Each node's evidence so far (runs/node_verdict.py), folded from the findings the
    # run's leader judges; snapshot with the run.
    nodes: NodeVerdicts = field(default_factory=NodeVerdicts)
    # Each pair of its nodes' TCP round-trip times, as the leader hears them, and the node
    # they name network-slow (runs/network_slow.py); not snapshot: a few seconds of
    # samples rebuild it. None until a node sends figures.
    links: LinkJudge | None = None
    # Its nodes not healthy, sick first: an immutable copy the exposition reads.
    node_view: tuple[NodeVerdict, ...] = ()
    stored_verdict: str | None = None  # the verdict JSON last written to the run's row
    # The verdict's label, a plain string the exposition reads from its own thread (the
    # tracker's dicts change on the engine thread).
    verdict_label: str = "healthy"
    # The checkpoints it reported, judged clean or suspect; loaded from the store with the
    # run (registry.py), not part of its snapshot.
    ledger: CheckpointLedger = field(default_factory=CheckpointLedger)
    # Where its time went (runs/goodput.py): kept in its own table, restored with the run
    # and carried over a rebuild (registry.py), not part of its snapshot.
    goodput: GoodputLedger = field(default_factory=GoodputLedger)
    # Its report as of the engine's latest tick: immutable, what /metrics reads from the
    # scrape's thread (the ledger's dicts change on the engine thread).
    goodput_view: GoodputReport | None = None
    # One run, one brain (monitor_agent/cluster). ``leader``: the URL of the sidecar that
    # leads this multi-node run, when this one is a node sidecar forwarding to it (None:
    # it judges the run here, alone or as its leader); ``roster``: as the leader, the
    # nodes it hears from. Both follow from the run record that placed the run.
    # Its lifecycle's phase as people read it (runs/lifecycle.py ``describe``): a plain
    # string the views read.
    phase: str = "running"
    phase_state: str = "running"  # the lifecycle's Phase value ("silent": no ETA)
    # The data windows the run's newest applied rollback skips (its plan's ``skip``, which
    # holds every earlier one's too) and their unit: what a later plan skips as well, and
    # what the resumed run's positions are checked against (detectors/window_trained.py).
    skipped: tuple[tuple[int, int], ...] = ()
    skipped_unit: str = "positions"
    leader: str | None = None
    node: int | None = None  # this sidecar's node in the run (its ranks' run records)
    roster: Roster = field(default_factory=Roster)
    # The run's latest attempt (pipeline/attempts.py), and whether it is pending (a new
    # process sent records, no step yet): a restart decision reads both.
    attempt: int = 1
    relaunching: bool = False
    # The attempt (this sidecar's number) a leader's restart left this node out of: its
    # ranks are gone, so it no longer reports the run to the leader, until a later attempt
    # brings ranks here again (cluster/drain.py).
    left_out: int | None = None
    placed_by: int | None = None  # the attempt whose run record set the three (``Placement.place``)
    # The latest step of any rank, kept as steps arrive (``last_step``): a max over a
    # thousand ranks per read is what a run leader's checkpoint checks and run pages cost
    # otherwise. -1 until first read, then worked out once (a restored run's ranks come
    # from its snapshot, not from steps).
    _top_step: int = field(default=-1, repr=False)
    _top_known: bool = field(default=False, repr=False)
    _top_rank: int = field(default=-1, repr=False)  # a rank that sent it (``top_rank``)

    def judged(self) -> Verdict:
        """The run's verdict as of now (runs/verdict.py). An ended run's says what it
        cost too: "completed, healthy; goodput 93.1%: 4.2% restarts, ..." (runs/goodput.py;
        a node sidecar following a leader leaves that to the leader's ledger)."""
        verdict = self.verdict.verdict(self.status)
        if self.status == "running" or self.leader is not None:
            return verdict
        report = self.goodput.report()
        if report.ratio is None:
            return verdict
        said = report.summary()
        return dataclasses.replace(verdict, text=f"{verdict.text}; {said}",
                                   words=f"{verdict.words}; {said}")

    def clock(self, now: float) -> float | None:
        """Sidecar time ``now`` on the run's own clock (its latest step's time plus what
        passed here since it arrived): immune to client/sidecar clock skew. None before
        any step."""
        last = max((r.last.time for r in self.ranks.values() if r.last), default=None)
        return None if last is None else last + (now - self.last_arrival)

    @classmethod
    def new(cls, run_id: str, now: float) -> RunState:
        return cls(run_id=run_id, first_seen=now, last_arrival=now)

    @property
    def project(self) -> str:
        if self.run is None:
            return ""
        project = self.run.labels.get("project") or self.run.config.get("project") or ""
        # The edge validates both; a record stored by an older version may still be huge.
        return scrub(str(project), MAX_NAME_LEN)

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.run.labels) if self.run is not None else {}

    def rank(self, rank: int) -> RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = RankState()
        return state

    def apply_run(self, record: RunRecord, remote: bool = False) -> None:
        """Take a rank's run record; a ``remote`` one (another node's, through its sidecar)
        only when none of this sidecar's own ranks sent one (its labels name that node).
        Where the run sits in a multi-node job is not taken from here: the engine places
        it (pipeline/placement.py ``Placement.place``)."""
        if not remote and record.process is not None:
            self.processes[record.rank] = record.process
        if remote and self.run is not None:
            return
        self.run = record
        self.changed()

    def apply_step(self, record: StepRecord, arrival: float, buckets: tuple[float, ...]) -> None:
        state = self.rank(record.rank)
        self.hung_ranks.discard(record.rank)
        if not state.step_time_counts:
            state.step_time_counts = [0] * (len(buckets) + 1)
        state.steps_total += 1
        state.tokens_total += _finite_or_zero(record.tokens)
        state.samples_total += _finite_or_zero(record.samples)
        state.skipped_total += int(record.skipped)
        if record.skipped:  # a skip with no reason is what it always was: the loss scaler
            reason = record.skip_reason or "loss_scale"
            state.skipped_by_reason[reason] = state.skipped_by_reason.get(reason, 0) + 1
        if record.data_position is not None:
            state.took_data(record.step, record.data_position)
        st = record.step_time
        if st is not None and st == st and st >= 0:
            state.step_time_counts[bisect.bisect_left(buckets, st)] += 1
            state.step_time_sum += st
        # The raw histograms are large (edges and counts per layer) and nothing reads them
        # after detection; the quantile tables below are what the exposition shows.
        state.last = record if record.grad_hist is None and record.param_hist is None else \
            dataclasses.replace(record, grad_hist=None, param_hist=None)
        if record.layers is not None:
            state.last_layers = record.layers
            state.last_layers_clip = record.clip_coef
        if record.effective_lr is not None:
            state.last_effective_lr = record.effective_lr
        if record.activations is not None:
            state.last_activations = record.activations
        if record.grad_quantiles is not None:
            state.last_grad_quantiles = record.grad_quantiles
        if record.param_quantiles is not None:
            state.last_param_quantiles = record.param_quantiles
        if state.first_arrival is None:
            state.first_step, state.first_arrival = record.step, arrival
        state.last_step = max(state.last_step, record.step)
        if record.step >= self._top_step:
            self._top_step, self._top_rank = record.step, record.rank
        state.last_arrival = self.last_arrival = arrival
        self.changed()

    def apply_eval(self, record: EvalRecord, arrival: float) -> None:
        state = self.rank(record.rank)
        state.last_eval = record
        state.last_eval_step = max(state.last_eval_step, record.step)
        self.last_arrival = arrival
        self.changed()

    def apply_end(self, status: str, ended_at: float) -> None:
        self.status = status
        self.ended_at = ended_at
        self.changed()

    def retire(self, ranks: set[int]) -> None:
        """Forget ``ranks`` (``DetectorSuite.retire``: a job re-formed with fewer)."""
        for rank in ranks:
            self.ranks.pop(rank, None)
            self.processes.pop(rank, None)
            self.hung_ranks.discard(rank)
        self._top_known = False
        self.changed()

    def changed(self) -> None:
        """Something the read side shows of the run moved: its ``version`` goes up, last,
        after the change itself (the exposition thread renders a run again only when its
        version moved, and reads either the old values or the new ones). The one place a
        version is bumped: every change of a run's state that a reader shows calls it."""
        self.version += 1

    def count_findings(self, findings: list[Any]) -> None:
        for f in findings:
            key = (f.type, f.severity.label)
            self.findings[key] = self.findings.get(key, 0) + 1
            if f.type == "hang":
                self.hung_ranks = {int(r) for r in (*f.evidence.get("hung_ranks", ()),
                                                    *f.evidence.get("gone_ranks", ()))}
        if findings:
            self.changed()

    def observe_nodes(self, findings: list[Any]) -> list[NodeVerdict]:
        """Fold findings into the node verdicts; the verdicts of the nodes they named
        (only for a run on two or more nodes: one node is never told apart from its job)."""
        hosts = self.hosts()
        if len(set(hosts.values())) < 2:
            return []
        positions = {r: st.data_position for r, st in self.ranks.items()}
        named = {n for f in findings if (n := self.nodes.observe(f, hosts, positions))}
        every = self.nodes.verdicts(hosts, self.node_prices())
        if named:
            self.refresh_nodes(every)
            self.changed()
        return [v for v in every if v.node in named]

    def observe_links(self, local: str, figures: dict[str, Rtt], now: float,
                      hold_seconds: float, max_age_seconds: float) -> NodeVerdict | None:
        """Node ``local``'s TCP figures to its peer nodes folded in and the link judged
        (runs/network_slow.py); the verdict of the node it marked ``network-slow``, if
        it changed. Only for a run on two or more nodes."""
        hosts = self.hosts()
        if len(set(hosts.values())) < 2:
            return None
        if self.links is None:
            self.links = LinkJudge(hold_seconds, max_age_seconds)
        self.links.observe(local, figures, now)
        judged = self.links.judge(now)
        if judged is None:
            return None
        slow, sick = judged
        node = self.nodes.link(slow.node, sick, max(self.last_step, 0), slow.words())
        if node is None:
            return None
        every = self.nodes.verdicts(hosts, self.node_prices())
        self.refresh_nodes(every)
        self.changed()
        return next((v for v in every if v.node == node), None)

    def refresh_nodes(self, every: list[NodeVerdict] | None = None) -> None:
        """``node_view`` from the verdicts (``every``: as just judged)."""
        if every is None:
            every = self.node_verdicts()
        self.node_view = tuple(sorted((v for v in every if v.state != "healthy"),
                                      key=lambda v: (v.state != "sick", v.node)))

    def node_verdicts(self) -> list[NodeVerdict]:
        """Every node's verdict as of now, priced (``node_prices``)."""
        return self.nodes.verdicts(self.hosts(), self.node_prices())

    def hosts(self) -> dict[int, str]:
        """Rank -> its node (its run record's ``node`` / ``hostname`` label)."""
        return dict(self.goodput.hosts)

    def node_prices(self) -> dict[str, Price]:
        """The node the goodput ledger's straggler tax names (its newest attempt's), priced
        against this job's measured restarts (runs/node_verdict.py ``price``)."""
        report = self.goodput_view
        if report is None or report.straggler is None or report.straggler.node is None:
            return {}
        ettr = ettr_of({"attempts": report.attempts, "incidents": report.incidents},
                       report.ratio)
        costs = [r.seconds + r.lost for r in ettr.recoveries if not r.open]
        tax = report.straggler
        return {str(tax.node): price(tax.seconds, report.wall, costs)}

    def is_late(self, record: StepRecord | EvalRecord) -> bool:
        """A step at or before the last one seen from its rank arrived out of order."""
        state = self.ranks.get(record.rank)
        if state is None:
            return False
        last = state.last_step if isinstance(record, StepRecord) else state.last_eval_step
        return record.step <= last

    def top_rank(self) -> RankState | None:
        """A rank that sent the run's latest step (None: no rank yet), kept as steps
        arrive: a new rank's first step is judged by its pace (pipeline/plausible.py), and
        a leader brings 16,384 new ranks in, each a max over those before it otherwise."""
        state = self.ranks.get(self._top_rank)
        if state is None or state.last_step != self.last_step:
            state = max(self.ranks.values(), key=lambda r: r.last_step, default=None)
        return state

    @property
    def last_step(self) -> int:
        """The latest step any rank sent (-1: none yet)."""
        if not self._top_known:
            self._top_step = max((r.last_step for r in self.ranks.values()), default=-1)
            self._top_known = True
        return self._top_step


def _finite_or_zero(value: float | None) -> float:
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return 0.0
    return value
