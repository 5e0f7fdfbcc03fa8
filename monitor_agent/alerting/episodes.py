"""``Episodes``: findings become alert episodes, and episodes become notifications.

Each public method is one transaction on ``AlertStore`` that changes alert state and
queues what people must hear of it in the outbox, so the two commit together. Decisions
come from the pure functions in ``lifecycle.py``; each is counted by its ``Reason``.
``Alerting`` (``service.py``) owns one and adds threads, the admin side and the API.

The ``Episodes`` of an ``Alerting`` (not started: the outbox only queues), through one
NaN alert's life::

    >>> from prometheus_client import CollectorRegistry
    >>> from monitor_agent.alerting.service import Alerting
    >>> alerting = Alerting(AlertingSettings(), ":memory:", CollectorRegistry())
    >>> episodes = alerting.episodes
    >>> nan = Finding("nan_inf", Severity.CRITICAL, "gpt-7", step=300, message="loss is NaN")
    >>> episodes.handle(RunContext("gpt-7"), [nan], now=1000.0)   # (began, actions taken)
    (True, [])
    >>> episodes.flush(now=1001.0), alerting.outbox.pending   # group wait over: paged
    (None, 1)
    >>> episodes.tick(now=1000.0 + 600)   # TrainingNanInf resolves after 10 quiet minutes
    >>> [(a.state, a.notified) for a in alerting.store.alerts()], alerting.outbox.pending
    ([('resolved', 'resolved')], 2)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from monitor_agent.alerting import lifecycle as lc
from monitor_agent.alerting import rollback
from monitor_agent.alerting import rule_actions as actions
from monitor_agent.alerting.alert_store import AlertStore, AlertTx
from monitor_agent.alerting.alerts import RunContext, StoredAlert
from monitor_agent.alerting.events import dashboard_url, notifications, to_event
from monitor_agent.alerting.lifecycle import Reason
from monitor_agent.alerting.related import RelatedFindings, follows
from monitor_agent.alerting.rules import Rule, first_match
from monitor_agent.alerting.settings import AlertingSettings
from monitor_agent.alerting.silences import Silence, silenced_by
from monitor_agent.metrics.alerting import AlertingMetrics
from monitor_agent.notify.base import AlertEvent, Notifier
from monitor_agent.notify.outbox import Outbox
from monitor_agent.records import wire
from monitor_agent.records.actions import RESTART_ACTIONS, Action, Stop
from monitor_agent.records.types import Finding, Severity
from monitor_agent.storage.database import StorageError

log = logging.getLogger(__name__)
CRASHED = "crashed"  # detectors/crashed.py's type: a launcher's relaunch closes its alert
Item = tuple[AlertEvent, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Deferred:
    """A rollback due for ``finding`` (its alert ``fingerprint``), waiting since ``since``
    for the ranks ``rollback.behind`` names; ``heard`` is when one of them last moved on
    (``steps``: their latest steps then)."""

    rule: Rule
    finding: Finding
    fingerprint: str
    since: float
    heard: float
    steps: dict[int, int]

    def until(self) -> float:
        """When the wait ends unless an awaited rank moves on: ROLLBACK_WAIT_SECONDS
        without news of them, ROLLBACK_WAIT_LIMIT_SECONDS at most."""
        return min(self.heard + rollback.ROLLBACK_WAIT_SECONDS,
                   self.since + rollback.ROLLBACK_WAIT_LIMIT_SECONDS)

    def moved(self, run: RunContext, late: list[int], now: float) -> Deferred:
        """This wait, with ``heard`` at ``now`` if an awaited rank's step moved on."""
        steps = {r: run.rank_steps.get(r, -1) for r in late}
        if any(s > self.steps.get(r, -1) for r, s in steps.items()):
            return dataclasses.replace(self, heard=now, steps=steps)
        return self


Costs = Callable[[str, str, int, bool], str | None]
"""``costs(run_id, alert type, finding step, rolled_back)``: what the incident a resolving
alert was about cost the run ("this hang cost 14 min x 64 GPUs = 15 GPU-hours"), or None."""


