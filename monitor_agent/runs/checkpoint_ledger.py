"""The checkpoint ledger: which of a run's saved checkpoints are safe to go back to.

The client reports each checkpoint the trainer saves (a ``checkpoint`` record,
docs/format.md); the store keeps them per run and attempt (``Store.checkpoints``: the
current history only, so one that a later attempt replaced is gone from the ledger). Each
is judged **clean** or **suspect** against the run's page-worthy findings (severity error
and up, current history, not log-only):

- A finding's fault begins at its *onset*, ``evidence["onset_step"]`` when the detector
  says where the signal left its band (a divergence found at 12050 may have begun at
  11900), else the finding's step.
- A checkpoint at step C is **suspect** when some fault began at or before C and was still
  in force at C. A fault that damages the weights (``verdict.CAUSES``: NaN/Inf,
  divergence, gradient explosion, activation blow-up, loss-scale collapse) stays in force
  until the history holding it is replaced (a rollback or restart): as runs/verdict.py
  argues, a resolved alert is not a recovery, and weights saved after the damage carry
  it. Any other page-worthy fault (a stall, memory pressure) is about the job, not the
  weights: it is in force from its onset to the step it was found at.
- Otherwise **clean**. The judgement is a function of the checkpoints and findings only,
  so a finding that arrives later changes it: a divergence found at 12050 with onset
  11900 makes the checkpoint at 12000 suspect after the fact (``CheckpointLedger``
  judges each checkpoint once on its add and each finding once on its arrival).

A run saved at 11800 and 12000, then diverged (found at 12050, onset 11900)::

    >>> from monitor_agent.records.types import Severity
    >>> ledger = CheckpointLedger()
    >>> for step in (11800, 12000):
    ...     ledger.add(LedgerEntry(step, f"/ckpt/step-{step}.pt", rank=0, time=0.0, attempt=1))
    >>> ledger.last_clean().step
    12000
    >>> ledger.observe(Finding("divergence", Severity.ERROR, "gpt-7", step=12050,
    ...                        message="loss diverged", evidence={"onset_step": 11900}))
    True
    >>> [(j.entry.step, j.status) for j in ledger.judged()]
    [(11800, 'clean'), (12000, 'suspect')]
    >>> ledger.judged()[1].reason
    'divergence from step 11900 (found at step 12050) was in force at step 12000'
    >>> ledger.line()
    'last clean checkpoint: step 11800, /ckpt/step-11800.pt'
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from monitor_agent.records import tokens
from monitor_agent.records.types import Finding, Severity
from monitor_agent.runs.verdict import CAUSES, ENDINGS

Status = Literal["clean", "suspect"]

CHECKPOINT_STEP_SLACK = 1
"""How far past the run's latest step (from any rank) a checkpoint's step may be. The
client sends a checkpoint after the step record it holds, on the same queue, so its step
is never ahead; one step covers a trainer counting "steps done" where its step records
count from 0. Further ahead is a step in the future, refused (the ledger must not hold a
rollback target the run never reached)."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One checkpoint of the run's current history (``attempt``: the run's attempt number
    that reported it; ``token``: the sending process's attempt token)."""

    step: int
    path: str
    rank: int
    time: float | None
    attempt: int
    bytes: int | None = None
    tag: str | None = None
    token: str | None = None
    # The data position its state resumes from (docs/format.md); None when not reported.
    position: int | None = None


@dataclass(frozen=True, slots=True)
class Fault:
    """A page-worthy finding as the ledger judges by it."""

    type: str
    rank: int
    onset: int
    step: int
    layer: str | None = None

    @classmethod
    def of(cls, finding: Finding) -> Fault | None:
        """The fault a finding stands for, or None when it pages nobody or says nothing
        of any checkpoint (a crash, ``verdict.ENDINGS``: the process died after its last
        step, whose save is as good as it was)."""
        if finding.log_only or not finding.severity.pages or finding.type in ENDINGS:
            return None
        return cls._build(finding.type, finding.rank, finding.step, finding.layer,
                          finding.evidence)

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> Fault | None:
        """The fault of a stored finding's JSON (``Finding.to_dict``)."""
        if (data.get("log_only") or Severity.parse(data["severity"]) < Severity.ERROR
                or data["type"] in ENDINGS):
            return None
        return cls._build(data["type"], int(data.get("rank", 0)), int(data["step"]),
                          data.get("layer"), data.get("evidence") or {})

    @classmethod
    def _build(cls, type_: str, rank: int, step: int, layer: str | None,
               evidence: dict[str, Any]) -> Fault:
        onset = evidence.get("onset_step", step)
        if not isinstance(onset, int) or isinstance(onset, bool) or onset > step:
            onset = step
        return cls(type_, rank, onset, step, layer)

    def in_force_at(self, step: int) -> bool:
        """Began at or before ``step`` and still in force there (see the module doc)."""
        if self.onset > step:
            return False
        return self.type in CAUSES or step <= self.step

    def words(self) -> str:
        found = "" if self.onset == self.step else f" (found at step {self.step})"
        return f"{self.type} from step {self.onset}{found}"


