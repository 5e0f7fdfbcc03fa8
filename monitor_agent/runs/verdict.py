"""A run's verdict: healthy or unhealthy, from its own findings and records, with the cause
and the step it began.

A run is *unhealthy* once it has a finding of error severity or above of a type that says
the model itself went wrong (``CAUSES``: NaN/Inf, divergence, gradient explosion, blown-up
activations, a collapsed loss scale, a run that stopped learning (exact zero gradients or
updates), or data a rollback skipped trained again after it: the weights then saw what the
rollback was for). Those pages resolve when the run ends or the findings
stop, but what they reported happened to the weights: a resolved alert is not a recovery,
so the verdict never goes back to healthy. A run whose process died of an exception
(``crashed``, ``ENDINGS``) is unhealthy too, though its weights are not damaged by it: it
did not finish, and a resume from a checkpoint taken at or after its last step (a later
attempt) overcomes it. Stalls, memory pressure, throughput and the warnings are about the
job or are not sure enough to judge a run by; they do not count.

A NaN is said the way it ended: ``NaN since step S`` when the run's latest step still has a
non-finite loss (S is where that unbroken stretch began), ``NaN at step S`` when later steps
were finite again. The other causes are named with the step of their first finding, and
with what the detectors saw behind it (``after LR x100 at step 300``, an ``lr_jump`` the
finding cites as its likely cause). The first cause (by step) is the verdict's ``cause``;
the text names it, then a NaN the run is still in, else the next cause.

``label`` is what ``training_run_info`` carries in its ``verdict`` label: ``healthy`` or
``unhealthy_<cause type>``, a closed set of ``len(JUDGED) + 1`` values (``LABELS``).

One definition, used everywhere the verdict shows: ``GET /v1/runs`` and ``/v1/runs/{id}``,
the runs page and the run page's header, ``/metrics`` and the message that resolves a run's
alerts when it ends. The engine keeps one ``VerdictTracker`` per run (in ``RunState``),
snapshots it with the run and stores each new verdict on the run's row, so a restart or the
run leaving memory changes nothing.

A run whose loss goes NaN at step 300 and stays so to its end at step 600::

    >>> from monitor_agent.records.types import Finding, Severity, StepRecord
    >>> tracker = VerdictTracker()
    >>> for s in (299, 300, 301, 600):
    ...     rec = StepRecord(run_id="r", step=s, time=s, loss=2.0 if s < 300 else float("nan"))
    ...     found = [Finding("nan_inf", Severity.CRITICAL, "r", s, "loss is nan")] if s == 300 else []
    ...     _ = tracker.observe(rec, found)
    >>> print(tracker.verdict("running").text)
    unhealthy: NaN since step 300
    >>> v = tracker.verdict("completed")
    >>> v.state, v.label, v.text
    ('unhealthy', 'unhealthy_nan_inf', 'completed, unhealthy: NaN since step 300')
    >>> "run ended " + v.words   # how the message resolving its alerts puts it
    'run ended unhealthy: NaN since step 300'
    >>> VerdictTracker().verdict("running").text, VerdictTracker().verdict("completed").text
    ('healthy so far', 'completed, healthy')

A run is judged on its current history (pipeline/attempts.py): a rollback (a resumed
attempt that replaced steps, e.g. the closed loop's rollback to a clean checkpoint) rebuilds
the tracker at the checkpoint's step, so a fault on the abandoned steps no longer counts.
It is not forgotten either: ``rollbacks`` (read from the store each time the run is loaded,
``rollbacks_of``, so a restart says the same) puts it after the verdict::

    >>> healed = VerdictTracker(rollbacks=[Rollback(to_step=1100, abandoned=(
    ...     ("divergence", 1205),))])
    >>> print(healed.verdict("completed").text)
    completed, healthy (rolled back once: divergence at step 1205 abandoned)

A resume that applied no rollback plan is said as what it was (runs/lifecycle.py)::

    >>> print(VerdictTracker(rollbacks=[Rollback(to_step=300, kind="crash")]).verdict(
    ...     "completed").text)
    completed, healthy (resumed after a crash once)

A run that died of an exception after step 59, and the same run resumed from its
checkpoint at step 59, which then completed::

    >>> crash = Finding("crashed", Severity.ERROR, "r", 59, "the run crashed",
    ...                 evidence={"exception": "RuntimeError"})
    >>> tracker = VerdictTracker()
    >>> _ = tracker.observe(None, [crash])
    >>> print(tracker.verdict("failed").text)
    failed, unhealthy: crashed after step 59 (RuntimeError)
    >>> tracker.rollbacks = [Rollback(to_step=59, kind="crash")]
    >>> print(tracker.verdict("completed").text)
    completed, healthy (resumed after a crash once)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from monitor_agent.records.types import Finding, Record, Severity, StepRecord
from monitor_agent.storage.store import StoredAttempt

CAUSES: dict[str, str] = {
    "nan_inf": "NaN", "divergence": "divergence", "grad_explosion": "gradient explosion",
    "activation_blowup": "activation blow-up", "loss_scale_collapse": "loss-scale collapse",
    "window_trained": "skipped data trained again", "not_learning": "stopped learning",
}
"""Finding types that make a run unhealthy (at error severity or above) because the weights
went wrong (the checkpoint ledger holds every checkpoint after one's onset suspect), and
their words."""

ENDINGS: dict[str, str] = {"crashed": "crashed"}
"""Finding types that make a run unhealthy by how its process ended, not by its weights."""

JUDGED: dict[str, str] = {**CAUSES, **ENDINGS}

LABELS: tuple[str, ...] = ("healthy", *(f"unhealthy_{t}" for t in JUDGED))
"""Every value of ``training_run_info``'s ``verdict`` label."""

VerdictState = Literal["healthy", "unhealthy"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a run's findings say of it; ``text`` is what people read."""

    state: VerdictState = field(metadata={"description": "healthy or unhealthy."})
    text: str = field(metadata={"description": (
        "E.g. 'healthy so far', 'completed, unhealthy: NaN since step 300'.")})
    cause: str | None = field(default=None, metadata={
        "description": "The finding type of the first cause; null when healthy."})
    step: int | None = field(default=None, metadata={
        "description": "The step the first cause began at; null when healthy."})
    words: str = field(default="", metadata={"description": (
        "The text without the run's status: what 'run ended ...' is followed by.")})

    @property
    def label(self) -> str:
        return "healthy" if self.cause is None else f"unhealthy_{self.cause}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | None) -> Verdict | None:
        """A stored verdict back; None for a run stored before verdicts were."""
        if not text:
            return None
        data = json.loads(text)
        return cls(state=data["state"], text=data["text"], cause=data.get("cause"),
                   step=data.get("step"), words=data.get("words") or data["text"])


@dataclass(frozen=True, slots=True)
class Rollback:
    """A resumed attempt that replaced steps: the run went back to ``to_step`` (its next
    step was ``to_step + 1``) and gave up the steps after it; ``abandoned``: the first step
    of each cause (``CAUSES``) found on those steps, by step. ``kind``: ``rollback`` (it
    applied a rollback plan), ``crash`` (a relaunch after the process died or failed) or
    ``resume`` (from a checkpoint after a clean end; runs/lifecycle.py ``resume_kind``)."""

    to_step: int
    abandoned: tuple[tuple[str, int], ...] = ()
    kind: str = "rollback"


def rollbacks_of(attempts: list[StoredAttempt], abandoned: list[dict[str, Any]],
                 kind_of: Callable[[StoredAttempt], str] | None = None) -> list[Rollback]:
    """The run's rollbacks since it last started over, from its attempts and the findings
    about replaced steps (``Store.abandoned_findings``); each finding counts for the first
    resumed attempt that replaced its step. A restart (a new run reusing the id) replaced
    the whole history: what came before it is another run's, not a rollback of this one."""
    restart = max((a.number for a in attempts if a.kind == "restarted"), default=0)
    resumed = [a for a in attempts if a.number > restart and a.kind == "resumed"
               and a.superseded_from is not None and a.start_step is not None]
    found: dict[int, dict[str, int]] = {a.number: {} for a in resumed}
    for f in abandoned:
        if f.get("type") not in CAUSES or f.get("log_only") or int(f.get("attempt", 1)) < restart:
            continue
        step = int(f["step"])
        by = next((a for a in resumed if a.number > int(f.get("attempt", 1))
                   and a.start_step is not None and a.start_step <= step), None)
        if by is not None:
            first = found[by.number]
            first[f["type"]] = min(step, first.get(f["type"], step))
    return [Rollback(a.start_step - 1, tuple(sorted(found[a.number].items(),
                                                    key=lambda kv: (kv[1], kv[0]))),
                     kind_of(a) if kind_of is not None else "rollback")
            for a in resumed if a.start_step is not None]


@dataclass(slots=True)
class VerdictTracker:
    """A run's causes so far (see module docstring); snapshot with ``asdict``."""

    first: dict[str, int] = field(default_factory=dict)  # cause type -> first step
    behind: dict[str, str] = field(default_factory=dict)  # cause type -> its likely cause
    nan_since: int | None = None   # start of the current non-finite stretch, if any
    nan_ranks: list[int] = field(default_factory=list)  # ranks whose last loss is non-finite
    # Derived from the store on every load (``rollbacks_of``), not from a snapshot: a
    # rollback settles in the store before any snapshot can hold it.
    rollbacks: list[Rollback] = field(default_factory=list)

    def observe(self, record: Record | None, findings: list[Finding]) -> bool:
        """Fold in one record and the findings the detectors made of it (``record`` None:
        findings a node sidecar made of its ranks, for this run leader); True when that
        may have changed the verdict (a cause, or a NaN stretch began or ended)."""
        before = (len(self.first), self.nan_since)
        if isinstance(record, StepRecord) and record.loss is not None and not record.guard_skipped:
            bad = not math.isfinite(record.loss)
            if bad != (record.rank in self.nan_ranks):  # this rank's NaN stretch began/ended
                self._nan_rank(record, bad)
        for f in findings:
            if (f.type in JUDGED and f.severity >= Severity.ERROR and not f.log_only
                    and f.type not in self.first):
                since = f.evidence.get("since_step")  # not_learning: dead from there on
                self.first[f.type] = since if isinstance(since, int) else f.step
                cause = f.evidence.get("likely_cause")
                exception = f.evidence.get("exception")
                if isinstance(cause, str):  # "LR x100 at step 300: a -> b, ...": its name
                    self.behind[f.type] = cause.split(":")[0][:80]
                elif isinstance(exception, str):  # crashed: "RuntimeError"
                    self.behind[f.type] = exception[:80]
        return (len(self.first), self.nan_since) != before

    def _nan_rank(self, record: StepRecord, bad: bool) -> None:
        ranks = set(self.nan_ranks)
        if bad:
            if not ranks:
                self.nan_since = record.step
            ranks.add(record.rank)
        else:
            ranks.discard(record.rank)
            if not ranks:
                self.nan_since = None
        self.nan_ranks = sorted(ranks)

    def verdict(self, status: str) -> Verdict:
        """The verdict for a run in ``status`` (running, completed, failed, stopped)."""
        ended = status != "running"
        first = self._standing()
        if not first:
            words = ("healthy" if ended else "healthy so far") + self._rolled_back()
            return Verdict("healthy", f"{status}, {words}" if ended else words, words=words)
        causes = sorted(first.items(), key=lambda kv: (kv[1], kv[0]))
        cause, step = causes[0]
        # The first cause, then a NaN the run is still in (how it ended), else the next one.
        second = [t for t, _ in causes[1:] if t == "nan_inf" and self.nan_since is not None]
        named = [cause, *(second or [t for t, _ in causes[1:2]])]
        words = "unhealthy: " + "; ".join(self._words(t, first[t]) for t in named)
        words += self._rolled_back()
        return Verdict("unhealthy", f"{status}, {words}" if ended else words, cause, step, words)

    def _standing(self) -> dict[str, int]:
        """The causes that still hold: a crash that a later attempt resumed past (from a
        checkpoint at or after the crash's last step) is over; the resume says it."""
        return {t: s for t, s in self.first.items()
                if t not in ENDINGS or not any(r.to_step >= s for r in self.rollbacks)}

    def _rolled_back(self) -> str:
        """`` (rolled back twice: divergence at step 1205 abandoned; resumed after a crash
        once)``, or nothing."""
        parts = []
        for kind, said in (("rollback", "rolled back"), ("crash", "resumed after a crash"),
                           ("resume", "resumed from a checkpoint")):
            these = [r for r in self.rollbacks if r.kind == kind]
            if not these:
                continue
            n = len(these)
            times = {1: "once", 2: "twice"}.get(n, f"{n} times")
            gone = [f"{CAUSES.get(t, t)} at step {s}" for r in these for t, s in r.abandoned[:1]]
            parts.append(f"{said} {times}" + (f": {'; '.join(gone)} abandoned" if gone else ""))
        return f" ({'; '.join(parts)})" if parts else ""

    def _words(self, cause: str, step: int) -> str:
        if cause == "nan_inf":
            if self.nan_since is not None:
                return f"NaN since step {self.nan_since}"
            return f"NaN at step {step}"
        if cause in ENDINGS:
            what = f" ({self.behind[cause]})" if cause in self.behind else ""
            return f"{ENDINGS[cause]} after step {step}{what}"
        behind = f" after {self.behind[cause]}" if cause in self.behind else ""
        return f"{CAUSES[cause]} at step {step}{behind}"

    def restore(self, data: dict[str, Any]) -> None:
        self.first = {str(k): int(v) for k, v in (data.get("first") or {}).items()}
        self.behind = {str(k): str(v) for k, v in (data.get("behind") or {}).items()}
        since = data.get("nan_since")
        self.nan_since = int(since) if since is not None else None
        self.nan_ranks = [int(r) for r in data.get("nan_ranks") or []]
