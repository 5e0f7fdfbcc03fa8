"""Where a run's time went: a goodput ledger, kept from the records the client already sends.

Wall-clock time from the run's first record to its latest (its end, or now while a hang is
open; an attempt whose clock overlaps the one it replaced counts its own time) is split
into **productive** training, the steps kept in the run's current history, and **badput**
by cause (``CAUSES``). The buckets add up to the wall-clock time, per run and per attempt;
device-seconds are those times the ranks the run was seen stepping on (``gpus``: GPUs, or
CPU processes for a CPU-only run: ``DEVICE_WORDS``).

The timeline is one rank's (the lowest the first attempt heard, rank 0 in practice: under
DDP every rank steps together, so one rank's clock is the job's). Each interval between two
of its records is charged once:

- ``startup``: from an attempt's first record (its run record: the process is up) to its
  first step, less one typical step (the median interval of the attempt's next
  ``TYPICAL_STEPS`` steps, charged to the first step once they are in, its typical data
  wait to ``input``): process launch, model build, compile, loader spin-up.
- ``eval`` / ``checkpoint``: the ``seconds`` an eval or checkpoint record says it took
  (the client measures the time since its previous step, eval or checkpoint record: the
  evaluation or the save that ran in between), taken out of the next step's interval.
  A checkpoint counts once per step, whichever rank saved it. A duration is capped by the
  interval it sits in (``_aside``): from the timeline's latest step to the record, less
  what other evals and saves of that interval took (a record arriving after the next
  step: that step's interval), and what the next step's interval cannot hold is given
  back; a record claiming 1e308 seconds costs at most the time that passed.
- ``input``: the time the device waited for data (``StepRecord.input_wait``): on CPU, or
  with a synchronous loader, the training thread's whole wait in the loader
  (``data_time``); on a GPU the part of it the device spent idle (``data_idle_time``: the
  client's CUDA events around the wait), where work queued before it did not cover it.
  No floor is taken off: a floor read off the waits themselves (their 10th percentile, as
  this ledger once did) is the whole wait of a loader that is slow on every step (no
  prefetch, too few workers, remote storage), which then read 0% input while
  ``input_bound`` said the model idles 80% of the time. A prefetching loader's hand-over
  of a ready batch is the training thread waiting for data too, and is charged: a
  fraction of a millisecond to a few (tests/e2e: a healthy prefetching run loses only
  those waits once started, under 1% of a quiet machine's time).
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
- ``straggler_data`` / ``straggler_compute`` / ``straggler_collective``: under data
  parallelism every rank waits at the gradient all-reduce for the slowest. Per attempt,
  the tax is the other ranks' median summed ``sync_wait_time`` less the least-waiting
  rank's (the straggler's), split by what the straggler spends its extra time on, and
  naming it (runs/straggler_tax.py: the ``straggler`` finding's vocabulary). Charged out
  of productive time; where the timeline rank is the straggler, its extra data wait is
  already the timeline's ``input`` and moves from there to ``straggler_data`` (one wait,
  one cause). So a job whose rank 2 loads slowly reads "straggler: data loading (rank 2
  on gpu-1)", and a job whose every rank loads slowly reads ``input``, as ``input_bound``
  says.
- ``unaccounted``: wall-clock time no record explains (the time after the timeline rank's
  last record that other ranks' records cover, or a clock that went backwards).

Incidents carry their cost (``Incident``): a hang, a restart or resume (its gap, start-up
and the work it re-did), a rollback (the discarded work, its gap and start-up), each in
seconds and GPU-hours; the page that resolves one says it, as does the run's verdict.

The ledger sees each stored record once, in arrival order (``feed``'s row id), including
those of older attempts a newer one superseded; it is kept in its own table and restored
with the run (``to_state`` / ``from_state``), then fed every record stored after its kept
position, superseded ones too (``RecordWalk._catch_up_goodput``), and carried over when a
new attempt rebuilds the run's detectors, so it keeps what the rebuilt history forgets. An
attempt settled after its records were fed again (a restart between the two) comes to the
account of one settled before its first record (``settled``).

A run up 2 s before its first step, whose loader made step 6 wait 1 s more than the 10 ms
every step waits, and which saved a checkpoint for 2 s after step 8 (steps take 1 s)::

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
    >>> r.wall, round(r.productive, 6), {k: round(v, 6) for k, v in r.badput.items() if round(v, 6)}
    (16.0, 11.88, {'startup': 1.0, 'input': 1.12, 'checkpoint': 2.0})
    >>> r.summary()
    'goodput 74.2%: 12.5% checkpoints, 7.0% input, 6.2% start-up'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from monitor_agent.detectors.support.context import host_label
from monitor_agent.records.types import (
    CheckpointRecord,
    EndRecord,
    EvalRecord,
    HangRecord,
    Record,
    RunRecord,
    StepRecord,
)
from monitor_agent.runs.straggler_tax import PARTS, RankSums, StragglerTax, straggler_tax

CAUSES: tuple[str, ...] = (
    "startup", "input", "checkpoint", "eval", "hang_undetected", "hang_detected",
    "restart", "rollback", "resume", "skipped", "loss_scale", "straggler_data",
    "straggler_compute", "straggler_collective", "unaccounted",
)
"""Badput causes, in the order people read them (docs/goodput.md)."""

CAUSE_WORDS: dict[str, str] = {
    "startup": "start-up", "input": "input", "checkpoint": "checkpoints", "eval": "eval",
    "hang_undetected": "hang before detection", "hang_detected": "hang after detection",
    "restart": "restarts", "rollback": "rollback", "resume": "resumed work",
    "skipped": "skipped steps", "loss_scale": "loss-scale skips",
    "straggler_data": "straggler: data loading", "straggler_compute": "straggler: compute",
    "straggler_collective": "straggler: collective", "unaccounted": "unaccounted",
}
STRAGGLER_CAUSES: dict[str, str] = {f"straggler_{part}": part for part in PARTS}
"""The straggler tax's causes, each the part of runs/straggler_tax.py it holds."""
DEVICE_WORDS: dict[str | None, tuple[str, str, str]] = {
    "cuda": ("GPU", "GPUs", "GPU-hours"), "cpu": ("CPU process", "CPU processes",
                                                 "process-hours"),
    None: ("rank", "ranks", "rank-hours")}