@dataclass(frozen=True, slots=True)
class Judged:
    """A checkpoint with its status and, when suspect, the fault that makes it so."""

    entry: LedgerEntry
    status: Status
    reason: str | None = None


def judge(entries: list[LedgerEntry], faults: list[Fault]) -> list[Judged]:
    """Each checkpoint, oldest first, clean or suspect (the module doc's rule).

        >>> nan = Fault("nan_inf", rank=1, onset=300, step=300)
        >>> stall = Fault("stalled", rank=0, onset=100, step=120)
        >>> [(j.entry.step, j.status) for j in judge(
        ...     [LedgerEntry(s, "p", 0, None, 1) for s in (50, 110, 200, 400)], [nan, stall])]
        [(50, 'clean'), (110, 'suspect'), (200, 'clean'), (400, 'suspect')]
    """
    out = []
    for entry in sorted(entries, key=lambda e: (e.step, e.attempt)):
        fault = next((f for f in faults if f.in_force_at(entry.step)), None)
        if fault is None:
            out.append(Judged(entry, "clean"))
        else:
            out.append(Judged(entry, "suspect",
                              f"{fault.words()} was in force at step {entry.step}"))
    return out


@dataclass(slots=True)
class CheckpointLedger:
    """A run's checkpoints and page-worthy faults, in memory with the run (engine thread);
    loaded from the store with the run (``RunRegistry.load``) and kept up as records and
    findings arrive. ``last_clean_step`` is a plain copy for the /metrics thread.

    **What it costs.** Judged incrementally, never all over again (a run reporting 20,000
    checkpoints took 46 s of engine for its last 1,000 when every add re-judged every
    entry against every fault). A checkpoint is suspect when some fault is in force at
    its step: one in ``CAUSES`` from its onset on (only the earliest one matters), any
    other over ``[onset, found at]`` (kept as their union, disjoint sorted spans). So:

    - ``add``: one entry judged, O(log faults), and kept in step order, O(log n) (an
      insertion out of order moves list pointers, a memmove);
    - ``observe``: the clean entries the new fault covers turn suspect, found by bisection
      and removed in one slice, O(log n + the ones it turns); an entry turns suspect once
      (faults are only ever added), so this is amortised O(log n) over the run;
    - ``last_clean``, ``line``, ``last_clean_step``, ``get``, ``ranks``: O(1);
      ``clean_view``/``positions_view``: O(1) views of the clean ones (a page's
      ``RunContext``), O(log n) a lookup;
    - ``judged`` (the API's list, with each suspect one's reason: the earliest fault in
      force at its step): worked out on the first read after a change, one sweep over the
      entries with a heap of the faults in force, O((n + faults) log faults), and kept
      until the next change.

    ``judgements`` counts entries judged (one per add, one per entry a fault turns
    suspect): what the tests hold the bound to."""

    entries: dict[tuple[int, int], LedgerEntry] = field(default_factory=dict)
    faults: set[Fault] = field(default_factory=set)
    last_clean_step: int | None = None
    judgements: int = 0
    # Every key (step, attempt) and the clean ones, in order.
    _keys: list[tuple[int, int]] = field(default_factory=list, repr=False)
    _clean: list[tuple[int, int]] = field(default_factory=list, repr=False)
    # The earliest onset of a fault that damages the weights (in force from there on), and
    # the union of the other faults' [onset, found at] spans, disjoint and sorted.
    _cause_onset: int | None = field(default=None, repr=False)
    _spans: list[tuple[int, int]] = field(default_factory=list, repr=False)
    _ranks: dict[int, int] = field(default_factory=dict, repr=False)
    _ranks_tuple: tuple[int, ...] = field(default=(), repr=False)
    # ``judged()``'s answer, kept until the next change (None: to work out).
    _judged: list[Judged] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, findings: Iterable[Mapping[str, Any]],
           entries: Iterable[LedgerEntry]) -> CheckpointLedger:
        """The ledger of a run's current history, from what the store keeps of it (read
        there by the caller: ``pipeline/recovery.py`` ``stored_ledger``): its paged
        findings' JSON (``Finding.to_dict``), oldest first, and its checkpoints."""
        ledger = cls()
        for data in findings:
            fault = Fault.from_stored(dict(data))
            if fault is not None:
                ledger._fault(fault)
        for entry in entries:
            ledger.add(entry)
        return ledger

    def add(self, entry: LedgerEntry) -> None:
        """Keep a checkpoint (the first one wins for its step and attempt), judged now."""
        key = (entry.step, entry.attempt)
        if key in self.entries:
            return
        self.entries[key] = entry
        _insort(self._keys, key)
        self._ranks[entry.rank] = self._ranks.get(entry.rank, 0) + 1
        if self._ranks[entry.rank] == 1:
            self._ranks_tuple = tuple(sorted(self._ranks))
        self.judgements += 1
        if not self._in_force(entry.step):
            _insort(self._clean, key)
        self._changed()

    def get(self, step: int, attempt: int) -> LedgerEntry | None:
        return self.entries.get((step, attempt))

    def observe(self, finding: Finding) -> bool:
        """Take a finding into account; True when it is a fault the ledger did not know."""
        fault = Fault.of(finding)
        if fault is None or fault in self.faults:
            return False
        self._fault(fault)
        self._changed()
        return True

    def judged(self) -> list[Judged]:
        """Every checkpoint, judged, oldest first (the same list until the ledger changes:
        do not modify it)."""
        if self._judged is None:
            self._judged = self._sweep()
        return self._judged

    def clean(self) -> list[LedgerEntry]:
        """The clean checkpoints, oldest first."""
        return [self.entries[k] for k in self._clean]

    def last_clean(self) -> LedgerEntry | None:
        return self.entries[self._clean[-1]] if self._clean else None

    def clean_view(self) -> CleanView:
        """The clean checkpoints as (step, path), oldest first, without copying them."""
        return CleanView(self)

    def positions_view(self) -> PositionsView:
        """Each clean checkpoint's data position (step -> position), without copying."""
        return PositionsView(self)

    def ranks(self) -> tuple[int, ...]:
        """The ranks that reported checkpoints, in order."""
        return self._ranks_tuple

    def line(self) -> str | None:
        """What every page of the run says of it; None when the run reported no checkpoint."""
        if not self.entries:
            return None
        last = self.last_clean()
        if last is None:
            return "no clean checkpoint reported"
        return f"last clean checkpoint: step {last.step}, {last.path}"

    # -- incremental judgement --------------------------------------------------------------

    def _in_force(self, step: int) -> bool:
        """Whether some known fault is in force at ``step`` (the module doc's rule)."""
        if self._cause_onset is not None and self._cause_onset <= step:
            return True
        i = bisect.bisect_right(self._spans, (step, _BIG)) - 1
        return i >= 0 and self._spans[i][1] >= step

    def _fault(self, fault: Fault) -> None:
        """Add a fault; the clean entries it is in force at turn suspect."""
        self.faults.add(fault)
        if fault.type in CAUSES:
            if self._cause_onset is not None and self._cause_onset <= fault.onset:
                return  # an earlier one already covers everything this one does
            self._cause_onset = fault.onset
            first, last = fault.onset, _BIG
        else:
            first, last = fault.onset, fault.step
            self._merge_span(first, last)
        clean = self._clean
        lo = bisect.bisect_left(clean, first, key=_step_of)
        hi = bisect.bisect_right(clean, last, key=_step_of)
        if hi > lo:
            self.judgements += hi - lo
            del clean[lo:hi]

    def _merge_span(self, first: int, last: int) -> None:
        spans = self._spans
        lo = bisect.bisect_left(spans, (first, -_BIG))
        if lo > 0 and spans[lo - 1][1] >= first - 1:
            lo -= 1
        hi = lo
        while hi < len(spans) and spans[hi][0] <= last + 1:
            hi += 1
        if hi > lo:
            first, last = min(first, spans[lo][0]), max(last, spans[hi - 1][1])
        spans[lo:hi] = [(first, last)]

    def _changed(self) -> None:
        self._judged = None
        self.last_clean_step = self._clean[-1][0] if self._clean else None

    def _sweep(self) -> list[Judged]:
        """``judge(entries, faults in _fault_order)``, in one pass: entries by step, each
        fault entering a heap (keyed by its order) at its onset and leaving it once past
        the step it stays in force to; the top of the heap is the one a reason names."""
        faults = sorted(self.faults, key=lambda f: f.onset)
        heap: list[tuple[tuple[int, int, str, int, str], int, Fault]] = []
        out: list[Judged] = []
        clean = set(self._clean)
        i = 0
        for key in self._keys:
            entry = self.entries[key]
            step = entry.step
            if key in clean:
                out.append(Judged(entry, "clean"))
                continue
            while i < len(faults) and faults[i].onset <= step:
                f = faults[i]
                heapq.heappush(heap, (_fault_order(f), _BIG if f.type in CAUSES else f.step,
                                      f))
                i += 1
            while heap and heap[0][1] < step:
                heapq.heappop(heap)  # no longer in force, nor at any later step
            fault = heap[0][2]
            out.append(Judged(entry, "suspect",
                              f"{fault.words()} was in force at step {entry.step}"))
        return out


