"""The consequences of a run's actions and lifecycle: a rollback, stop or restart decided
(here, or adopted from the run's leader), the lifecycle events it and the records cause
(runs/lifecycle.py: an attempt settled, a plan applied, the run ended or silent), the plan
applied to the run's state, the verdict kept on its row, the node drained when a restart
leaves it out, and the two databases reconciled after a crash between their commits."""

from __future__ import annotations

import logging

from monitor_agent.alerting.sink import AlertSink
from monitor_agent.cluster.drain import NodeDrain
from monitor_agent.cluster.link_state import LinkBook
from monitor_agent.cluster.stopped_rank import ENDED, end_stopped
from monitor_agent.detectors.support.context import SkipPlan
from monitor_agent.pipeline import run_views as views
from monitor_agent.pipeline.batch import IngestResult
from monitor_agent.pipeline.placement import Placement
from monitor_agent.pipeline.registry import LiveRun, RunRegistry
from monitor_agent.records.actions import RESTART_ACTIONS, Action
from monitor_agent.records.types import AgreementRecord
from monitor_agent.runs.lifecycle import AttemptSettled, Ended, Event, RolledBack
from monitor_agent.runs.run_state import RunState
from monitor_agent.runs.verdict import Verdict
from monitor_agent.storage.store import Store

log = logging.getLogger(__name__)


