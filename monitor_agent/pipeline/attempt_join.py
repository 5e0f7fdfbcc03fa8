"""Which attempt of its run a record joins (pipeline/attempts.py keeps the book): a new
token is placed and stored at once, so a retry finds it; a pending attempt settles on its
first step or eval, and one that replaced history reloads the run from what is left of it
(``RunRegistry.rebuild``) and tells the run's lifecycle. A relaunch after a crash is paged
(detectors/relaunched.py), and a second job writing the run id too (detectors/two_jobs.py)."""

from __future__ import annotations

import logging

from monitor_agent.alerting.sink import AlertSink
from monitor_agent.detectors import relaunched, two_jobs
from monitor_agent.pipeline import run_views as views
from monitor_agent.pipeline.attempts import AttemptWaits, holds_history
from monitor_agent.pipeline.batch import Admitted, Incoming, IngestResult, attempt_view
from monitor_agent.pipeline.batch_end import BatchEnd
from monitor_agent.pipeline.consequences import Consequences
from monitor_agent.pipeline.failpoints import Failpoints
from monitor_agent.pipeline.placement import Placement
from monitor_agent.pipeline.registry import LiveRun, RunRegistry
from monitor_agent.pipeline.routing import Router
from monitor_agent.records.types import Record
from monitor_agent.runs import attempt_end
from monitor_agent.runs.attempt_end import AttemptEnd
from monitor_agent.runs.lifecycle import Restarted, RolledBack
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store, StoredAttempt

log = logging.getLogger(__name__)

MAX_HELD = 64  # new attempts held back and paged as a second job, remembered at once