class Episodes:
    """The alert state machine over the store, with the outbox in the same transactions."""

    def __init__(self, settings: AlertingSettings, rules: list[Rule], store: AlertStore,
                 outbox: Outbox, notifiers: dict[str, Notifier],
                 metrics: AlertingMetrics) -> None:
        self.settings = settings  # read live: group_wait_seconds may be changed at runtime
        self.rules = rules
        self.store = store
        self.outbox = outbox
        self.notifiers = notifiers
        self.metrics = metrics
        # Rollbacks due but waiting for a checkpoint rank to catch up, by run (``_wait``):
        # in memory only; after a restart the next finding of the episode decides anew.
        self.deferred: dict[str, Deferred] = {}
        # What a resolved alert's incident cost the run (runs/goodput.py), from the engine:
        # ``costs(run_id, alert type, finding step, rolled_back)`` -> words, or None.
        self.costs: Costs | None = None

    # -- findings -------------------------------------------------------------------------

    def handle(self, run: RunContext, findings: list[Finding], now: float,
               told: bool = False, closed: bool = False) -> tuple[bool, list[Action]]:
        """One record's findings: (whether an episode began, the actions rules took).
        ``told``: people heard of them already (``AlertSink.handle``): the episode fires
        quietly, as if this sidecar had paged it, and no rule acts; ``closed``: they heard
        it resolve too, so its resolve here goes out to nobody."""
        started, taken = False, []
        with self.store.tx() as tx:
            for finding in findings:
                began, action = self._one(tx, run, finding, now, told)
                if closed:
                    rule = self._rule(run, finding)
                    if rule is not None:
                        tx.resolved_elsewhere(lc.fingerprint(run.run_id, rule.name,
                                                             _identity(rule, finding)))
                started |= began
                if action is not None:
                    taken.append(action)
                    self._announce(tx, action, now)
        return started, taken

    def preview(self, run: RunContext, findings: list[Finding], now: float) -> int:
        """Begin episodes (``count`` 0) for a record sent ahead of its turn; see
        ``Alerting.preview``. Returns how many began."""
        begun = 0
        with self.store.tx() as tx:
            for f in findings:
                rule = self._rule(run, f)
                if rule is None:
                    continue
                identity = _identity(rule, f)
                fp = lc.fingerprint(run.run_id, rule.name, identity)
                alert = tx.alert(fp)
                if alert is None or lc.on_finding(alert.timing(), f.step) is Reason.FIRST:
                    tx.begin_episode(self._episode(fp, run, rule, identity, f, now, count=0))
                    self._count(Reason.PREVIEWED)
                    begun += 1
        return begun

    def _rule(self, run: RunContext, f: Finding) -> Rule | None:
        return None if f.log_only else first_match(self.rules, f, run.match_labels())

    def _one(self, tx: AlertTx, run: RunContext, f: Finding, now: float,
             told: bool = False) -> tuple[bool, Action | None]:
        rule = self._rule(run, f)
        if rule is None:
            self._count(Reason.LOG_ONLY if f.log_only else Reason.UNMATCHED)
            return False, None
        identity = _identity(rule, f)
        fp = lc.fingerprint(run.run_id, rule.name, identity)
        alert = tx.alert(fp)
        reason = lc.on_finding(alert.timing() if alert else None, f.step)
        previewed = alert is not None and alert.count == 0 and alert.state != "resolved"
        if previewed:  # the in-order copy of a previewed record: this episode's first
            reason = Reason.SUPPRESSED
        if reason is Reason.FIRST and self._group(tx, run, rule, f, now):
            self._count(Reason.GROUPED)
            return False, None
        if reason is Reason.FIRST and told:
            tx.begin_episode(self._episode(fp, run, rule, identity, f, now))
            tx.mark_sent(fp, now)
            self._count(Reason.TOLD)
            return False, None
        if reason is Reason.FIRST:
            tx.begin_episode(self._episode(fp, run, rule, identity, f, now))
            return True, None if told else self._act(tx, run, rule, f, fp, 1, now)
        self._count(reason)
        if reason is Reason.REPLAYED and alert is not None and self._late(run, rule, f, told):
            return False, self._act(tx, run, rule, f, fp, alert.count + 1, now)
        if reason is not Reason.SUPPRESSED or alert is None:
            return False, None
        self._merge(tx, alert, rule, f, now, previewed)
        tx.set_checkpoint(fp, run.checkpoint_line)
        return False, None if told else self._act(tx, run, rule, f, fp, alert.count + 1, now)

    @staticmethod
    def _late(run: RunContext, rule: Rule, f: Finding, told: bool) -> bool:
        """Whether a finding at a step before its episode's latest may still decide the
        episode's rollback or restart: one rank's records reach the leader after
        another's (node 1's sidecar forwards late), so the episode may have begun on
        rank 0's finding at step 105, made while node 1 was not heard (a partial view: no
        action), and node 1's own finding at step 67 is news, not a replay. Deciding on
        it is safe: a decision taken already is pending (``take`` finds it) or applied
        (the run is on a later attempt, and this finding, of the replaced history, is
        left out); a replay after a restart is the same."""
        return (not told and not f.partial_view and f.attempt >= run.attempt
                and rule.action in ("rollback", *RESTART_ACTIONS))

    def _group(self, tx: AlertTx, run: RunContext, rule: Rule, f: Finding, now: float) -> bool:
        """Count ``f`` under the open page it follows from (alerting/related.py), if any;
        True when it is one (a replayed one included: it was counted before)."""
        severity, acts = rule.severity_for(f), rule.action != "notify-only"
        pages = tx.open_pages(run.run_id)
        silences = tx.active_silences(now) if pages else []
        for page in pages:
            if follows(page.severity, page.state, page.first_step, severity, f, acts) \
                    and not silenced_by(silences, page):
                related = RelatedFindings.from_json(page.related)
                if related.add(f):
                    tx.set_related(page.fingerprint, related.to_json())
                return True
        return False

    def _merge(self, tx: AlertTx, alert: StoredAlert, rule: Rule, f: Finding, now: float,
               previewed: bool) -> None:
        severity = alert.severity if rule.severity else max(
            Severity.parse(alert.severity), f.severity).label
        # Before the first page the episode's first finding is the news (the step it
        # began at); once firing, repeats tell the latest one.
        keep = alert.state == "pending" and severity == alert.severity and not previewed
        tx.merge_finding(
            alert.fingerprint, now, f.step,
            finding=alert.finding if keep else wire.dumps(f.to_dict()),
            layer=(alert.layer or f.layer) if keep else f.layer, severity=severity)

    def _act(self, tx: AlertTx, run: RunContext, rule: Rule, f: Finding, fp: str, count: int,
             now: float) -> Action | None:
        if not actions.due(rule, count):
            return None
        if f.partial_view:  # a decision for every rank needs every rank in view
            self._count(Reason.PARTIAL)
            log.warning("run %s: rule %s would act on %s, but the run's view is partial: "
                        "no action (%s)", f.run_id, rule.name, f.type,
                        f.evidence.get("view_reason"))
            return None
        if rule.action == "rollback" and self._wait(tx, run, rule, f, fp, now):
            return None
        action = actions.take(tx, rule, f, fp, now, run)
        if action is None:
            return None
        log.warning("%s (run %s, %s)", action.message, f.run_id, f.type)
        return action

    def _wait(self, tx: AlertTx, run: RunContext, rule: Rule, f: Finding, fp: str,
              now: float) -> bool:
        """Whether a due rollback waits for the ranks that report checkpoints to reach the
        fault's onset (alerting/rollback.py ``behind``); ``retry`` decides it later."""
        late = rollback.behind(run.rank_steps, run.checkpoint_ranks, f)
        waiting = self.deferred.get(run.run_id)
        if waiting is not None:
            waiting = waiting.moved(run, late, now)
        if not late or (waiting is not None and now >= waiting.until()):
            self.deferred.pop(run.run_id, None)
            return False
        if waiting is None and tx.pending_rollbacks(run.run_id):
            return False  # decided already: take() notes it
        self.deferred[run.run_id] = waiting or Deferred(
            rule, f, fp, since=now, heard=now,
            steps={r: run.rank_steps.get(r, -1) for r in late})
        tx.note_action(fp, f"rollback waits for rank {', '.join(map(str, late))} to report "
                           f"up to step {rollback.onset_of(f)} (a save before the fault, or "
                           "their own finding of an earlier onset, may be on their way)")
        return True

    def retry(self, run: RunContext, now: float) -> list[Action]:
        """Decide a rollback that waited (``_wait``), once the ranks caught up or the wait
        is over; the actions taken."""
        waiting = self.deferred.get(run.run_id)
        if waiting is None:
            return []
        late = rollback.behind(run.rank_steps, run.checkpoint_ranks, waiting.finding)
        waiting = self.deferred[run.run_id] = waiting.moved(run, late, now)
        if late and now < waiting.until():
            return []
        del self.deferred[run.run_id]
        with self.store.tx() as tx:
            action = actions.take(tx, waiting.rule, waiting.finding, waiting.fingerprint, now,
                                  run)
            if action is None:
                return []
            log.warning("%s (run %s, %s)", action.message, run.run_id, waiting.finding.type)
            self._announce(tx, action, now)
        return [action]

    def revise(self, run: RunContext, now: float) -> list[Action]:
        """Withdraw each pending rollback whose checkpoint is no longer clean and decide
        it again.

        A finding that arrived after the decision can make the plan's checkpoint suspect
        (runs/checkpoint_ledger.py): another rank's records of an earlier onset, say.
        Such a plan would send the run back to damaged weights. So it is withdrawn, and the
        same fault is decided again from before that checkpoint: to the last clean one
        before it, under the same rollback number (the budget is not spent twice). With
        none left, the run is asked to stop. The ranks learn of the new plan from their
        next answer, as of any action, and people already paged hear of it."""
        clean = {step for step, _ in run.clean_checkpoints}
        taken: list[Action] = []
        with self.store.tx() as tx:
            for old, fp in tx.pending_rollbacks(run.run_id):
                plan = old.rollback
                rule = next((r for r in self.rules if r.name == old.rule), None)
                if plan is None or plan.checkpoint_step in clean or rule is None:
                    continue
                step = plan.checkpoint_step
                fault = Finding(old.type, Severity.ERROR, run.run_id, step=old.step,
                                message="", evidence={"onset_step": step})
                decision = rollback.decide(
                    rule, fault, run.clean_checkpoints, plan.number, rollback.Positions(
                        run.checkpoint_positions, run.data, run.skipped, run.skipped_unit,
                        run.skips_by))
                why = f"checkpoint step {step} turned suspect"
                if isinstance(decision, Stop):
                    kind, new_plan, message = "stop", None, (
                        f"{decision.why} (rule {rule.name}: the rollback to step {step} was "
                        f"withdrawn, {why})")
                else:
                    kind, new_plan = decision.kind, decision.plan
                    message = f"{new_plan.describe()} (revised: {why})"
                action = Action(id=0, run_id=run.run_id, action=kind, rule=rule.name,
                                type=old.type, step=old.step, created_at=now, message=message,
                                plan=new_plan)
                new = tx.add_action(action, fp)
                tx.withdraw(old, new, why, fp)
                log.warning("run %s: rollback %d withdrawn (%s); now: %s", run.run_id, old.id,
                            why, new.message)
                self._announce(tx, new, now)
                taken.append(new)
        return taken

    def refused(self, run: RunContext, action_id: int, now: float) -> list[Action]:
        """The job refused pending rollback ``action_id`` (an ``agreement`` record, outcome
        ``unreported``: it names a checkpoint no process of the job saved, so no rank loads
        it). The run would train on from the fault the plan was to take it from, so the
        plan is withdrawn for a stop, as a spent budget stops the run, and the client
        stops on its own at the same call (``Monitor.should_stop``); people already paged
        hear of it."""
        taken: list[Action] = []
        with self.store.tx() as tx:
            for old, fp in tx.pending_rollbacks(run.run_id):
                if old.id != action_id:
                    continue
                path = old.rollback.checkpoint_path if old.rollback is not None else None
                why = f"the job refused it (no process of the job saved {path})"
                action = Action(id=0, run_id=run.run_id, action="stop", rule=old.rule,
                                type=old.type, step=old.step, created_at=now,
                                message=f"rollback {old.id} refused by the job: it names a "
                                        f"checkpoint no process of the job saved ({path}); "
                                        "stopping; a human must look (rule "
                                        f"{old.rule}, {old.type} at step {old.step})")
                new = tx.add_action(action, fp)
                tx.withdraw(old, new, why, fp)
                log.warning("run %s: rollback %d refused by the job; now: %s", run.run_id,
                            old.id, new.message)
                self._announce(tx, new, now)
                taken.append(new)
        return taken

    def _announce(self, tx: AlertTx, action: Action, now: float) -> None:
        """People already paged about this alert hear of the action now, cooldown or not."""
        for alert in tx.paged_with_action(action.run_id, action.rule, action.message):
            self._count(Reason.ACTION)
            self._enqueue(tx, [self._mark_sent(tx, alert, Reason.ACTION, now)], now)

    def _episode(self, fp: str, run: RunContext, rule: Rule, identity: dict[str, str],
                 f: Finding, now: float, count: int = 1) -> StoredAlert:
        """A new episode: pending until the group flush (the last page time is kept);
        ``count`` 0 for one begun by a preview."""
        return StoredAlert(
            fingerprint=fp, run_id=run.run_id, rule=rule.name, type=f.type,
            severity=rule.severity_for(f).label, layer=f.layer, rank=f.rank, identity=identity,
            project=run.project, labels=run.labels, channels=tuple(rule.channels),
            cooldown=rule.cooldown, repeat_interval=rule.repeat_interval,
            resolve_after=rule.resolve_after, state="pending", started_at=now,
            pending_since=now, last_seen=now, last_step=f.step, count=count,
            finding=wire.dumps(f.to_dict()),
            dashboard_url=dashboard_url(self.settings.grafana_url, run.run_id, f.time or now),
            checkpoint=run.checkpoint_line,
            newcomer=run.newcomer(now, self.settings.outbox.new_run_seconds),
            first_step=f.step,
        )

    # -- clock-driven work ----------------------------------------------------------------

    def flush(self, now: float) -> float | None:
        """Fire the runs whose group wait is over; return seconds until the next is due."""
        wait = self.settings.group_wait_seconds
        by_run: dict[str, list[StoredAlert]] = {}
        for alert in self.store.alerts("pending", limit=-1):
            by_run.setdefault(alert.run_id, []).append(alert)
        # A run whose rollback waits for a rank to catch up (``_wait``) is paged once it is
        # decided (at most ROLLBACK_WAIT_LIMIT_SECONDS later), so its page says what was done.
        held = {run: d.until() for run, d in self.deferred.items() if d.until() > now}
        due = {run: rs for run, rs in by_run.items()
               if min(_since(r) for r in rs) + wait <= now and run not in held}
        for run_id in due:
            # One transaction per run: an alert that cannot be worded (a stored finding
            # that no longer parses) holds back its own run's page, not every run's.
            try:
                with self.store.tx() as tx:
                    silences = tx.active_silences(now)
                    items = [item for r in tx.in_state("pending", run_id=run_id)
                             if (item := self._fire(tx, r, silences, now)) is not None]
                    self._enqueue(tx, items, now)
            except StorageError:
                raise
            except Exception:
                log.exception("cannot page run %s; its alerts stay pending", run_id)
        later = [max(min(_since(r) for r in rs) + wait, held.get(run, now)) - now
                 for run, rs in by_run.items() if run not in due]
        return min(later) if later else None

    def _fire(self, tx: AlertTx, alert: StoredAlert, silences: list[Silence],
              now: float) -> Item | None:
        reason = lc.on_flush(alert.timing(), silenced_by(silences, alert), now,
                             acted=alert.action is not None)
        self._count(reason)
        if reason is not Reason.FIRST:
            tx.fire_quietly(alert.fingerprint)
            return None
        return self._mark_sent(tx, alert, reason, now)

    def tick(self, now: float) -> None:
        """Resolve, repeat, send what a silence or cooldown held back, re-send to Alertmanager."""
        self.flush(now)
        with self.store.tx() as tx:
            firing = tx.in_state("firing")
            silences = tx.active_silences(now)
            items: list[Item] = []
            for alert in firing:
                reason = lc.on_tick(alert.timing(), silenced_by(silences, alert), now)
                if reason is not None:
                    self._count(reason)
                    if (item := self._transition(tx, alert, reason, now)) is not None:
                        items.append(item)
            self._enqueue(tx, items, now)
            self._refresh(tx, firing, silences, now)

    def _transition(self, tx: AlertTx, alert: StoredAlert, reason: Reason,
                    now: float, ended: str | None = None,
                    closed: str = "closed with the run") -> Item | None:
        if reason is not Reason.RESOLVED:
            return self._mark_sent(tx, alert, reason, now)
        # Nobody was told it fired (silenced throughout), or the node sidecar that paged it
        # told its resolve already: close quietly.
        told = alert.notified == "firing" and not alert.resolved_elsewhere
        tx.resolve(alert.fingerprint, now, told)
        if not told:
            return None
        cost = None
        if self.costs is not None:
            try:
                cost = self.costs(alert.run_id, alert.type, _finding_step(alert),
                                  closed.startswith("closed: steps"))
            except Exception:  # the page goes out without its cost rather than not at all
                log.exception("cannot cost the incident of alert %s", alert.fingerprint)
        return (to_event(alert, "resolved", reason.value, now, ended=ended, closed=closed,
                         cost=cost), alert.channels)

    def _mark_sent(self, tx: AlertTx, alert: StoredAlert, reason: Reason, now: float) -> Item:
        tx.mark_sent(alert.fingerprint, now)
        return to_event(alert, "firing", reason.value, now), alert.channels

    def _refresh(self, tx: AlertTx, firing: list[StoredAlert], silences: list[Silence],
                 now: float) -> None:
        """Channels that forget alerts unless re-told (Alertmanager) hear of firing ones again."""
        for name, notifier in self.notifiers.items():
            every = notifier.refresh_interval
            if every is None:
                continue
            stale = [a for a in firing if a.notified == "firing" and not silenced_by(silences, a)
                     and now - (a.refreshed_at or 0.0) >= every and name in a.channels]
            tx.refreshed([a.fingerprint for a in stale], now)
            self._enqueue(tx, [(to_event(a, "firing", "refresh", now), (name,)) for a in stale],
                          now)

    def attempt_settled(self, run_id: str, start_step: int, now: float,
                        started: float | None = None) -> None:
        """A new attempt resumed at ``start_step``: pending rollbacks it applies are done,
        and the run may decide its next one (alerting/rollback.py)."""
        with self.store.tx() as tx:
            rolled = actions.applied_rollbacks(tx, run_id, start_step)
            for action in rolled:
                log.warning("run %s resumed at step %d: %s", run_id, start_step, action.message)
            # The alert's resolve (below) says it: one page per incident, one resolve.
            restarted = actions.applied_restarts(tx, run_id, start_step, now,
                                                 now if started is None else started)
            for action in restarted:
                log.warning("run %s: %s", run_id, action.message)
            # The steps from ``start_step`` on were abandoned: a finding the resumed history
            # brings there is news, not a replay of the old one (lifecycle.on_finding).
            tx.rewind(run_id, start_step - 1)
        self.flush(now + self.settings.group_wait_seconds)  # page what is pending first
        with self.store.tx() as tx:
            self._close_abandoned(tx, run_id, start_step, now, "restarted" if restarted
                                  else "rolled back" if rolled else "resumed")

    def _close_abandoned(self, tx: AlertTx, run_id: str, start_step: int, now: float,
                         how: str = "rolled back") -> None:
        """Open alerts whose latest finding is about a step the new attempt replaced are
        about a history that no longer exists: closed, saying so (after their first page
        went out: a rollback's page says what was done, however fast the run applied it). A fault the resumed
        history still has is found again by detectors rebuilt from before ``start_step``
        (pipeline/registry.py), and begins an episode of its own. A crash that the job
        merely resumed from (``how`` "resumed": no action of ours) stays open: the process
        died, whatever steps it abandoned, and the launcher's relaunch closes it saying so
        (``relaunched``)."""
        abandoned = [a for state in ("firing", "pending") for a in tx.in_state(state, run_id)
                     if _finding_step(a) >= start_step
                     and (a.type != CRASHED or how != "resumed")]
        ended = (f"run rolled back to step {start_step - 1}" if how == "rolled back"
                 else f"run {how} from step {start_step - 1}")
        closed = f"closed: steps {start_step} on were abandoned"
        items = [item for a in abandoned if (item := self._transition(
            tx, a, Reason.RESOLVED, now, ended=ended, closed=closed)) is not None]
        for _ in abandoned:
            self._count(Reason.RESOLVED)
        self._enqueue(tx, items, now)

    def relaunched(self, run_id: str, said: str, start_step: int, now: float) -> bool:
        """The job's launcher relaunched it after a crash its ranks reported: the crash
        page is that incident's, so its alert resolves now saying what was done (``said``,
        and the relaunch's cost when it abandoned steps), instead of a second page; whether
        the run had one open. What is pending is paged first: the crash is news even when
        the relaunch came within the group wait."""
        self.flush(now + self.settings.group_wait_seconds)
        with self.store.tx() as tx:
            crashed = [a for state in ("firing", "pending") for a in tx.in_state(state, run_id)
                       if a.type == CRASHED]
            items = []
            for alert in crashed:
                closed = (f"closed: steps {start_step} on were abandoned"
                          if _finding_step(alert) >= start_step else "closed: it runs again")
                item = self._transition(tx, alert, Reason.RESOLVED, now, ended=said,
                                        closed=closed)
                self._count(Reason.RESOLVED)
                if item is not None:
                    items.append(item)
            self._enqueue(tx, items, now)
        return bool(crashed)

    def hand_over(self, run_id: str, now: float) -> int:
        """The run's leader is back and has the findings this node sidecar paged while it
        was away (recorded there as told): the open partial-view alerts here are its to
        close now, so they close quietly here; one resolve, the leader's, goes out."""
        with self.store.tx() as tx:
            mine = [a for state in ("firing", "pending") for a in tx.in_state(state, run_id)
                    if a.finding_data().get("evidence", {}).get("view") == "partial"]
            for alert in mine:
                tx.resolve(alert.fingerprint, now, told=False)
                self._count(Reason.HANDED_OVER)
        return len(mine)

    def run_ended(self, run_id: str, status: str, now: float, step: int | None,
                  verdict: str | None = None) -> None:
        """A completed run resolves its alerts now, saying how it ended (``verdict``); a
        stopped one honours its stop requests."""
        if status == "stopped" and step is not None:
            with self.store.tx() as tx:
                for action in actions.honour_stops(tx, run_id, step):
                    log.warning("%s (run %s)", action.message, run_id)
                    self._announce(tx, action, now)
        elif step is not None:  # it ended otherwise: a stop still open was never honoured
            with self.store.tx() as tx:
                for action in actions.ignored_stops(tx, run_id, status, step):
                    log.warning("%s (run %s)", action.message, run_id)
        if status != "completed":
            return
        self.flush(now + self.settings.group_wait_seconds)  # page what is pending first
        with self.store.tx() as tx:
            firing = tx.in_state("firing", run_id=run_id)
            ended = f"run ended {verdict}" if verdict else "run ended"
            items = [item for a in firing if (item := self._transition(
                tx, a, Reason.RESOLVED, now, ended=ended)) is not None]
            for _ in firing:
                self._count(Reason.RESOLVED)
            self._enqueue(tx, items, now)

    def acknowledge(self, fingerprint: str, by: str, now: float) -> StoredAlert | None:
        """Someone owns it: no more reminders; channels that know acks (PagerDuty) hear it."""
        with self.store.tx() as tx:
            alert = tx.acknowledge(fingerprint, by or "someone", now)
            if alert is None:
                return None
            self._count(Reason.ACKNOWLEDGED)
            if alert.state == "firing" and alert.notified == "firing":
                item = to_event(alert, "acknowledged", "acknowledged", now), alert.channels
                self._enqueue(tx, [item], now)
        return alert

    # -- helpers --------------------------------------------------------------------------

    def _enqueue(self, tx: AlertTx, items: list[Item], now: float) -> None:
        if not items:
            return
        # A message about alerts begun while their run was new says where the run came
        # from: the outbox sends it after established runs' and budgets it per source
        # (notify/fairness.py). One established alert in it makes it an established one.
        newcomers = tx.newcomers([event.fingerprint for event, _ in items])
        for channel, note in notifications(items, self.notifiers, now):
            sources = {newcomers.get(e.fingerprint) for e in note.events}
            source = sources.pop() if len(sources) == 1 else None
            self.outbox.enqueue(tx.conn, channel, note, now, source=source)

    def _count(self, reason: Reason) -> None:
        self.metrics.decisions.labels(reason=reason.value).inc()


def _identity(rule: Rule, f: Finding) -> dict[str, str]:
    values = {"layer": f.layer, "rank": str(f.rank)}
    return {k: v for k in rule.fingerprint if (v := values.get(k)) is not None}


def _finding_step(alert: StoredAlert) -> int:
    """The step of the alert's latest finding; -1 when it has none, or when its stored
    finding no longer parses: a damaged alert is not taken for one about abandoned steps,
    and does not stop a resume from closing the others (as ``flush`` keeps it to its run)."""
    try:
        step = alert.finding_data().get("step")
    except (ValueError, AttributeError):  # not JSON, or JSON but not an object
        return -1
    return step if isinstance(step, int) else -1


def _since(alert: StoredAlert) -> float:
    # A pending alert always has pending_since (set when its episode began).
    return alert.pending_since if alert.pending_since is not None else alert.started_at