class Consequences:
    """What follows from a run's actions and lifecycle events, where it must land."""

    def __init__(self, store: Store, alerts: AlertSink, registry: RunRegistry,
                 links: LinkBook, placement: Placement, end_stopped_ranks: bool = False
                 ) -> None:
        self.store = store
        self.alerts = alerts
        self.registry = registry
        self.links = links
        self.placement = placement
        # This sidecar's id (cluster/identity.py) and its node's drain (cluster/drain.py),
        # set by the app: a decision that leaves this node out drains it.
        self.identity = ""
        self.node_drain: NodeDrain | None = None
        # A restart decided ends this node's stopped ranks (cluster/stopped_rank.py).
        self.end_stopped_ranks = end_stopped_ranks

    def revise_pending(self, live: LiveRun, now: float, result: IngestResult) -> None:
        """The pending plan's checkpoint may have just turned suspect (the ledger judged a
        finding): decided again, by the sidecar that decides the run's actions (a node
        sidecar adopts them)."""
        run, pending = live.state, live.lifecycle.rollback
        if pending is None or run.leader is not None:
            return
        revised = self.alerts.revise(views.context(run), now)
        if revised:
            live.lifecycle.withdrawn(pending.action_id)
            result.actions.extend(revised)
            self.acted(run.run_id, revised, now)

    def acted(self, run_id: str, actions: list[Action], now: float) -> None:
        """Actions decided for a run, here or (on a node sidecar) adopted from its leader."""
        live = self.registry.get(run_id)
        if live is not None:
            self.events(live, live.lifecycle.acted(actions), now)
        self._drain(live, run_id, actions)
        self._end_stopped(live, actions)

    def events(self, live: LiveRun, events: list[Event], now: float) -> None:
        """Hand each of a run's lifecycle events (runs/lifecycle.py) to whatever consumes
        it: the goodput ledger, alerting, the applied plan, the verdict; then the run's
        phase, as the read side shows it."""
        run = live.state
        for event in events:
            if isinstance(event, AttemptSettled) and event.attempt.kind != "first":
                # The ledger first: the pages closed below say what the restart cost.
                views.settle_goodput(run, event.attempt,
                                     any(isinstance(e, RolledBack) for e in events))
                # Alerting applies a rollback this attempt resumed at, closes the alerts
                # about what it abandoned, and may decide again (alerting/rollback.py).
                self.alerts.attempt_settled(run.run_id, event.attempt.start_step or 0, now,
                                            event.attempt.started_at)
                self.publish_rollback(live)  # a restart forgets earlier windows
                run.roster.reformed(now)
                run.left_out = None
                self.retire(live)
            elif isinstance(event, RolledBack):
                self.publish_rollback(live)
                self.store_verdict(run)  # the attempt is a rollback, not a crash's resume
            elif isinstance(event, Ended):
                verdict = self.store_verdict(run)
                self.alerts.run_ended(run.run_id, event.status, now, event.step,
                                      verdict=verdict.words)
                leader = self.placement.following(run)
                if (leader is not None and event.status == "completed"
                        and self.links.lost(leader, now)):
                    # Its partial-view pages just resolved here, saying so: the leader,
                    # catching up, keeps them to itself (no second resolve).
                    self.store.uplink.mark_closed(leader, run.run_id)
        phase = live.lifecycle.describe()
        if phase != run.phase:
            run.phase, run.phase_state = phase, live.lifecycle.phase.value
            run.changed()

    def publish_rollback(self, live: LiveRun) -> None:
        """Change the run's state to its newest applied rollback (the lifecycle's
        ``applied``; none: what an earlier one set is cleared), where its consumers read
        it: the windows a later plan skips too (``RunState.skipped``), the windows the
        resumed run's data is checked against (detectors/window_trained.py), and the
        verdict's account of every resumed attempt (a rollback, or a resume after a
        crash)."""
        run, applied = live.state, live.lifecycle.applied
        run.skipped = applied.skip if applied is not None else ()
        run.skipped_unit = applied.unit if applied is not None else "positions"
        live.suite.ctx.skip_plan = None if applied is None else SkipPlan(
            applied.action_id, applied.skip, applied.resume_position, applied.start_step,
            applied.unit)
        run.verdict.rollbacks = self.registry.rollbacks(live)

    def store_verdict(self, run: RunState) -> Verdict:
        """Put the run's verdict on its row when it changed (a cause, a NaN stretch, the
        end): what the API shows once the run has left memory."""
        verdict = run.judged()
        text = verdict.to_json()
        if text != run.stored_verdict:
            self.store.set_verdict(run.run_id, text)
            run.stored_verdict = text
            run.verdict_label = verdict.label
            run.changed()
        return verdict

    def retire(self, live: LiveRun) -> None:
        """Forget the ranks past the job's world size: a relaunch re-formed it with fewer
        (a node left out), and their kept history must not make them hung or awaited."""
        world = views.world(live.state)
        gone = {r for r in live.state.ranks if r >= world}
        if gone and world < len(live.state.ranks):
            live.state.retire(gone)
            live.suite.retire(gone)

    def _drain(self, live: LiveRun | None, run_id: str, actions: list[Action]) -> None:
        """Drain this node when a restart leaves it out (cluster/drain.py): a node the plan
        names by this sidecar's id, or (``leads``: the run is judged here) by none, the
        leader's own node."""
        if self.node_drain is None:
            return
        leads = live is not None and live.state.leader is None
        local = {r for r, s in live.state.ranks.items() if not s.remote} if live else set()
        for action in actions:
            if action.action not in RESTART_ACTIONS or action.honoured_step is not None:
                continue
            plan = action.restart
            for node in plan.exclude if plan is not None else ():
                # Named by no sidecar: the leader's own node, if its own ranks run there
                # (a leader that only relays other nodes' ranks drains nothing of its own).
                own = leads and bool(local) and (not node.ranks or bool(set(node.ranks) & local))
                if (node.sidecar == self.identity) if node.sidecar else own:
                    self.node_drain.drain(run_id, action.id, node.why)
                    if live is not None and not leads:
                        live.state.left_out = live.state.attempt

    def _end_stopped(self, live: LiveRun | None, actions: list[Action]) -> None:
        """A restart decided (or adopted): SIGKILL each of this sidecar's own ranks whose
        process is stopped, which cannot leave with exit 75 itself, so its launcher runs
        the job again without waiting out its grace (cluster/stopped_rank.py says what is
        checked first)."""
        if live is None or not self.end_stopped_ranks or not any(
                a.action in RESTART_ACTIONS and a.honoured_step is None for a in actions):
            return
        run = live.state
        for rank, process in sorted(run.processes.items()):
            state = run.ranks.get(rank)
            if state is not None and state.remote:
                continue  # another node's now (a re-formed job): its own sidecar's to end
            outcome = end_stopped(process)
            if outcome == ENDED:
                log.warning("run %s: rank %d (pid %d) was stopped; ended (SIGKILL) for the "
                            "restart", run.run_id, rank, process.pid)

    def decide_deferred_rollback(self, run: RunState, now: float,
                                 result: IngestResult) -> None:
        """Decide the run's deferred rollback, if it has one, once it may be: a rollback
        that waits for a rank to report up to the fault's onset (a save before it may have
        been on its way, alerting/rollback.py ``behind``) is decided once the ranks caught
        up or the wait is over. Called after each record judged and on each tick."""
        if not self.alerts.waiting(run.run_id):
            return
        taken = self.alerts.retry(views.context(run), now)
        if taken:
            result.actions.extend(taken)
            self.acted(run.run_id, taken, now)

    def plan_refused(self, live: LiveRun, record: AgreementRecord, now: float,
                     result: IngestResult) -> None:
        """The job refused its pending rollback (``unreported``: the plan names a
        checkpoint no process of the job saved, so no rank loads it, and the client stops
        the run): withdrawn for a stop, so the run's page and phase say it stopped rather
        than wait for a relaunch (alerting/episodes.py ``refused``)."""
        pending = live.lifecycle.rollback
        if (record.outcome != "unreported" or record.action != "rollback" or pending is None
                or pending.action_id != record.action_id):
            return
        taken = self.alerts.refused(views.context(live.state), record.action_id, now)
        if taken:
            live.lifecycle.withdrawn(record.action_id)
            result.actions.extend(taken)
            self.acted(live.run_id, taken, now)

    def reconcile(self, live: LiveRun, now: float) -> None:
        """Make the two databases agree after a crash between their commits
        (pipeline/failpoints.py). The record store settles a new attempt before alerting
        hears of it: an attempt settled here whose news never reached alerting is told
        again, as it would have been live. The rollback still pending there is applied if
        the attempt started after it was decided, at or before its window. The goodput
        ledger settles every attempt it has not settled yet."""
        lifecycle, run = live.lifecycle, live.state
        pending = lifecycle.rollback
        decided = None if pending is None else next(
            (a.created_at for a in lifecycle.open_actions() if a.id == pending.action_id),
            None)
        for attempt in live.attempts.attempts:
            if attempt.kind not in ("resumed", "restarted") or attempt.start_step is None:
                continue
            applies = (pending is not None and decided is not None
                       and attempt.start_step <= pending.skip_from
                       and attempt.started_at >= decided)
            if applies:
                log.warning("run %s: attempt %d resumed at step %d applied rollback %d "
                            "before a crash; alerting is told now", run.run_id,
                            attempt.number, attempt.start_step,
                            pending.action_id if pending is not None else 0)
                self.events(live, lifecycle.settled(attempt), now)
                pending = None
            elif attempt.number not in run.goodput.settled_attempts:
                views.settle_goodput(run, attempt,
                                     attempt.start_step in lifecycle.applied_starts)

    def answer_open_actions(self, run_ids: set[str], result: IngestResult) -> None:
        """Every ingest answer carries its runs' open actions (the client keeps each once):
        a plan decided on another rank's finding, or by the leader on another node's,
        reaches this rank with its next answer, not its next poll."""
        given = {a.id for a in result.actions}
        for run_id in run_ids:
            live = self.registry.get(run_id)
            if live is None:
                continue
            for action in live.lifecycle.open_actions():
                if action.id not in given:
                    result.actions.append(action)