class AttemptJoin:
    """Places each admitted record in an attempt of its run, and what a new one causes."""

    def __init__(self, settings: Settings, store: Store, alerts: AlertSink,
                 registry: RunRegistry, failpoints: Failpoints, placement: Placement,
                 consequences: Consequences, router: Router, batch_end: BatchEnd) -> None:
        self.settings = settings
        self.store = store
        self.alerts = alerts
        self.registry = registry
        self.failpoints = failpoints
        self.placement = placement
        self.consequences = consequences
        self.router = router
        self.batch_end = batch_end
        # (run id, attempt) of new attempts held back and already paged as a second job
        # (``_held_back``): each is paged once.
        self._paged_two_jobs: dict[tuple[str, int], None] = {}

    def join(self, live: LiveRun, item: Incoming, result: IngestResult,
                 now: float) -> Admitted | str:
        """The attempt ``item`` belongs to (pipeline/attempts.py), or why it may not begin
        one: a new token is placed (stored at once, so a retry finds it), and a pending
        attempt settles on its first step or eval; one that replaced history reloads the
        run from what is left of it."""
        record = item.record
        # A digest settles as it settled on its node's sidecar, which held its own ranks
        # to the rule (pipeline/attempts.py ``holds_history``).
        held = self._holds_history(live, now) if item.origin is None else None
        try:
            placed = live.attempts.place_record(self.store, record, now,
                                                self.settings.max_attempts_per_run, held,
                                                item.origin is None and views.moved(live, record))
        except AttemptWaits as exc:
            self._held_back(live, record, exc.attempt, now)
            raise
        if isinstance(placed, str):
            return placed
        token, number, settled = placed
        book = live.attempts
        live.state.attempt = max(book.current, 1)
        live.state.relaunching = book.get(book.current).kind == "pending"
        if settled is not None and settled.kind != "first":
            log.info("run %s: attempt %d %s from step %d", record.run_id, number,
                     settled.kind, record.step)
            before = live.state
            launcher = before.run.launcher if before.run is not None else None
            crashed = (before.status in ("running", "failed") and not before.hung_ranks
                       and launcher is not None and launcher.restarts,
                       before.last_step, now - before.last_arrival,
                       before.status == "failed")  # it said so: its crash was paged
            ended = self._how_ended(live, number) if crashed[0] else None
            live = self.registry.rebuild(record.run_id, now)
            live.suite.ctx.attempt_began = record.time  # its ranks start now (hang.py)
            # The ledger begins the attempt at the record that settles it, which it is fed
            # only later: the pages the settle closes say what the restart cost.
            if record.time is not None:
                live.state.goodput.begin(number, record.time)
            book = live.attempts
            self.failpoints.reached("attempt_settled")
            events = live.lifecycle.settled(settled)
            self.consequences.events(live, events, now)
            self.failpoints.reached("rollback_applied")
            result.resumed = True
            if crashed[0] and not any(isinstance(e, RolledBack | Restarted) for e in events):
                self._relaunched(live, settled, crashed[1], crashed[2], crashed[3], now,
                                 result, ended)
        key, view = (record.run_id, token), result.attempts.get((record.run_id, token))
        if view is None or view["number"] != number or view["kind"] == "pending":
            result.attempts[key] = attempt_view(record.run_id, book.get(number))
        return Admitted(item, number,
                         book.superseded_by(number, record.kind, record.step))

    def _how_ended(self, live: LiveRun, number: int) -> AttemptEnd | None:
        """How the attempt that attempt ``number`` replaces ended, rank by rank, and which
        of its ranks died without a word (runs/attempt_end.py), from the end records
        stored for it: read before the rebuild, while the run still knows its ranks'
        nodes and their addresses."""
        book = live.attempts
        ended = max((a.number for a in book.attempts if a.number < number
                     and a.kind != "pending"), default=None)
        if ended is None:
            return None
        run = live.state
        ranks = {r for n, r in book.stepped if n == ended}
        return attempt_end.judge(ended, ranks, self.store.rank_ends(run.run_id, ended),
                                 run.hosts(), views.addresses(run))

    def _relaunched(self, live: LiveRun, attempt: StoredAttempt, last_step: int, gap: float,
                    said_crash: bool, now: float, result: IngestResult,
                    ended: AttemptEnd | None = None) -> None:
        """Page that the job's launcher relaunched it after a crash (an attempt with no end
        record, or a failed one, no hang open, and a launcher its ranks said runs them
        again: detectors/relaunched.py), where the run is judged (a node sidecar leaves it
        to the leader, which sees the attempt too). A crash its ranks reported
        (``said_crash``: a failed end, paged ``crashed``) is the same incident: its alert
        resolves saying it was relaunched, one page, not two. Either says how the ended
        attempt's ranks ended (``ended``): the rank that died without a word, and its node's
        verdict (runs/node_verdict.py, ``gone``), not the peers that lost it."""
        if relaunched.RelaunchedDetector.type in self.settings.detectors.disabled or \
                self.placement.following(live.state) is not None:
            return
        found = relaunched.finding(live.run_id, attempt.number, attempt.start_step or 0,
                                   last_step if last_step >= 0 else None, gap,
                                   said_crash=said_crash,
                                   ended=ended.words() if ended is not None else "",
                                   evidence=ended.evidence() if ended is not None else None)
        # Named here, for the resolve of a crash page too; routing it names it no more.
        found = views.name_nodes(live.state, [found])[0]
        if said_crash and self.alerts.relaunched(live.run_id, found.message,
                                                 attempt.start_step or 0, now):
            return
        self.router.route(live.state, [found], now, result)

    def _holds_history(self, live: LiveRun, now: float) -> str | None:
        """Why the run's current attempt may not be replaced now (``holds_history``)."""
        run = live.state
        return holds_history(run.run_id, live.attempts.owner,
                             live.lifecycle.expects_new_attempt, now - run.last_arrival,
                             views.step_interval(run), self.settings.attempt_quiet_seconds)

    def _held_back(self, live: LiveRun, record: Record, attempt: int, now: float) -> None:
        """A new attempt still refused once it has waited as long as a job stops in: two
        jobs write the run id. Paged once (``two_jobs``); the one that was there keeps
        the history, and the other's records are refused until it stops."""
        began = live.attempts.get(attempt).started_at
        key = (record.run_id, attempt)
        if now - began < self.settings.attempt_quiet_seconds or key in self._paged_two_jobs or \
                two_jobs.TwoJobsDetector.type in self.settings.detectors.disabled:
            return
        if len(self._paged_two_jobs) >= MAX_HELD:
            self._paged_two_jobs.pop(next(iter(self._paged_two_jobs)))
        self._paged_two_jobs[key] = None
        result = IngestResult()
        finding = two_jobs.held(record, live.attempts.owner, attempt, now - began)
        self.router.route(live.state, [finding], now, result)
        self.batch_end.finish(result)