_BIG = 1 << 62  # past any step


def _step_of(key: tuple[int, int]) -> int:
    return key[0]


def _insort(keys: list[tuple[int, int]], key: tuple[int, int]) -> None:
    if not keys or keys[-1] < key:
        keys.append(key)  # the usual case: a run saves forward
    else:
        bisect.insort(keys, key)


class CleanView(Sequence[tuple[int, str]]):
    """A ledger's clean checkpoints as (step, path), oldest first: a view of the ledger, not
    a copy, so that a page's ``RunContext`` costs O(1) however many checkpoints the run
    reported. Read it while the ledger is unchanged (within the call it was made for)."""

    __slots__ = ("_ledger",)

    def __init__(self, ledger: CheckpointLedger) -> None:
        self._ledger = ledger

    def __len__(self) -> int:
        return len(self._ledger._clean)

    @overload
    def __getitem__(self, i: int) -> tuple[int, str]: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[tuple[int, str], ...]: ...

    def __getitem__(self, i: int | slice) -> tuple[int, str] | tuple[tuple[int, str], ...]:
        entries = self._ledger.entries
        if isinstance(i, slice):
            return tuple((entries[k].step, entries[k].path) for k in self._ledger._clean[i])
        e = entries[self._ledger._clean[i]]
        return e.step, e.path

    def __iter__(self) -> Iterator[tuple[int, str]]:
        entries = self._ledger.entries
        for k in self._ledger._clean:
            yield entries[k].step, entries[k].path

    def __repr__(self) -> str:
        return f"CleanView({tuple(self)!r})"


