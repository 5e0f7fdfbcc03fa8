"""The admit stage: which records of a batch may join their runs. A run is admitted under
the request's budget of new runs and ``max_active_runs``; a record under the run's rank
budget and the checks of docs/hostile-input.md ("Every door": plausible steps, forged
ranks, future or clashing checkpoints, agreements about actions never decided); then it
joins an attempt of its run (pipeline/attempt_join.py)."""

from __future__ import annotations

from collections.abc import Sequence

from monitor_agent.alerting.sink import AlertSink
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.admission import AdmissionBudget
from monitor_agent.pipeline.attempt_join import AttemptJoin
from monitor_agent.pipeline.batch import Admitted, Incoming, IngestResult
from monitor_agent.pipeline.plausible import forged_rank, implausible_step
from monitor_agent.pipeline.registry import LiveRun, RunRegistry
from monitor_agent.records.types import AgreementRecord, CheckpointRecord, StepRecord
from monitor_agent.runs.checkpoint_ledger import CHECKPOINT_STEP_SLACK
from monitor_agent.runs.run_state import RunState
from monitor_agent.settings import Settings


class Admission:
    """Lets a batch's records into their runs, or says why not."""

    def __init__(self, settings: Settings, metrics: SelfMetrics, alerts: AlertSink,
                 registry: RunRegistry, attempts: AttemptJoin) -> None:
        self.settings = settings
        self.metrics = metrics
        self.alerts = alerts
        self.registry = registry
        self.attempts = attempts

    def admit(
        self, items: Sequence[Incoming], result: IngestResult, now: float,
        source: str | None = None,
    ) -> list[Admitted]:
        admitted: list[Admitted] = []
        seen: dict[tuple[str, int], int] = {}  # the batch's own steps count as history
        paths: dict[tuple[str, int, int], str] = {}  # the batch's own checkpoints
        stepped: set[tuple[str, int, int]] = set()  # (run, attempt, rank) of its steps
        budget = AdmissionBudget(self.settings)
        for item in items:
            record = item.record
            new = self.registry.get(record.run_id) is None
            reason, label = (budget.refuse_run(record.run_id) if new else None), "too_many_new_runs"
            if reason is None:
                live = self.registry.admit(record.run_id, now)
                if live is None:
                    reason = (f"too many active runs (max_active_runs="
                              f"{self.settings.max_active_runs}, none silent for run_displace_"
                              f"after_seconds={self.settings.run_displace_after_seconds:g}); "
                              "retry later")
                    label = "too_many_runs"
                else:
                    if new:
                        budget.took_run(record.run_id)
                        # Where a run came from (the request's peer): a flood of made-up
                        # runs is budgeted per source in the outbox (notify/fairness.py).
                        live.state.source = live.state.source or source
                    reason, label = self._refused(live, item, seen, stepped, budget, now)
            if reason is not None:
                result.rejected.append({"index": item.index, "reason": reason})
                self.metrics.rejections.labels(reason=label).inc()
                continue
            assert live is not None
            entry = self.attempts.join(live, item, result, now)
            if isinstance(entry, str):
                result.rejected.append({"index": item.index, "reason": entry})
                self.metrics.rejections.labels(reason="too_many_attempts").inc()
                continue
            if isinstance(record, StepRecord):
                stepped.add((record.run_id, entry.attempt, record.rank))
            if isinstance(record, CheckpointRecord):
                clash = checkpoint_clash(live, record, entry.attempt, paths)
                if clash is not None:
                    result.rejected.append({"index": item.index, "reason": clash})
                    self.metrics.rejections.labels(reason="checkpoint").inc()
                    continue
            admitted.append(entry)
        return admitted

    def _refused(self, live: LiveRun, item: Incoming, seen: dict[tuple[str, int], int],
                 stepped: set[tuple[str, int, int]], budget: AdmissionBudget,
                 now: float) -> tuple[str | None, str]:
        """Why a record may not join its run, and the label it is counted under; (None,
        "") when it may. The same checks for a record of this sidecar's own client and
        for a digest a node sidecar forwarded (docs/hostile-input.md, "Every door")."""
        record, run = item.record, live.state
        reason = budget.refuse_rank(run, record.rank)
        if reason is not None:
            return reason, "too_many_ranks"
        if isinstance(record, CheckpointRecord):
            reason = future_checkpoint(run, record, seen) or \
                live.attempts.writer(record, stepped)
            return reason, "checkpoint"
        reason = implausible_step(run, record, seen, self.settings.max_step_jump, now)
        if reason is not None:
            return reason, "implausible_step"
        reason = forged_rank(run, record, stepped)
        if reason is None and isinstance(record, AgreementRecord) and run.leader is None \
                and not self.alerts.took_action(run.run_id, record.action_id, record.action):
            # The sidecar that decides the run's actions knows each one; a node sidecar
            # (``run.leader``) may lack one (that is what the record may say): its leader
            # checks the digest.
            reason = (f"action_id: run {run.run_id} has no {record.action} action "
                      f"{record.action_id}: an agreement record is about an action the "
                      "run's sidecar decided")
        return reason, "forged_rank"


def future_checkpoint(run: RunState, record: CheckpointRecord,
                       seen: dict[tuple[str, int], int]) -> str | None:
    """Why a checkpoint's step cannot be real yet: past the run's latest step from any
    rank (this batch's included) plus ``CHECKPOINT_STEP_SLACK``, or None."""
    latest = max([run.last_step, *(s for (r, _), s in seen.items() if r == record.run_id)])
    if record.step <= latest + CHECKPOINT_STEP_SLACK:
        return None
    return (f"step: checkpoint step {record.step} of run {record.run_id} is in the future: "
            f"the run's latest step from any rank is {latest} (send the checkpoint after "
            f"the step it holds; slack {CHECKPOINT_STEP_SLACK})")


def checkpoint_clash(live: LiveRun, record: CheckpointRecord, attempt: int,
                      paths: dict[tuple[str, int, int], str]) -> str | None:
    """Why a checkpoint contradicts the ledger (the same step of the same attempt under
    another path), or None; an identical one is a duplicate, not a clash."""
    key = (record.run_id, record.step, attempt)
    known = live.state.ledger.get(record.step, attempt)
    path = known.path if known is not None else paths.get(key)
    if path is None:
        paths[key] = record.path
        return None
    if path == record.path:
        return None
    return (f"path: run {record.run_id} already has a checkpoint at step {record.step} "
            f"(path {path[:200]!r}); a step has one checkpoint per attempt")