"""What a run's ranks are, by its run records' ``hardware.device`` (one, many, the hours):
a CPU-only run's are not GPUs, and a run that did not say is counted in ranks."""

_INF = math.inf
TYPICAL_STEPS = 8  # steps whose median interval is a typical step (start-up, hangs)
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

    def words(self, gpus: int, device: str | None = "cuda") -> str:
        """"this hang cost 14 min x 64 GPUs = 15 GPU-hours" ("has cost ... so far" while
        it is open)."""
        cost = cost_words(self.seconds, gpus, device)
        if self.open:
            return f"this {self.kind} has cost {cost} so far"
        return f"this {self.kind} cost {cost}"

    def to_dict(self, gpus: int, device: str | None = "cuda") -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "start": self.start,
                "seconds": self.seconds, "gpu_hours": self.gpu_hours(gpus),
                "attempt": self.attempt, "open": self.open, "detail": dict(self.detail),
                "words": self.words(gpus, device)}


def cost_words(seconds: float, gpus: int, device: str | None = "cuda") -> str:
    """14 min x 64 GPUs = 15 GPU-hours (one device: just the time); a CPU-only run's are
    CPU processes (``DEVICE_WORDS``)::

        >>> cost_words(840, 64), cost_words(20, 2, "cpu"), cost_words(20, 1, "cpu")
        ('14 min x 64 GPUs = 15 GPU-hours', '20 s x 2 CPU processes = 0.011 process-hours', '20 s')
    """
    span = _duration(seconds)
    if gpus <= 1:
        return span
    _, many, hours = DEVICE_WORDS.get(device, DEVICE_WORDS[None])
    return f"{span} x {gpus} {many} = {_hours(seconds * gpus / 3600.0)} {hours}"


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
    sums: dict[int, RankSums] = field(default_factory=dict)  # rank -> its step parts
    ended: bool = False
    # The eval/checkpoint seconds in ``excluded`` by cause (what a step gives back), and
    # the timeline's latest step interval (where a late one of them sits).
    aside: dict[str, float] = field(default_factory=dict)
    last_interval: float = 0.0
    first_wait: float = 0.0  # the first step's wait for data (its loader's spin-up too)
    waits: list[float] = field(default_factory=list)  # the data waits of ``intervals``


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
    device: str | None = "cuda"  # the run records' hardware.device (DEVICE_WORDS)
    straggler: StragglerTax | None = None  # the newest attempt's, with a tax

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
        parts = ", ".join(f"{v / self.wall:.1%} {self._words(k)}" for v, k in worst)
        return f"goodput {ratio:.1%}" + (f": {parts}" if parts else "")

    def _words(self, cause: str) -> str:
        """A cause's words; a straggler's name who it is: "straggler: data loading (rank 2
        on gpu-1)"."""
        if cause in STRAGGLER_CAUSES and self.straggler is not None:
            return f"{CAUSE_WORDS[cause]} ({self.straggler.who})"
        return CAUSE_WORDS[cause]

    def to_dict(self) -> dict[str, Any]:
        hours = self.gpus / 3600.0
        one, many, unit = DEVICE_WORDS.get(self.device, DEVICE_WORDS[None])
        return {"start": self.start, "end": self.end, "wall_seconds": self.wall,
                "productive_seconds": self.productive, "goodput_ratio": self.ratio,
                "badput_seconds": dict(self.badput),
                "badput_seconds_total": sum(self.badput.values()),
                "gpus": self.gpus, "gpu_hours": self.wall * hours,
                "productive_gpu_hours": self.productive * hours,
                "badput_gpu_hours": {k: v * hours for k, v in self.badput.items()},
                "device": self.device,
                "device_words": {"one": one, "many": many, "hours": unit},
                "straggler": None if self.straggler is None else self.straggler.to_dict(),
                "summary": self.summary(), "attempts": self.attempts,
                "incidents": self.incidents}


