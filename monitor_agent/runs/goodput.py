"""Where a run's time went: a goodput ledger, kept from the records the client already sends.

Wall-clock time from the run's first record to its latest (its end, or now while a hang is
open; an attempt whose clock overlaps the one it replaced counts its own time) is split
into **productive** training, the steps kept in the run's current history, and **badput**
by cause (``CAUSES``). The buckets add up to the wall-clock time, per run and per attempt;
GPU-seconds are those times the run's world size (``gpus``).

The timeline is one rank's (the lowest the first attempt heard, rank 0 in practice: under
DDP every rank steps together, so one rank's clock is the job's). Each interval between two
of its records is charged once:

- ``startup``: from an attempt's first record (its run record: the process is up) to its
  first step, less one typical step (the median interval of the attempt's next
  ``TYPICAL_STEPS`` steps, charged to the first step once they are in): process launch,
  model build, compile, loader spin-up.
- ``eval`` / ``checkpoint``: the ``seconds`` an eval or checkpoint record says it took
  (the client measures the time since its previous step, eval or checkpoint record: the
  evaluation or the save that ran in between), taken out of the next step's interval.
  A checkpoint counts once per step, whichever rank saved it.
- ``input``: a step's ``data_time`` beyond the loader's healthy floor, the 10th percentile
  of its last ``FLOOR_WINDOW`` data times: the time a ready batch takes to hand over,
  which every step pays; what a step waited beyond it the loader made it wait.
- ``hang_undetected`` / ``hang_detected``: a ``hang`` record (any rank's watchdog) for the
  last completed step: from where that step's successor should have ended (one typical
  step after it) to the watchdog's report, then from the report to the recovery (the next
  step), the attempt's end, or the next attempt's start (a hung process killed and
  relaunched: the hang lasted until the job ran again).
- ``restart``: from the last record of an attempt to the first of the next (no hang open).
- ``rollback`` / ``resume``: the productive time of steps a new attempt replaced (it
  resumed at step S: every kept step from S on is work done twice), moved out of
  productive: ``rollback`` when the attempt applied a rollback plan, ``resume`` for a
  resume after a crash or a restart.
- ``skipped`` / ``loss_scale``: the interval of a step the client's step guard skipped, or
  the GradScaler skipped on an overflow: its batch never reached the weights.
- ``straggler``: under data parallelism every rank waits at the gradient all-reduce for the
  slowest; a rank's ``sync_wait_time`` summed over an attempt is what it waited. The tax is
  the median rank's total wait less the least-waiting rank's (the slowest one, which only
  pays the collective itself): what the job's steps would be shorter at the median rank's
  pace. Charged out of productive time. Summed waits, not per-step ones: the slowest rank
  of a single step is noise and averages out; a rank that is slow step after step is not.
- ``unaccounted``: wall-clock time no record explains (the time after the timeline rank's
  last record that other ranks' records cover, or a clock that went backwards).

Incidents carry their cost (``Incident``): a hang, a restart or resume (its gap, start-up
and the work it re-did), a rollback (the discarded work, its gap and start-up), each in
seconds and GPU-hours; the page that resolves one says it, as does the run's verdict.

The ledger sees each stored record once, in arrival order (``feed``'s row id), including
those of older attempts a newer one superseded; it is kept in its own table and restored
with the run (``to_state`` / ``from_state``), then fed every record stored after its kept
position, superseded ones too (the engine's ``_catch_up_goodput``), and carried over when a
new attempt rebuilds the run's detectors, so it keeps what the rebuilt history forgets. An
attempt settled after its records were fed again (a restart between the two) comes to the
account of one settled before its first record (``settled``).

A run up 2 s before its first step, whose loader made step 6 wait 1 s, and which saved a
checkpoint for 2 s after step 8 (steps take 1 s)::

    >>> from monitor_agent.records.types import CheckpointRecord, RunRecord, StepRecord
    >>> book, t = GoodputLedger(), 100.0
    >>> book.feed(RunRecord("r", time=t), attempt=1, row_id=1)
    >>> for step in range(1, 13):
    ...     wait = 1.0 if step == 6 else 0.0
    ...     t += 1.0 + wait + (1.0 if step == 1 else 0.0) + (2.0 if step == 9 else 0.0)
    ...     book.feed(StepRecord("r", step, time=t, data_time=0.01 + wait), 1, 2 * step)
    ...     if step == 8:
    ...         book.feed(CheckpointRecord("r", 8, time=t + 2.0, path="/c/8", seconds=2.0),
    ...                   1, 2 * step + 1)
    >>> r = book.report()
    >>> r.wall, r.productive, {k: v for k, v in r.badput.items() if v}
    (16.0, 12.0, {'startup': 1.0, 'input': 1.0, 'checkpoint': 2.0})
    >>> r.summary()
    'goodput 75.0%: 12.5% checkpoints, 6.2% start-up, 6.2% input'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from monitor_agent.records.types import (
    CheckpointRecord,
    EndRecord,
    EvalRecord,
    HangRecord,
    Record,
    RunRecord,
    StepRecord,
)

CAUSES: tuple[str, ...] = (
    "startup", "input", "checkpoint", "eval", "hang_undetected", "hang_detected",
    "restart", "rollback", "resume", "skipped", "loss_scale", "straggler", "unaccounted",
)
"""Badput causes, in the order people read them (docs/goodput.md)."""

CAUSE_WORDS: dict[str, str] = {
    "startup": "start-up", "input": "input", "checkpoint": "checkpoints", "eval": "eval",
    "hang_undetected": "hang before detection", "hang_detected": "hang after detection",
    "restart": "restarts", "rollback": "rollback", "resume": "resumed work",
    "skipped": "skipped steps", "loss_scale": "loss-scale skips", "straggler": "straggler",
    "unaccounted": "unaccounted",
}

TYPICAL_STEPS = 8  # steps whose median interval is a typical step (start-up, hangs)
FLOOR_WINDOW = 256  # data times the loader's healthy floor is the 10th percentile of
FLOOR_EVERY = 16  # steps between updates of that floor (a percentile per step is waste)
MARKS_KEPT = 1024  # recent steps (at least) whose cumulative productive time is kept
MAX_INCIDENTS = 200  # the newest kept (a run that restarts forever must not grow memory)


@dataclass(slots=True)
class Incident:
    """One event that cost the run time: a hang, a restart or resume, a rollback."""

    kind: str  # hang | restart | resume | rollback
    step: int  # the last step before it (hang), or the step the new attempt resumed at
    start: float  # Unix time it began
    seconds: float = 0.0
    attempt: int = 1
    open: bool = False  # still going (a hang not recovered yet)
    detail: dict[str, float] = field(default_factory=dict)  # seconds by part

    def gpu_hours(self, gpus: int) -> float:
        return self.seconds * gpus / 3600.0

    def words(self, gpus: int) -> str:
        """"this hang cost 14 min x 64 GPUs = 15 GPU-hours" ("has cost ... so far" while
        it is open)."""
        if self.open:
            return f"this {self.kind} has cost {cost_words(self.seconds, gpus)} so far"
        return f"this {self.kind} cost {cost_words(self.seconds, gpus)}"

    def to_dict(self, gpus: int) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "start": self.start,
                "seconds": self.seconds, "gpu_hours": self.gpu_hours(gpus),
                "attempt": self.attempt, "open": self.open, "detail": dict(self.detail),
                "words": self.words(gpus)}


def cost_words(seconds: float, gpus: int) -> str:
    """14 min x 64 GPUs = 15 GPU-hours (1 GPU: just the time)."""
    span = _duration(seconds)
    if gpus <= 1:
        return span
    return f"{span} x {gpus} GPUs = {_hours(seconds * gpus / 3600.0)} GPU-hours"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _hours(h: float) -> str:
    return f"{h:.0f}" if h >= 10 else f"{h:.2g}"


@dataclass(slots=True)
class Buckets:
    """Seconds by cause, and productive, of a run or one attempt."""

    productive: float = 0.0
    badput: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))

    def add(self, cause: str, seconds: float) -> None:
        if seconds > 0:
            self.badput[cause] += seconds


@dataclass(slots=True)
class _Attempt:
    number: int
    start: float  # its first record's time
    last: float  # its latest record's time (any rank); hung until relaunched: the relaunch
    buckets: Buckets = field(default_factory=Buckets)
    prev: float | None = None  # the timeline rank's latest step (or the start), for intervals
    steps: int = 0
    first_interval: float | None = None  # charged to start-up until a typical step is known
    intervals: list[float] = field(default_factory=list)  # the first TYPICAL_STEPS after it
    typical: float | None = None
    excluded: float = 0.0  # eval/checkpoint seconds since the timeline's latest step
    waits: dict[int, float] = field(default_factory=dict)  # rank -> summed sync wait
    ended: bool = False


@dataclass(slots=True)
class _Hang:
    step: int
    since: float  # when the step after ``step`` should have ended
    reported: float  # the watchdog's report
    attempt: int


@dataclass(frozen=True, slots=True)
class GoodputReport:
    """The ledger as of a moment: what ``GET /v1/runs/{id}/goodput`` and the page show."""

    start: float | None
    end: float | None
    wall: float
    productive: float
    badput: dict[str, float]
    gpus: int
    attempts: list[dict[str, Any]]
    incidents: list[dict[str, Any]]
    rows_seen: int = 0  # the ledger's last record row it covers

    @property
    def ratio(self) -> float | None:
        return self.productive / self.wall if self.wall > 0 else None

    def summary(self, top: int = 3) -> str:
        """"goodput 93.1%: 4.2% restarts, 1.9% rollback, 0.8% input"."""
        ratio = self.ratio
        if ratio is None:
            return "goodput not measured yet"
        worst = sorted(((v, k) for k, v in self.badput.items() if v / self.wall >= 0.0005),
                       reverse=True)[:top]
        parts = ", ".join(f"{v / self.wall:.1%} {CAUSE_WORDS[k]}" for v, k in worst)
        return f"goodput {ratio:.1%}" + (f": {parts}" if parts else "")

    def to_dict(self) -> dict[str, Any]:
        hours = self.gpus / 3600.0
        return {"start": self.start, "end": self.end, "wall_seconds": self.wall,
                "productive_seconds": self.productive, "goodput_ratio": self.ratio,
                "badput_seconds": dict(self.badput),
                "badput_seconds_total": sum(self.badput.values()),
                "gpus": self.gpus, "gpu_hours": self.wall * hours,
                "productive_gpu_hours": self.productive * hours,
                "badput_gpu_hours": {k: v * hours for k, v in self.badput.items()},
                "summary": self.summary(), "attempts": self.attempts,
                "incidents": self.incidents}


class GoodputLedger:
    """One run's ledger (module docstring); fed on the engine thread only."""

    def __init__(self) -> None:
        self.last_row = 0
        self.timeline_rank: int | None = None
        self.world_size = 1
        self.ranks: set[int] = set()
        self.attempts: dict[int, _Attempt] = {}
        self.current = 0  # the newest attempt heard
        self.end: float | None = None  # the run's latest record time
        self.hang: _Hang | None = None  # open
        self.hung_steps: set[tuple[int, int]] = set()  # (attempt, step) reported already
        self.checkpoints: set[tuple[int, int]] = set()  # (attempt, step) charged already
        self.incidents: list[Incident] = []
        # Cumulative productive seconds of the timeline at each of its recent steps (and
        # its checkpoint steps), by attempt: what a resume from step S discards.
        self.cum: dict[int, float] = {}  # attempt -> its productive so far
        self.marks: dict[int, tuple[int, float]] = {}  # step -> (attempt, cum at it)
        self.kept_steps: dict[int, tuple[int, int]] = {}  # attempt -> (first, last) step kept
        self.data_times: list[float] = []
        self.floor = 0.0
        self._floor_due = 0
        self._settles: dict[int, tuple[int, str]] = {}  # attempt -> settled before it began
        self.settled_attempts: set[int] = set()  # each is settled once (a restart re-checks)

    # -- feeding ----------------------------------------------------------------------------

    def feed(self, record: Record, attempt: int, row_id: int) -> None:
        """A stored record, in arrival order; one it has seen (``row_id``) is ignored."""
        if row_id <= self.last_row:
            return
        self.last_row = row_id
        t = getattr(record, "time", None)
        if t is None or not math.isfinite(t):
            return
        if attempt > self.current:
            self._begin(attempt, t)
        att = self.attempts.get(attempt)
        if att is None or attempt < self.current:
            # An attempt older than the first one heard, or a superseded one's late record
            # (its time was charged when the next attempt began): history only.
            return
        att.last = max(att.last, t)
        self.end = t if self.end is None else max(self.end, t)
        self.ranks.add(record.rank)
        if isinstance(record, RunRecord):
            size = record.hardware.get("world_size") if record.hardware else None
            if isinstance(size, int) and size > self.world_size:
                self.world_size = size
            return
        if isinstance(record, HangRecord):
            self._hung(record, att)
        elif isinstance(record, StepRecord):
            if self.timeline_rank is None:
                # The lowest rank heard (every rank's run record comes before its steps),
                # not whichever step arrived first: a script evaluates on rank 0.
                self.timeline_rank = min(self.ranks)
            if record.sync_wait_time is not None and math.isfinite(record.sync_wait_time):
                att.waits[record.rank] = att.waits.get(record.rank, 0.0) + max(
                    record.sync_wait_time, 0.0)
            if record.rank == self.timeline_rank:
                self._step(record, att)
        elif isinstance(record, EvalRecord | CheckpointRecord):
            self._aside(record, att)
        elif isinstance(record, EndRecord) and record.rank == self.timeline_rank:
            self._ended(record, att)

    def _begin(self, attempt: int, t: float) -> None:
        before = self.attempts.get(self.current)
        self.current = attempt
        att = self.attempts[attempt] = _Attempt(attempt, start=t, last=t, prev=t)
        self.cum.setdefault(attempt, 0.0)
        if before is None:
            return
        gap = max(t - before.last, 0.0)
        if self.hang is not None:  # hung until killed and relaunched: the hang's cost
            self._close_hang(before, t)
            before.last = max(before.last, t)  # it held the job until then: its wall
            gap = 0.0
        att.buckets.add("restart", gap)
        if attempt in self._settles:
            self.settled(attempt, *self._settles.pop(attempt))

    def settled(self, attempt: int, start_step: int | None, why: str) -> None:
        """The engine's lifecycle placed ``attempt``: it resumed at ``start_step`` (``why``:
        ``rollback``, ``resume`` or ``restart``). Work from that step on is discarded.

        Live, an attempt settles before its first record is fed (pending in ``_settles``
        until it begins); a sidecar restarted after a kill -9 settles it after feeding the
        records stored since the ledger was kept (engine ``_reconcile``). Both come to the
        same account: the gap is the attempt's own (not whichever attempt began last), the
        start-up it has been charged already is its incident's, and the incident takes its
        place before the attempt's own (its hangs)."""
        if start_step is None or attempt in self.settled_attempts:
            return
        att = self.attempts.get(attempt)
        if att is None:  # its first record is in the same batch: when it begins
            self._settles[attempt] = (start_step, why)
            return
        self.settled_attempts.add(attempt)
        cause = "rollback" if why == "rollback" else "resume"
        lost = 0.0
        for number, (first, last) in list(self.kept_steps.items()):
            if number >= attempt or last < start_step:
                continue
            at = self._cum_before(number, start_step) if first < start_step else 0.0
            share = max(self.cum[number] - at, 0.0)
            old = self.attempts.get(number)
            if old is not None and share > 0:
                old.buckets.productive -= share
                old.buckets.add(cause, share)
            self.cum[number] = at
            lost += share
            if first >= start_step:
                del self.kept_steps[number]
            else:
                self.kept_steps[number] = (first, start_step - 1)
        gap = att.buckets.badput["restart"]  # _begin's, the gap before this attempt
        # A relaunch after a crash or a kill is a restart to the people paying for it; the
        # work it did again is ``resume`` badput.
        kind = "rollback" if cause == "rollback" else "restart"
        incident = Incident(kind, start_step, att.start, gap + lost, attempt,
                            detail={"discarded": lost, "gap": gap})
        # Its start-up so far, as _relaunch_cost would have added it (same sums, same order).
        if att.steps:
            _add_startup(incident, att.first_interval or 0.0)
            if att.typical is not None:
                _add_startup(incident, -min(att.typical, att.first_interval or 0.0))
        at = next((i for i, inc in enumerate(self.incidents) if inc.attempt >= attempt),
                  len(self.incidents))
        self.incidents.insert(at, incident)
        del self.incidents[: max(len(self.incidents) - MAX_INCIDENTS, 0)]

    def _cum_before(self, attempt: int, step: int) -> float:
        """The attempt's cumulative productive time through step ``step - 1`` (the nearest
        kept mark at or below it: a resume lands on a checkpoint, whose step is kept)."""
        best: tuple[int, float] | None = None
        for s, (number, cum) in self.marks.items():
            if number == attempt and s < step and (best is None or s > best[0]):
                best = (s, cum)
        return best[1] if best is not None else 0.0

    def _hung(self, record: HangRecord, att: _Attempt) -> None:
        key = (att.number, record.step)
        if key in self.hung_steps or self.hang is not None:
            return
        if att.prev is not None and record.time < att.prev:
            # Reported before the timeline's latest step, which arrived first (another
            # rank's or node's records lag): that step was the recovery, its interval is
            # charged already; opening the hang now would charge the next step's as hang.
            return
        self.hung_steps.add(key)
        last = att.prev if att.prev is not None else record.time - record.stuck_seconds
        since = last + (att.typical or 0.0)
        self.hang = _Hang(record.step, min(since, record.time), record.time, att.number)
        self._incident(Incident("hang", record.step, since, 0.0, att.number, open=True))

    def _close_hang(self, att: _Attempt, until: float) -> float:
        """Charge the open hang up to ``until``; returns its seconds."""
        hang, self.hang = self.hang, None
        assert hang is not None
        before = max(hang.reported - hang.since, 0.0)
        after = max(until - hang.reported, 0.0)
        owner = self.attempts.get(hang.attempt, att)
        owner.buckets.add("hang_undetected", before)
        owner.buckets.add("hang_detected", after)
        for inc in reversed(self.incidents):
            if inc.kind == "hang" and inc.open:
                inc.seconds, inc.open = before + after, False
                inc.detail = {"undetected": before, "detected": after}
                break
        return before + after

    def _aside(self, record: EvalRecord | CheckpointRecord, att: _Attempt) -> None:
        seconds = record.seconds
        if seconds is None or not math.isfinite(seconds) or seconds < 0:
            seconds = 0.0  # not measured
        if isinstance(record, CheckpointRecord):
            key = (att.number, record.step)
            if key in self.checkpoints:
                return
            # Its step's mark outlives the window (_kept), timed or not (an older client
            # sends no seconds): a resume from it discards only the steps after it.
            self.checkpoints.add(key)
            if not seconds:
                return
            att.buckets.add("checkpoint", seconds)
        elif not seconds:
            return
        elif record.rank == self.timeline_rank:
            att.buckets.add("eval", seconds)
        else:
            return
        att.excluded += seconds

    def _step(self, record: StepRecord, att: _Attempt) -> None:
        t, prev = record.time, att.prev if att.prev is not None else att.start
        interval = t - prev
        att.prev = t
        if interval < 0:  # a clock that went back: nothing to charge
            att.excluded = 0.0
            return
        aside = min(att.excluded, interval)
        att.excluded = 0.0
        rest = interval - aside
        att.steps += 1
        if att.steps == 1:
            self._input(record, 0.0)  # its data time informs the floor, charges nothing
            att.first_interval = rest  # start-up until a typical step is known
            att.buckets.add("startup", rest)
            self._relaunch_cost(att, rest)
            self._kept(record.step, att, 0.0)
            return
        if self.hang is not None and self.hang.attempt == att.number:
            rest = max(rest - self._close_hang(att, t), 0.0)
        elif att.typical is None and len(att.intervals) < TYPICAL_STEPS:
            att.intervals.append(rest)
            if len(att.intervals) == TYPICAL_STEPS:
                self._typical_known(att)
        rest -= self._input(record, rest)
        if record.skipped:
            att.buckets.add("loss_scale" if record.skip_reason == "loss_scale" else "skipped",
                            rest)
            self._kept(record.step, att, 0.0)
        else:
            self._kept(record.step, att, rest)

    def _typical_known(self, att: _Attempt) -> None:
        att.typical = float(np.median(att.intervals))
        first = att.first_interval or 0.0
        charge = min(att.typical, first)  # the first step itself was a step
        att.buckets.badput["startup"] -= charge
        att.buckets.productive += charge
        self.cum[att.number] += charge
        self._relaunch_cost(att, -charge)

    def _relaunch_cost(self, att: _Attempt, seconds: float) -> None:
        """A restart's or rollback's cost includes its new attempt's start-up."""
        for inc in reversed(self.incidents):
            if inc.attempt == att.number and inc.kind in ("restart", "rollback"):
                _add_startup(inc, seconds)
                return

    def _input(self, record: StepRecord, rest: float) -> float:
        dt = record.data_time
        if dt is None or not math.isfinite(dt) or dt < 0:
            return 0.0
        self.data_times.append(dt)
        if len(self.data_times) > FLOOR_WINDOW:
            del self.data_times[: len(self.data_times) - FLOOR_WINDOW]
        self._floor_due -= 1
        if self._floor_due <= 0 or len(self.data_times) < FLOOR_EVERY:
            # Few data times: their least is the floor (a 10th percentile of 3 is nearly it)
            self.floor = float(np.percentile(self.data_times, 10))
            self._floor_due = FLOOR_EVERY
        waited = min(max(dt - self.floor, 0.0), rest)
        self.attempts[self.current].buckets.add("input", waited)  # the timeline's attempt
        return waited

    def _kept(self, step: int, att: _Attempt, seconds: float) -> None:
        att.buckets.productive += seconds
        self.cum[att.number] = self.cum.get(att.number, 0.0) + seconds
        first, _ = self.kept_steps.get(att.number, (step, step))
        self.kept_steps[att.number] = (min(first, step), step)
        self.marks[step] = (att.number, self.cum[att.number])
        if len(self.marks) > 2 * MARKS_KEPT + len(self.checkpoints):  # pruned in batches
            keep = {s for _, s in self.checkpoints}
            for s in sorted(self.marks)[: len(self.marks) - MARKS_KEPT]:
                if s not in keep:
                    del self.marks[s]

    def _ended(self, record: EndRecord, att: _Attempt) -> None:
        if self.hang is not None:
            self._close_hang(att, record.time)
        att.ended = True

    def _incident(self, incident: Incident) -> None:
        self.incidents.append(incident)
        del self.incidents[: max(len(self.incidents) - MAX_INCIDENTS, 0)]

    # -- reading ----------------------------------------------------------------------------

    @property
    def gpus(self) -> int:
        return max(self.world_size, len(self.ranks), 1)

    def report(self, now: float | None = None) -> GoodputReport:
        """The ledger as of its latest record (and ``now`` for a hang still open)."""
        total, rows, walls = Buckets(), [], 0.0
        end = self.end
        for number in sorted(self.attempts):
            att = self.attempts[number]
            b = Buckets(att.buckets.productive, dict(att.buckets.badput))
            tax = _straggler_tax(att.waits)
            tax = min(tax, max(b.productive, 0.0))
            b.productive -= tax
            b.add("straggler", tax)
            a_end = att.last
            if self.hang is not None and self.hang.attempt == number and now is not None:
                a_end = max(a_end, now)
                b.add("hang_undetected", max(self.hang.reported - self.hang.since, 0.0))
                b.add("hang_detected", max(now - self.hang.reported, 0.0))
                end = max(end or now, now)
            wall = a_end - att.start + b.badput["restart"]
            walls += wall
            b.add("unaccounted", wall - b.productive - sum(b.badput.values()))
            rows.append({"attempt": number, "start": att.start, "end": a_end,
                         "wall_seconds": wall, "productive_seconds": b.productive,
                         "badput_seconds": {k: v for k, v in b.badput.items() if v}})
            total.productive += b.productive
            for k, v in b.badput.items():
                total.badput[k] += v
        first = min((a.start for a in self.attempts.values()), default=None)
        # The run's wall is its attempts' walls summed (each from the end of the one
        # before it, or from its own first record where the two overlap): attempts one
        # after another add up to the span from the first record to the latest. One whose
        # clock is behind the attempt it replaced (a relaunch on another host's clock, or
        # records stamped by step) overlaps it, and the span would count that time once
        # while both attempts fill it, the new one with work the old one's ``resume`` or
        # ``rollback`` already charges: productive + badput past 100%, an unaccounted
        # below zero ("goodput 99.6%: 17.8% resumed work").
        wall = walls
        # Whatever the attempts' own walls leave out (clocks) is unaccounted, so the
        # buckets add up to the run's wall-clock time exactly.
        total.badput["unaccounted"] += wall - total.productive - sum(total.badput.values())
        incidents = []
        for inc in self.incidents:
            hang = self.hang
            if inc.open and hang is not None and now is not None:  # its cost as of now
                before = max(hang.reported - hang.since, 0.0)
                after = max(now - hang.reported, 0.0)
                inc = replace(inc, seconds=before + after,
                              detail={"undetected": before, "detected": after})
            incidents.append(inc.to_dict(self.gpus))
        return GoodputReport(first, end, wall, total.productive, total.badput, self.gpus,
                             rows, incidents, self.last_row)

    def open_hang_cost(self, now: float) -> float:
        h = self.hang
        return 0.0 if h is None else max(now - h.since, 0.0)

    def last_incident(self, *kinds: str) -> Incident | None:
        """The newest incident of one of ``kinds``."""
        for inc in reversed(self.incidents):
            if inc.kind in kinds:
                return inc
        return None

    # -- durability -------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "v": 1, "last_row": self.last_row, "timeline_rank": self.timeline_rank,
            "world_size": self.world_size, "ranks": sorted(self.ranks),
            "current": self.current, "end": self.end,
            "hang": None if self.hang is None else [self.hang.step, self.hang.since,
                                                    self.hang.reported, self.hang.attempt],
            "hung_steps": sorted(self.hung_steps), "checkpoints": sorted(self.checkpoints),
            "incidents": [[i.kind, i.step, i.start, i.seconds, i.attempt, i.open, i.detail]
                          for i in self.incidents],
            "cum": {str(k): v for k, v in self.cum.items()},
            "marks": {str(k): list(v) for k, v in self.marks.items()},
            "kept_steps": {str(k): list(v) for k, v in self.kept_steps.items()},
            "data_times": self.data_times, "floor": self.floor, "floor_due": self._floor_due,
            "settles": {str(k): list(v) for k, v in self._settles.items()},
            "settled_attempts": sorted(self.settled_attempts),
            "attempts": [[a.number, a.start, a.last, a.buckets.productive,
                          a.buckets.badput, a.prev, a.steps, a.first_interval,
                          a.intervals, a.typical, a.excluded,
                          {str(r): w for r, w in a.waits.items()}, a.ended]
                         for a in self.attempts.values()],
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> GoodputLedger:
        book = cls()
        book.last_row = int(data["last_row"])
        book.timeline_rank = data["timeline_rank"]
        book.world_size = int(data["world_size"])
        book.ranks = set(data["ranks"])
        book.current, book.end = int(data["current"]), data["end"]
        h = data["hang"]
        book.hang = None if h is None else _Hang(int(h[0]), h[1], h[2], int(h[3]))
        book.hung_steps = {(int(a), int(s)) for a, s in data["hung_steps"]}
        book.checkpoints = {(int(a), int(s)) for a, s in data["checkpoints"]}
        book.incidents = [Incident(k, int(s), st, sec, int(a), bool(o), dict(d))
                          for k, s, st, sec, a, o, d in data["incidents"]]
        book.cum = {int(k): float(v) for k, v in data["cum"].items()}
        book.marks = {int(k): (int(v[0]), float(v[1])) for k, v in data["marks"].items()}
        book.kept_steps = {int(k): (int(v[0]), int(v[1]))
                           for k, v in data["kept_steps"].items()}
        book.data_times, book.floor = list(data["data_times"]), float(data["floor"])
        book._floor_due = int(data.get("floor_due", 0))
        book._settles = {int(k): (int(v[0]), str(v[1]))
                         for k, v in data.get("settles", {}).items()}
        book.settled_attempts = {int(n) for n in data.get("settled_attempts", ())}
        for (number, start, last, productive, badput, prev, steps, first, intervals,
             typical, excluded, waits, ended) in data["attempts"]:
            badput = {**dict.fromkeys(CAUSES, 0.0), **badput}
            book.attempts[int(number)] = _Attempt(
                int(number), start, last, Buckets(productive, badput), prev, int(steps),
                first, list(intervals), typical, excluded,
                {int(r): float(w) for r, w in waits.items()}, bool(ended))
        return book


def _add_startup(incident: Incident, seconds: float) -> None:
    incident.seconds += seconds
    incident.detail["startup"] = incident.detail.get("startup", 0.0) + seconds


def _straggler_tax(waits: dict[int, float]) -> float:
    """The median rank's summed all-reduce wait less the least-waiting rank's (module
    docstring): 0 with fewer than 2 ranks reporting waits."""
    if len(waits) < 2:
        return 0.0
    values = sorted(waits.values())
    return max(float(np.median(values)) - values[0], 0.0)
