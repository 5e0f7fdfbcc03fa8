"""``Alerting``: findings in, alerts out; the one object the engine and the API talk to.

``handle`` (engine thread, per record) matches rules, merges findings into alerts by
fingerprint and stores them as pending: a few SQLite statements, no network. A flusher
thread turns pending alerts into firing ones ``group_wait_seconds`` later, all alerts of a
run in one message; ``tick`` resolves, repeats and re-sends. Every message goes through the
durable outbox in the same transaction as the state change that caused it.

``Alerting`` is a facade over its parts: ``AlertStore`` (all alert, silence and action
state), ``Episodes`` (the state machine), the ``Outbox`` and the notifiers. It satisfies
``AlertSink``, the engine's one seam to alerting.

The app calls ``start()`` (one sender thread per channel and the flusher) and, at
shutdown, ``stop(timeout=5)``. Not started, with a fixed clock, a page is queued, owned
and then silenced::

    >>> from prometheus_client import CollectorRegistry
    >>> from monitor_agent.records.types import Severity
    >>> alerting = Alerting(AlertingSettings(), ":memory:", CollectorRegistry(),
    ...                     clock=lambda: 1002.0)
    >>> nan = Finding("nan_inf", Severity.CRITICAL, "gpt-7", step=300, message="loss is NaN")
    >>> alerting.handle(RunContext("gpt-7"), [nan], now=1000.0), alerting.flush(now=1001.0)
    ([], None)
    >>> [alert] = alerting.list_alerts(state="firing")
    >>> alerting.acknowledge(alert.fingerprint, by="ana").acked_by   # no more reminders
    'ana'
    >>> _ = alerting.add_silence(duration=3600, run_id="gpt-7", comment="known bad shard")
    >>> [(a.alertname, a.state, a.silenced) for a in alerting.list_alerts(run_id="gpt-7")]
    [('TrainingNanInf', 'firing', True)]
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from monitor_agent.alerting.alert_store import AlertStore
from monitor_agent.alerting.alerts import AlertView, RunContext, StoredAlert
from monitor_agent.alerting.db import open_alert_db
from monitor_agent.alerting.episodes import Costs, Episodes
from monitor_agent.alerting.rules import Rule, load_rules
from monitor_agent.alerting.settings import AlertingSettings
from monitor_agent.alerting.silences import Silence, silenced_by
from monitor_agent.metrics.alerting import AlertingMetrics
from monitor_agent.notify.channels import (
    ALL_CHANNELS,
    build_notifiers,
    channel_secrets,
    describe_channels,
)
from monitor_agent.notify.outbox import Outbox
from monitor_agent.notify.redact import SecretRedactor
from monitor_agent.records.actions import RESTART_ACTIONS, Action
from monitor_agent.records.types import Finding

log = logging.getLogger(__name__)
PRUNE_EVERY_S, KEEP_DONE_S = 600.0, 86400.0


class Alerting:
    """Rules, lifecycle, silences and delivery, with state in its own SQLite database."""

    def __init__(
        self,
        settings: AlertingSettings,
        db_path: Path | str,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
        http_transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.rules: list[Rule] = load_rules(settings.rules_file)
        self.notifiers = build_notifiers(settings)
        self.clock = clock
        self.metrics = AlertingMetrics(registry, ALL_CHANNELS)
        self.db = open_alert_db(db_path)
        self.store = AlertStore(self.db)
        # Stored errors are redacted here; log lines by the factory the app installs.
        self.redactor = SecretRedactor(self.secrets())
        self.outbox = Outbox(self.db, self.notifiers, settings.outbox, self.metrics, clock,
                             http_transport, redact=self.redactor.redact)
        self.episodes = Episodes(settings, self.rules, self.store, self.outbox, self.notifiers,
                                 self.metrics)
        self._flush_now = threading.Event()
        self._stopping = threading.Event()
        self._flusher: threading.Thread | None = None
        self._flush_failure: str | None = None
        self._last_prune = 0.0

    def secrets(self) -> list[str]:
        """Every secret of the channels (URLs and keys), for redaction."""
        return channel_secrets(self.settings)

    # -- lifecycle of the service ---------------------------------------------------------

    def start(self) -> None:
        """Start delivery (one thread per channel) and the group flusher."""
        self._stopping.clear()
        line = describe_channels(self.settings, self.notifiers)
        # Louder when alerts would only reach this log (or nowhere): that is worth seeing.
        log.log(logging.INFO if "fallback" not in line and self.notifiers else logging.WARNING,
                "%s", line)
        # The app installs one for all its secrets; this covers Alerting used on its own.
        self.redactor.install()
        self.outbox.start()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True, name="alert-flush")
        self._flusher.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads; undelivered notifications stay in the outbox for next time."""
        self._stopping.set()
        self._flush_now.set()
        if self._flusher is not None:
            self._flusher.join(timeout)
        self.outbox.stop(timeout)
        self.redactor.uninstall()

    def problem(self) -> str | None:
        """Why alerts cannot go out now (a thread stopped, the flush failing), or None;
        /readyz reports it."""
        if self._flusher is not None and not self._flusher.is_alive() \
                and not self._stopping.is_set():
            return "alerting: the flusher thread stopped; the sidecar's log has why"
        if self._flush_failure is not None:
            return f"alerting: flushing alerts fails ({self._flush_failure}); retrying"
        return self.outbox.problem()

    def _flush_loop(self) -> None:
        while not self._stopping.is_set():
            self._flush_now.clear()
            try:
                wait = self.flush(self.clock())
                self._flush_failure = None
            except Exception as exc:
                log.exception("alert flush failed")
                self._flush_failure = f"{type(exc).__name__}: {str(exc)[:200]}"
                wait = 1.0
            self._flush_now.wait(1.0 if wait is None else min(max(wait, 0.001), 1.0))

    # -- the engine's side (AlertSink) ----------------------------------------------------

    def handle(self, run: RunContext, findings: list[Finding], now: float,
               told: bool = False, closed: bool = False) -> list[Action]:
        """Turn one record's findings into alert state; fast, no network.

        Returns the actions rules took (stop, checkpoint, rollback, ...), for the ingest answer.
        ``told``: findings people were paged about already (``AlertSink.handle``).
        """
        started, taken = self.episodes.handle(run, findings, now, told, closed)
        if started:
            self._flush_now.set()
        return taken

    def waiting(self, run_id: str) -> bool:
        """Whether a rollback of the run waits for a checkpoint rank (``retry``)."""
        return run_id in self.episodes.deferred

    def retry(self, run: RunContext, now: float) -> list[Action]:
        """Decide a rollback that waited for the ranks that report checkpoints to reach
        the fault's onset (alerting/rollback.py ``behind``), once they did or the wait is
        over; the actions taken, as ``handle`` returns them."""
        return self.episodes.retry(run, now)

    def revise(self, run: RunContext, now: float) -> list[Action]:
        """A pending rollback whose checkpoint turned suspect, decided again."""
        return self.episodes.revise(run, now)

    def refused(self, run: RunContext, action_id: int, now: float) -> list[Action]:
        """A pending rollback the job refused to load, withdrawn for a stop."""
        return self.episodes.refused(run, action_id, now)

    def preview(self, run: RunContext, findings: list[Finding], now: float) -> int:
        """Begin alerts for the findings of a record sent ahead of its turn (a NaN step
        ahead of a backlog, see ``Engine.preview`` in pipeline/engine.py); return how many began.

        Such an episode begins with ``count`` 0: no finding of it is counted yet. The
        record's in-order copy brings the same finding (same run, rule, rank: the same
        fingerprint) through ``handle`` later, which folds it in as the episode's first
        finding, so the page is not sent twice and ``action_after`` counts as it would
        have. An alert already pending or firing is left as it is; nothing here acts.
        """
        begun = self.episodes.preview(run, findings, now)
        if begun:
            self._flush_now.set()
        return begun

    def flush(self, now: float) -> float | None:
        """Fire the runs whose group wait is over; return seconds until the next is due."""
        return self.episodes.flush(now)

    def tick(self, now: float) -> None:
        """Resolve, repeat, send what a silence or cooldown held back, re-send to Alertmanager."""
        self.episodes.tick(now)
        if now - self._last_prune >= PRUNE_EVERY_S:
            self.outbox.prune(now - KEEP_DONE_S)
            self._last_prune = now

    def cost_with(self, costs: Costs) -> None:
        """Resolving pages say what their incident cost (runs/goodput.py, the engine's)."""
        self.episodes.costs = costs

    def attempt_settled(self, run_id: str, start_step: int, now: float,
                        started: float | None = None) -> None:
        """An attempt of the run resumed at ``start_step``: a pending rollback is
        applied, and a restart decided before it began (``started``) carried out."""
        self.episodes.attempt_settled(run_id, start_step, now, started)

    def relaunched(self, run_id: str, said: str, start_step: int, now: float) -> bool:
        """The job's launcher ran it again after a crash: its ``crashed`` alerts resolve
        saying so (alerting/episodes.py ``relaunched``)."""
        return self.episodes.relaunched(run_id, said, start_step, now)

    def run_ended(self, run_id: str, status: str, now: float, step: int | None = None,
                  verdict: str | None = None) -> None:
        """A completed run resolves its alerts now; a failed one keeps them until clear.

        A ``stopped`` run at ``step`` honoured its stop requests there: the alerts that
        asked for it say so, and whoever was paged hears it (see alerting/rule_actions.py).
        The resolve message says the run ended ``verdict`` ("run ended unhealthy: NaN
        since step 300"): the alert closes with the run, not because the problem cleared.
        """
        self.episodes.run_ended(run_id, status, now, step, verdict)

    # -- the API's side -------------------------------------------------------------------

    def list_alerts(self, state: str | None = None, run_id: str | None = None,
                    limit: int = 1000, before: tuple[float, str] | None = None,
                    ) -> list[AlertView]:
        """Newest first; ``state`` silenced means firing or pending under a silence;
        ``before``: the alerts after this ``(started_at, fingerprint)`` (a page's end)."""
        if state != "silenced":
            return self._views(self.store.alerts(state, run_id, limit, before=before))
        out: list[AlertView] = []
        while len(out) < limit:  # read on until enough are silenced, or none are left
            found = self.store.alerts(state, run_id, limit, unresolved=True, before=before)
            out += [v for v in self._views(found) if v.silenced]
            if len(found) < limit:
                break
            before = (found[-1].started_at, found[-1].fingerprint)
        return out[:limit]

    def active_alerts(self) -> list[AlertView]:
        """Pending and firing alerts (silenced ones included: they still fire)."""
        return self._views(self.store.active())

    def alerts_for_run(self, run_id: str) -> list[AlertView]:
        return self.list_alerts(run_id=run_id)

    def _views(self, alerts: list[StoredAlert]) -> list[AlertView]:
        active = self.silences()
        routes = {r.name: r.route for r in self.rules}
        return [AlertView.of(a, silenced_by(active, a), routes.get(a.rule)) for a in alerts]

    def acknowledge(self, fingerprint: str, by: str) -> AlertView | None:
        """Someone owns it: no more reminders; channels that know acks (PagerDuty) hear it."""
        alert = self.episodes.acknowledge(fingerprint, by, self.clock())
        return None if alert is None else AlertView.of(alert, silenced_by(self.silences(), alert))

    def add_silence(self, *, duration: float, comment: str = "", created_by: str = "",
                    **matchers: str | None) -> Silence:
        """Raises ValueError (with the fix) for a silence without matchers or duration."""
        silence = Silence.new(duration=duration, now=self.clock(), comment=comment,
                              created_by=created_by, **matchers)
        self.store.add_silence(silence)
        return silence

    def silences(self, include_expired: bool = False) -> list[Silence]:
        found, now = self.store.silences(), self.clock()
        return found if include_expired else [s for s in found if s.active(now)]

    def silences_page(self, include_expired: bool, before: tuple[float, str] | None,
                      limit: int) -> list[Silence]:
        """A page of silences, newest first (``AlertStore.silences_page``)."""
        return self.store.silences_page(None if include_expired else self.clock(), before,
                                        limit)

    def expire_silence(self, silence_id: str) -> bool:
        """End a silence now; False if there is no such active silence."""
        return self.store.expire_silence(silence_id, self.clock())

    def hand_over(self, run_id: str, now: float) -> int:
        """The run's leader has what this node sidecar paged while it was away: its
        partial-view alerts here close quietly (``Episodes.hand_over``)."""
        return self.episodes.hand_over(run_id, now)

    def adopt_actions(self, run_id: str, actions: list[Action], leader: str) -> list[Action]:
        """Keep the actions the run's leader decided, for this node sidecar's ranks
        (monitor_agent/cluster); returns those new here."""
        return self.store.adopt(run_id, actions, leader)

    def actions_for_run(self, run_id: str, after: int = 0, limit: int = 100) -> list[Action]:
        """Actions rules took for a run, ``id > after``, oldest first (the poll endpoint)."""
        return self.store.actions_for_run(run_id, after, limit)

    def no_actions_after(self, run_id: str, after: int) -> bool:
        """Known without a query that ``actions_for_run(run_id, after)`` is empty (it was,
        and no action was added since); a cheap check for the event loop."""
        return self.store.no_actions_after(run_id, after)

    def took_action(self, run_id: str, action_id: int, action: str) -> bool:
        """Whether the run has an action ``action_id`` of kind ``action`` (``AlertSink``)."""
        if self.store.no_actions_after(run_id, action_id - 1):
            return False
        found = self.store.actions_for_run(run_id, action_id - 1, 1)
        return bool(found) and found[0].id == action_id and found[0].action == action

    def open_actions(self, run_id: str) -> list[Action]:
        """The run's rollbacks (pending and applied) and stops not yet honoured, oldest
        first (``AlertSink``)."""
        return [a for a in self.store.actions_for_run(run_id, 0, 1000)
                if (a.action in ("rollback", *RESTART_ACTIONS) and a.withdrawn_by is None)
                or (a.action == "stop" and a.honoured_step is None)]

    def stop_requested(self, run_id: str) -> bool:
        return self.store.stop_requested(run_id)

    def action_counts(self) -> dict[tuple[str, str, str], int]:
        """(run_id, action, rule) -> times taken; the exposition renders these."""
        return self.store.action_counts()

    def delivery_states(self) -> dict[str, dict[str, dict[str, object]]]:
        """fingerprint -> channel -> how its latest notification went (GET /v1/alerts)."""
        return self.outbox.delivery_states()

    def check_writable(self) -> None:
        """Raise StorageError unless alert state can be made durable now (readiness)."""
        self.db.check_writable()