class GoodputLedger:
    """One run's ledger (module docstring); fed on the engine thread only."""

    def __init__(self) -> None:
        self.last_row = 0
        self.timeline_rank: int | None = None
        self.world_size = 1  # as the run records declare it (shown, not weighed)
        self.ranks: set[int] = set()
        self.stepped: set[int] = set()  # ranks seen stepping: what the run is weighed by
        self.hosts: dict[int, str] = {}  # rank -> its node (run record labels)
        self.device: str | None = None  # hardware.device of the run records
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
        if t > att.last:
            att.last = t
        if self.end is None or t > self.end:
            self.end = t
        rank = record.rank
        self.ranks.add(rank)
        if isinstance(record, StepRecord):  # most records: ahead of the rarer kinds
            if self.timeline_rank is None:
                # The lowest rank heard (every rank's run record comes before its steps),
                # not whichever step arrived first: a script evaluates on rank 0.
                self.timeline_rank = min(self.ranks)
            self.stepped.add(rank)
            if record.sync_wait_time is not None:
                self._sum(record, att)
            if rank == self.timeline_rank:
                self._step(record, att)
        elif isinstance(record, RunRecord):
            self._described(record)
        elif isinstance(record, HangRecord):
            self._hung(record, att)
        elif isinstance(record, EvalRecord | CheckpointRecord):
            self._aside(record, att)
        elif isinstance(record, EndRecord) and record.rank == self.timeline_rank:
            self._ended(record, att)

    def _described(self, record: RunRecord) -> None:
        hardware = record.hardware or {}
        size = hardware.get("world_size")
        if isinstance(size, int) and size > self.world_size:
            self.world_size = size
        device = hardware.get("device")
        if device in DEVICE_WORDS and (self.device is None or device == "cuda"):
            self.device = device  # one GPU rank makes it a GPU run
        host = host_label(record.labels or {})
        if host is not None:
            self.hosts[record.rank] = host[:128]

    def _sum(self, record: StepRecord, att: _Attempt) -> None:
        """A rank's step parts, summed for the straggler tax (runs/straggler_tax.py): its
        all-reduce wait, which sits in its step (capped by ``step_time`` where it says
        one), its data wait (``input_wait``) and its compute (``compute_time``, else the
        step less the two waits, as detectors/straggler.py's ``compute_of``). Every rank's
        every step comes here: written for that (no call per part)."""
        sums = att.sums.get(record.rank)
        if sums is None:
            # Its first step of the attempt is not summed: its interval is start-up, and its
            # wait holds the ranks' start-up skew (one up before the others waits for them).
            att.sums[record.rank] = RankSums()
            return
        wait, step = record.sync_wait_time, record.step_time
        if wait is None or not _INF > wait > -_INF:  # NaN fails both
            return
        if step is not None and wait > step and step < _INF:
            wait = step
        if wait < 0.0:
            wait = 0.0
        data = record.input_wait or 0.0
        compute = record.compute_time
        if compute is None and step is not None:
            compute = step - wait - data
        sums.wait += wait
        sums.data += data
        if compute is not None and _INF > compute > 0.0:
            sums.compute += compute
        sums.steps += 1

    def begin(self, attempt: int, t: float) -> None:
        """Attempt ``attempt`` began at ``t``: the record that settled it, ahead of its
        feed (an attempt the ledger heard already, or a later one, is left as it is)."""
        if attempt > self.current and math.isfinite(t):
            self._begin(attempt, t)

    def _begin(self, attempt: int, t: float) -> None:
        before = self.attempts.get(self.current)
        self.current = attempt
        att = self.attempts[attempt] = _Attempt(attempt, start=t, last=t, prev=t)
        self.cum.setdefault(attempt, 0.0)
        if before is None:
            return
        gap = max(t - before.last, 0.0)
        if self.hang is not None:  # hung until killed and relaunched: the hang's cost
            self._close_hang(before, t, "relaunch")
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
        records stored since the ledger was kept (``Consequences.reconcile``). Both come to the
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

    def _close_hang(self, att: _Attempt, until: float, by: str = "step") -> float:
        """Charge the open hang up to ``until``; returns its seconds. ``by``: what ended it,
        a ``step`` (it recovered in place), the attempt's ``end`` (its processes left: an
        exit 75, a crash at the collective timeout) or a ``relaunch`` (the next attempt
        began), which runs/ettr.py reads (``left``: when they left) to pair it with the relaunch that
        followed."""
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
                if by == "end":  # its processes left: a relaunch after a gap may end it
                    inc.detail["left"] = until
                break
        return before + after

    def _aside(self, record: EvalRecord | CheckpointRecord, att: _Attempt) -> None:
        seconds = record.seconds
        if seconds is None or not math.isfinite(seconds) or seconds < 0:
            seconds = 0.0  # not measured
        # The interval it sits in: since the timeline's latest step (or start), less what
        # the evals and saves before it in that interval took; one arriving after the next
        # step (another rank's, on its own clock) sat in that step's interval.
        since = att.prev if att.prev is not None else att.start
        room = max(record.time - since, att.last_interval if record.time < since else 0.0)
        seconds = min(seconds, max(room - att.excluded, 0.0))
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
        cause = "checkpoint" if isinstance(record, CheckpointRecord) else "eval"
        att.aside[cause] = att.aside.get(cause, 0.0) + seconds

    def _give_back(self, att: _Attempt, room: float) -> None:
        """The evals and saves of an interval claimed more than it held: each gives back
        its share of the excess, so the buckets never pass the time that passed."""
        excess = att.excluded - room
        if excess > 0:
            for cause, seconds in att.aside.items():
                att.buckets.badput[cause] -= excess * seconds / att.excluded
        att.excluded = 0.0
        att.aside.clear()

    def _step(self, record: StepRecord, att: _Attempt) -> None:
        t, prev = record.time, att.prev if att.prev is not None else att.start
        interval = t - prev
        att.prev = t
        if interval < 0:  # a clock that went back: nothing to charge
            self._give_back(att, 0.0)
            return
        att.last_interval = interval
        aside = min(att.excluded, interval)
        self._give_back(att, interval)
        rest = interval - aside
        att.steps += 1
        if att.steps == 1:
            att.first_interval = rest  # start-up until a typical step is known
            att.first_wait = min(record.input_wait or 0.0, rest)
            att.buckets.add("startup", rest)
            self._relaunch_cost(att, rest)
            self._kept(record.step, att, 0.0)
            return
        if self.hang is not None and self.hang.attempt == att.number:
            rest = max(rest - self._close_hang(att, t), 0.0)
        elif att.typical is None and len(att.intervals) < TYPICAL_STEPS:
            att.intervals.append(rest)
            att.waits.append(min(record.input_wait or 0.0, rest))
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
        # ... which waited for its data as a typical step does; the rest of its wait (the
        # loader's workers starting, its first read) is start-up.
        waited = min(att.first_wait, float(np.median(att.waits)) if att.waits else 0.0,
                     charge)
        att.buckets.badput["startup"] -= charge
        att.buckets.add("input", waited)
        att.buckets.productive += charge - waited
        self.cum[att.number] += charge - waited
        # The first step's own time, known only now, came before every step kept since:
        # their marks hold it too, or a resume from one of them would discard it.
        for s, (number, cum) in list(self.marks.items()):
            if number == att.number:
                self.marks[s] = (number, cum + charge - waited)
        self._relaunch_cost(att, -charge)

    def _relaunch_cost(self, att: _Attempt, seconds: float) -> None:
        """A restart's or rollback's cost includes its new attempt's start-up."""
        for inc in reversed(self.incidents):
            if inc.attempt == att.number and inc.kind in ("restart", "rollback"):
                _add_startup(inc, seconds)
                return

    def _input(self, record: StepRecord, rest: float) -> float:
        """The step's wait for data (``StepRecord.input_wait``, the module docstring's
        ``input``), within what is left of its interval."""
        waited = min(record.input_wait or 0.0, rest)
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
            self._close_hang(att, record.time, "end")
        att.ended = True

    def _incident(self, incident: Incident) -> None:
        self.incidents.append(incident)
        del self.incidents[: max(len(self.incidents) - MAX_INCIDENTS, 0)]

    # -- reading ----------------------------------------------------------------------------

    @property
    def gpus(self) -> int:
        """What the run is weighed by: the ranks seen stepping (GPUs, or CPU processes), not
        the world size its run records declare. A claim of a million ranks is not a
        million GPUs' time; a run sending from rank 0 only (``rank0_only``) is weighed as
        its one rank (docs/goodput.md, "Limits")."""
        return max(len(self.stepped), 1)

    def report(self, now: float | None = None) -> GoodputReport:
        """The ledger as of its latest record (and ``now`` for a hang still open)."""
        total, rows, walls = Buckets(), [], 0.0
        end, named = self.end, None
        for number in sorted(self.attempts):
            att = self.attempts[number]
            b = Buckets(att.buckets.productive, dict(att.buckets.badput))
            tax = straggler_tax(att.sums, self.hosts)
            if tax is not None:
                self._charge_straggler(tax, b)
                named = tax
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
                         "badput_seconds": {k: v for k, v in b.badput.items() if v},
                         "straggler": None if tax is None else tax.to_dict()})
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
            incidents.append(inc.to_dict(self.gpus, self.device))
        return GoodputReport(first, end, wall, total.productive, total.badput, self.gpus,
                             rows, incidents, self.last_row, self.device, named)

    def _charge_straggler(self, tax: StragglerTax, b: Buckets) -> None:
        """An attempt's straggler tax into its buckets (``b``), by part. Out of productive
        time (the others' steps waited for it), except the part of the straggler's extra
        data wait the timeline already charged as ``input``: the timeline rank IS the
        straggler there, and that wait moves to ``straggler_data`` (charged once)."""
        data = tax.parts["data"]
        if tax.rank == self.timeline_rank:
            moved = min(data, b.badput["input"])
            b.badput["input"] -= moved
            b.add("straggler_data", moved)
            data -= moved
        for cause, part in STRAGGLER_CAUSES.items():
            seconds = min(data if part == "data" else tax.parts[part], max(b.productive, 0.0))
            b.productive -= seconds
            b.add(cause, seconds)

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
            "v": 2, "last_row": self.last_row, "timeline_rank": self.timeline_rank,
            "world_size": self.world_size, "ranks": sorted(self.ranks),
            "stepped": sorted(self.stepped), "device": self.device,
            "hosts": {str(r): h for r, h in self.hosts.items()},
            "current": self.current, "end": self.end,
            "hang": None if self.hang is None else [self.hang.step, self.hang.since,
                                                    self.hang.reported, self.hang.attempt],
            "hung_steps": sorted(self.hung_steps), "checkpoints": sorted(self.checkpoints),
            "incidents": [[i.kind, i.step, i.start, i.seconds, i.attempt, i.open, i.detail]
                          for i in self.incidents],
            "cum": {str(k): v for k, v in self.cum.items()},
            "marks": {str(k): list(v) for k, v in self.marks.items()},
            "kept_steps": {str(k): list(v) for k, v in self.kept_steps.items()},
            "settles": {str(k): list(v) for k, v in self._settles.items()},
            "settled_attempts": sorted(self.settled_attempts),
            "attempts": [[a.number, a.start, a.last, a.buckets.productive,
                          a.buckets.badput, a.prev, a.steps, a.first_interval,
                          a.intervals, a.typical, a.excluded,
                          {str(r): w.to_list() for r, w in a.sums.items()}, a.ended,
                          a.aside, a.last_interval, a.first_wait, a.waits]
                         for a in self.attempts.values()],
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> GoodputLedger:
        book = cls()
        book.last_row = int(data["last_row"])
        book.timeline_rank = data["timeline_rank"]
        book.world_size = int(data["world_size"])
        book.ranks = set(data["ranks"])
        # A version 1 ledger weighed by every rank heard, and kept summed waits only.
        book.stepped = set(data.get("stepped", data["ranks"]))
        book.device = data.get("device")
        book.hosts = {int(r): str(h) for r, h in data.get("hosts", {}).items()}
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
        book._settles = {int(k): (int(v[0]), str(v[1]))
                         for k, v in data.get("settles", {}).items()}
        book.settled_attempts = {int(n) for n in data.get("settled_attempts", ())}
        for (number, start, last, productive, badput, prev, steps, first, intervals,
             typical, excluded, sums, ended, *more) in data["attempts"]:
            badput = {**dict.fromkeys(CAUSES, 0.0), **badput}
            aside, last_interval, first_wait, waits = more if more else ({}, 0.0, 0.0, [])
            book.attempts[int(number)] = _Attempt(
                int(number), start, last, Buckets(productive, badput), prev, int(steps),
                first, list(intervals), typical, excluded,
                {int(r): RankSums.from_list(w) if isinstance(w, list) else RankSums(
                    float(w), steps=1) for r, w in sums.items()}, bool(ended),
                {str(k): float(v) for k, v in aside.items()}, float(last_interval),
                float(first_wait), [float(w) for w in waits])
        return book


def _add_startup(incident: Incident, seconds: float) -> None:
    incident.seconds += seconds
    incident.detail["startup"] = incident.detail.get("startup", 0.0) + seconds

