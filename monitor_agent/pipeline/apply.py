"""The apply stage: a record folded into its run's state (``RunState``), a checkpoint kept
in the run's ledger (stored with it), a step's layers capped to the run's budget."""

from __future__ import annotations

from monitor_agent.metrics import names as metric_names
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline import run_views as views
from monitor_agent.pipeline.consequences import Consequences
from monitor_agent.pipeline.layer_cap import cap_layers
from monitor_agent.pipeline.placement import Placement
from monitor_agent.pipeline.registry import LiveRun
from monitor_agent.records.types import (
    CheckpointRecord,
    EndRecord,
    EvalRecord,
    Record,
    RunRecord,
    StepRecord,
    launcher_stopped,
)
from monitor_agent.runs import attempt_end
from monitor_agent.runs.checkpoint_ledger import LedgerEntry
from monitor_agent.runs.run_state import RunState
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store, StoredCheckpoint


class StateApply:
    """Folds records into their runs' state."""

    def __init__(self, settings: Settings, store: Store, metrics: SelfMetrics,
                 placement: Placement, consequences: Consequences) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.placement = placement
        self.consequences = consequences

    def apply(self, live: LiveRun, record: Record, arrival: float,
              origin: int | None = None, attempt: int = 1) -> None:
        """Fold a record into its run's state (``arrival``: when it reached this sidecar,
        on its clock): a step or eval into its rank, a run record into the run (and, of
        this sidecar's own ranks, its placement), an end that ends the run into its status
        and lifecycle. ``origin``: the node whose sidecar forwarded it (None: our own)."""
        run = live.state
        if origin is not None:
            run.rank(record.rank).remote = True
        if isinstance(record, StepRecord):
            run.apply_step(record, arrival, metric_names.STEP_DURATION_BUCKETS)
            if live.lifecycle.silent is not None:  # it was only quiet
                live.lifecycle.heard()
                self.consequences.events(live, [], arrival)
        elif isinstance(record, EvalRecord):
            run.apply_eval(record, arrival)
        elif isinstance(record, RunRecord):
            run.apply_run(record, remote=origin is not None)
            if origin is None:
                self.placement.place(live, record, attempt)
                self.consequences.retire(live)
            else:
                self.placement.expect_forwarded(live, record, attempt)
        elif isinstance(record, EndRecord) and views.ends_run(live, record, attempt) \
                and not self._cut_off(live, record, attempt):
            run.apply_end(record.status, arrival)
            self.store.set_status(run.run_id, record.status, record.time)
            self.consequences.events(live, live.lifecycle.ended(record.status, record.step), arrival)

    def _cut_off(self, live: LiveRun, record: EndRecord, attempt: int) -> bool:
        """A worker its launcher stopped while another rank of its attempt did not end so
        (runs/attempt_end.py ``cut_off``): the run goes on to its relaunch or its silence."""
        if not launcher_stopped(record.status, record.error):
            return False  # (asked first: no store read for any other end)
        ranks = {r for n, r in live.attempts.stepped if n == attempt}
        return attempt_end.cut_off(record.rank, record.status, record.error, ranks,
                                   self.store.rank_ends(live.run_id, attempt))

    def checkpoint(self, run: RunState, record: CheckpointRecord, attempt: int) -> None:
        """Keep a checkpoint in the run's ledger (stored, so a restart keeps it), with the
        data position its state resumes from: the record's own, else that of its rank's
        step record of the same step (sent just before it, on the same queue)."""
        position = record.data_position
        rank = run.ranks.get(record.rank)
        if position is None and rank is not None and rank.data_step == record.step:
            position = rank.data_position
        stored = self.store.add_checkpoint(StoredCheckpoint(
            run.run_id, record.step, attempt, record.rank, record.path, record.time,
            record.bytes, record.tag, record.attempt, position))
        run.ledger.add(LedgerEntry(stored.step, stored.path, stored.rank, stored.time,
                                   stored.attempt, stored.bytes, stored.tag, stored.token,
                                   stored.position))
        run.changed()

    def cap_layers(self, run: RunState, record: StepRecord) -> StepRecord:
        """The step with its layers past ``max_layer_names_per_run`` dropped (counted)."""
        record, dropped = cap_layers(record, run.layer_names,
                                     self.settings.max_layer_names_per_run)
        if dropped:
            self.metrics.dropped_series.labels(reason="max_layer_names").inc(dropped)
        return record