class PositionsView(Mapping[int, int]):
    """A ledger's clean checkpoints' data positions, step -> position (of the latest attempt
    at that step that reported one), as a view: O(log n) a lookup."""

    __slots__ = ("_ledger",)

    def __init__(self, ledger: CheckpointLedger) -> None:
        self._ledger = ledger

    def __getitem__(self, step: int) -> int:
        clean, entries = self._ledger._clean, self._ledger.entries
        lo = bisect.bisect_left(clean, step, key=_step_of)
        hi = bisect.bisect_right(clean, step, key=_step_of)
        for k in reversed(clean[lo:hi]):
            position = entries[k].position
            if position is not None:
                return position
        raise KeyError(step)

    def __iter__(self) -> Iterator[int]:
        entries, seen = self._ledger.entries, None
        for k in self._ledger._clean:
            if k[0] != seen and entries[k].position is not None and k[0] in self:
                seen = k[0]
                yield k[0]

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _fault_order(f: Fault) -> tuple[int, int, str, int, str]:
    return (f.onset, f.step, f.type, f.rank, f.layer or "")


def judged_dict(j: Judged) -> dict[str, Any]:
    """One checkpoint as ``GET /v1/runs/{run_id}/checkpoints`` shows it."""
    e = j.entry
    # The token is a write capability (records/tokens.py): its digest, never the token.
    return {"step": e.step, "path": e.path, "rank": e.rank, "time": e.time,
            "attempt": tokens.shown(e.token) if e.token is not None else str(e.attempt),
            "bytes": e.bytes,
            "tag": e.tag, "data_position": e.position, "status": j.status, "reason": j.reason}

