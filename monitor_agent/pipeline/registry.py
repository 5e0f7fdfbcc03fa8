"""The runs in memory: each live run's state and detector suite, owned as one object.

A run is loaded on its first record (fresh, or rebuilt from its snapshot and stored tail),
dropped when its time-to-live passes (after a snapshot), evicted when its effects could
not be committed (analysed again later), and snapshotted on a timer and by step distance
(``snapshot_advanced``: each ``snapshot_every_steps`` steps it moves, also while it is
rebuilt for a resume, so a resume to any step finds a snapshot near below it). Keeping the state and
the suite in one ``LiveRun`` is what keeps them from drifting apart: there is one dict, and
every way into or out of it is a method here.

Rebuilding a run replays its stored tail through the pipeline, the very path live records
take; the registry does not know that path, it is handed it (``replay``) by the engine.

The engine builds one and hands it the replay path; alone, with a replay that does
nothing::

    >>> settings = Settings(max_active_runs=1)
    >>> registry = RunRegistry(settings, Store(":memory:"), replay=lambda *args: None)
    >>> live = registry.admit("gpt-7", now=100.0)
    >>> live.state.run_id, live.suite is registry.admit("gpt-7", now=101.0).suite
    ('gpt-7', True)
    >>> registry.admit("gpt-8", now=101.0) is None   # max_active_runs reached
    True
    >>> registry.admit("gpt-8", now=100.0 + settings.run_displace_after_seconds).run_id
    'gpt-8'
    >>> registry.get("gpt-7") is None   # silent that long: displaced, to reload when it sends
    True
    >>> registry.expire(now=700.0 + settings.silent_run_ttl_seconds + 1)
    >>> len(registry)
    0
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from monitor_agent.detectors import DetectorSuite
from monitor_agent.pipeline import recovery
from monitor_agent.pipeline.attempts import RunAttempts
from monitor_agent.records import wire
from monitor_agent.runs.goodput import GoodputLedger
from monitor_agent.runs.lifecycle import RunLifecycle
from monitor_agent.runs.run_state import RunState
from monitor_agent.runs.verdict import CAUSES, Rollback, rollbacks_of
from monitor_agent.settings import Settings
from monitor_agent.storage.database import StorageError
from monitor_agent.storage.store import Store

SNAPSHOT_SHARE = 0.05
"""The most of the engine thread the clock's snapshots may take: a run's next one waits
for its last one's duration / this (and at least ``snapshot_interval_seconds``). A run
leader of 16,384 ranks spent seconds on each (its detectors' state of every rank), longer
than the interval on a busy machine: the thread that answers every node's exchange did
nothing else. Later snapshots mean more records replayed on a restart (the price)."""

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LiveRun:
    """A run in memory: what the sidecar knows of it and the detectors judging it."""

    state: RunState
    suite: DetectorSuite
    attempts: RunAttempts
    # Its lifecycle (runs/lifecycle.py): derived on load from the store's status and
    # alerting's open actions (``RecordWalk.replay``), kept on by the engine's events.
    lifecycle: RunLifecycle = field(default_factory=RunLifecycle)
    # The run's latest step when its newest snapshot was taken (-1: none yet): one is taken
    # again once it moved ``snapshot_every_steps`` on (``RunRegistry.snapshot_advanced``).
    snapshot_step: int = -1
    snapshot_at: float = -math.inf  # when, on the engine's clock
    snapshot_seconds: float = 0.0  # how long the last one took (``SNAPSHOT_SHARE``)

    @property
    def run_id(self) -> str:
        return self.state.run_id


Replay = Callable[[LiveRun, int, float, bool], None]
"""``replay(live, after_row_id, now, quiet)``: feed the run's records stored after that row;
``quiet``: only to rebuild state, their findings were handled when first judged."""


class RunRegistry:
    """Owns every live run; engine thread only (the exposition copies ``states()``)."""

    def __init__(self, settings: Settings, store: Store, replay: Replay) -> None:
        self.settings = settings
        self.store = store
        self._replay = replay
        self._runs: dict[str, LiveRun] = {}
        # Runs whose last records were stored but not all of their effects: analysed again.
        self._reanalyse: set[str] = set()
        self.snapshots = 0  # taken since start (the tests count them)

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self) -> Iterator[LiveRun]:
        return iter(list(self._runs.values()))

    def get(self, run_id: str) -> LiveRun | None:
        return self._runs.get(run_id)

    def states(self) -> list[RunState]:
        """Every live run's state; ``list(...)`` is one C-level copy, atomic under the GIL,
        which is what lets the /metrics scrape call this from its own thread."""
        return [live.state for live in list(self._runs.values())]

    # -- in and out of memory -------------------------------------------------------------

    def admit(self, run_id: str, now: float) -> LiveRun | None:
        """The run, loaded if need be; None when ``max_active_runs`` are in memory and
        none of them has been silent long enough to give its place up (``displace``)."""
        live = self._runs.pop(run_id, None)
        if live is not None:
            self._runs[run_id] = live  # the dict's order is admission order: newest last
            return live
        if self.full and not self.displace(now):
            return None
        return self.load(run_id, now)

    def displace(self, now: float) -> bool:
        """Make room for a new run: snapshot and drop the run admitted least recently if it
        has been silent for ``run_displace_after_seconds``; False when none has.

        This is what keeps a full registry from locking new runs out: runs that sent one
        record and went quiet (10,000 of them fit in one small request) hold their places
        only that long, not ``silent_run_ttl_seconds``; to keep new runs out, a client has
        to keep every one of ``max_active_runs`` runs sending, and the lock ends that long
        after it stops. A run silent that long has had its ``stalled`` finding already
        (300 s, or 20 of its step intervals); it loses nothing but memory: its next record
        reloads it from the snapshot."""
        oldest = next(iter(self._runs.values()), None)
        if oldest is None or now - oldest.state.last_arrival < \
                self.settings.run_displace_after_seconds:
            return False
        self.snapshot(oldest)
        del self._runs[oldest.run_id]
        return True

    @property
    def full(self) -> bool:
        return len(self._runs) >= self.settings.max_active_runs

    def load(self, run_id: str, now: float, quiet: bool = False,
             goodput: GoodputLedger | None = None) -> LiveRun:
        """Bring a run into memory: fresh, or rebuilt from its snapshot and stored tail
        (``quiet``: the tail was judged before; see ``Replay``). Its goodput ledger is
        ``goodput`` (a rebuild keeps the one it had) or the one last kept in the store.

        Raises StorageError, or whatever replaying its tail raised (the run stays out of
        memory, marked to be analysed again: a half-replayed run would skip records)."""
        live = self._runs[run_id] = LiveRun(RunState.new(run_id, now),
                                            DetectorSuite(self.settings.detectors),
                                            RunAttempts([], {}))
        try:
            live.attempts = RunAttempts.load(self.store, run_id)
            try:
                after = recovery.restore_run(self.store, live.state, live.suite, now)
            except StorageError:
                raise
            except Exception:
                # A snapshot today's detectors cannot read (an older version's, a damaged
                # blob) must not keep the run, or the whole sidecar at startup, from
                # loading: it is derived state, so judge every stored record again.
                log.exception("run %s: its detector snapshot cannot be restored; analysing "
                              "its stored records again", run_id)
                live = self._runs[run_id] = LiveRun(RunState.new(run_id, now),
                                                    DetectorSuite(self.settings.detectors),
                                                    live.attempts)
                after = recovery.restore_run(self.store, live.state, live.suite, now,
                                             snapshot=False)
            live.snapshot_step = live.state.last_step  # the restored snapshot's (or -1)
            live.state.ledger = recovery.stored_ledger(self.store, run_id)
            live.state.goodput = goodput if goodput is not None else self.stored_goodput(run_id)
            if after is not None:  # None: never stored, a new run
                self._replay(live, after, now, quiet)
        except Exception as exc:
            self.evict(run_id)
            if isinstance(exc, StorageError):
                raise StorageError(f"cannot restore run {run_id}: {exc}") from exc
            raise
        self._reanalyse.discard(run_id)
        return live

    def rollbacks(self, live: LiveRun) -> list[Rollback]:
        """What the run gave up by rolling back or resuming, as its verdict says it
        (verdict.py): each resumed attempt named by its lifecycle as a rollback, a resume
        after a crash or a resume from a checkpoint (runs/lifecycle.py ``resume_kind``)."""
        bodies = self.store.abandoned_findings(live.run_id, tuple(CAUSES))
        ends = self.store.attempt_ends(live.run_id)
        return rollbacks_of(live.attempts.attempts, [wire.loads(b) for b in bodies],
                            lambda a: live.lifecycle.resume_kind(a, ends.get(a.number - 1)))

    def rebuild(self, run_id: str, now: float) -> LiveRun:
        """Load a run again from its current history, after a new attempt replaced part of
        it (pipeline/attempts.py): the state its detectors had just before the attempt's
        start step. The snapshots covering a replaced step went with it (the store keeps
        them spaced by powers of two in steps back from the newest, the newest ones
        ``snapshot_every_steps`` apart), so the newest one left is restored and the kept
        records after it are fed again (every one when none is left: a restart, or a
        resume further back than any snapshot), taking a snapshot each
        ``snapshot_every_steps`` steps as they go (``snapshot_advanced``): so the next
        resume, one step further back say, finds one within about twice that below its
        start and replays no more than that, however often the run walks back (each
        resume replayed the whole history before, O(history) a record). Quiet: those
        records were judged and paged about already (a resolved alert must not page
        again). The verdict is judged on what is left, and names what was given up
        (verdict.py ``rollbacks_of``)."""
        old = self._runs.pop(run_id, None)
        # The ledger keeps what the rebuilt history forgets: the work it discarded.
        live = self.load(run_id, now, quiet=True,
                         goodput=old.state.goodput if old is not None else None)
        if old is not None:  # a rank dead without a word is its machine's, not the history's
            live.state.nodes.dead = {**live.state.nodes.dead, **old.state.nodes.dead}
        return live

    def stored_goodput(self, run_id: str) -> GoodputLedger:
        """The run's goodput ledger as last kept; a new one when there is none, or when it
        cannot be read (derived state: the stored records it had not seen feed it). What a
        run out of memory answers (``RunQueries.goodput``, the runs lists)."""
        blob = self.store.goodput(run_id)
        if blob is None:
            return GoodputLedger()
        try:
            return GoodputLedger.from_state(wire.loads(blob))
        except Exception:
            log.exception("run %s: its goodput ledger cannot be restored; starting anew",
                          run_id)
            return GoodputLedger()

    def evict(self, run_id: str) -> None:
        """Forget a run's in-memory state (no snapshot): its stored tail is replayed when
        it is next loaded, by its next record, the tick or a restart."""
        self._runs.pop(run_id, None)
        self._reanalyse.add(run_id)

    @contextlib.contextmanager
    def evicted_on_failure(self, run_ids: Iterable[str], what: str) -> Iterator[None]:
        """Judging these runs' records: when it fails, the runs leave memory (kept, they
        would count the records as judged and a retry as a duplicate: the page would be
        lost; evicted, they are judged again from the store), and a storage failure is
        raised saying ``what`` was not stored."""
        try:
            yield
        except Exception as exc:
            for run_id in run_ids:
                self.evict(run_id)
            if isinstance(exc, StorageError):
                raise StorageError(f"{what}: {exc}") from exc
            raise

    def reload_evicted(self, now: float) -> None:
        """Analyse again the runs whose effects could not be committed, once storage works;
        a failure leaves the rest of the tick (stalls, resolves, snapshots) to run."""
        for run_id in list(self._reanalyse):
            if run_id in self._runs or self.full:
                continue
            try:
                self.load(run_id, now)
            except StorageError:
                return  # still failing; readiness says so; next tick again
            except Exception:  # a bug must not block every tick: the record stays stored
                log.exception("cannot analyse run %s again; it reloads on its next record",
                              run_id)
                self._reanalyse.discard(run_id)
                self._runs.pop(run_id, None)

    def recover(self, now: float) -> int:
        """Reload the runs that were active before a restart; return how many."""
        count = 0
        for row in self.store.runs():
            if now - row.last_seen < self.ttl(row.status) and not self.full:
                self.load(row.run_id, now)
                count += 1
        return count

    def expire(self, now: float) -> None:
        """Snapshot and drop the runs silent for longer than their time-to-live."""
        for live in list(self._runs.values()):
            if now - live.state.last_arrival > self.ttl(live.state.status):
                self.snapshot(live)
                del self._runs[live.run_id]

    def ttl(self, status: str) -> float:
        if status == "running":
            return self.settings.silent_run_ttl_seconds
        return self.settings.ended_run_ttl_seconds

    # -- snapshots ------------------------------------------------------------------------

    def snapshot_all(self, now: float | None = None) -> None:
        """Snapshot every run with records its last snapshot does not cover, unless one was
        taken in the ``snapshot_interval_seconds`` before ``now`` (by step distance: a run
        moving fast is not snapshotted twice as often), or in its last one's duration /
        ``SNAPSHOT_SHARE`` when that is longer (a run of thousands of ranks)."""
        interval = self.settings.snapshot_interval_seconds
        for live in list(self._runs.values()):
            wait = max(interval, live.snapshot_seconds / SNAPSHOT_SHARE)
            if (live.state.last_record_id > live.state.snapshot_record_id
                    and (now is None or live.snapshot_at <= now - wait)):
                self.snapshot(live, now)

    def snapshot_advanced(self, live: LiveRun | None, now: float | None = None) -> None:
        """Snapshot the run if its latest step moved ``snapshot_every_steps`` since its last
        snapshot (O(1) when not: the engine asks after each batch, and a rebuild after each
        record it replays). Only once the records it covers have had their effects made
        durable: a run evicted on a failed commit is analysed again from its snapshot. A
        snapshot that cannot be written is left to the next one (derived state)."""
        if live is None:
            return
        run = live.state
        if (run.last_step - live.snapshot_step < self.settings.snapshot_every_steps
                or run.last_record_id <= run.snapshot_record_id):
            return
        try:
            self.snapshot(live, now)
        except StorageError as exc:
            log.warning("run %s: snapshot not stored: %s", live.run_id, exc)

    def snapshot(self, live: LiveRun, now: float | None = None) -> None:
        """Keep the run's detector state and goodput ledger in the store (``now``: when,
        on the engine's clock; None: not counted as recent by ``snapshot_all``)."""
        run = live.state
        began = time.perf_counter()
        state = recovery.snapshot_run(run, live.suite)
        top = max((max(r.last_step, r.last_eval_step) for r in run.ranks.values()), default=-1)
        self.store.save_detector_state(run.run_id, run.last_record_id,
                                       wire.dumps_prepared(state), top)
        self.store.save_goodput(run.run_id, run.goodput.last_row,
                                wire.dumps(run.goodput.to_state()))
        run.snapshot_record_id = run.last_record_id
        live.snapshot_step = run.last_step
        live.snapshot_at = now if now is not None else -math.inf
        live.snapshot_seconds = time.perf_counter() - began
        self.snapshots += 1
