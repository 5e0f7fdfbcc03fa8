"""A run's verdict: healthy or unhealthy, from its own findings and records, with the cause
and the step it began.

A run is *unhealthy* once it has a finding of error severity or above of a type that says
the model itself went wrong (``CAUSES``: NaN/Inf, divergence, gradient explosion, blown-up
activations, a collapsed loss scale). Those pages resolve when the run ends or the findings
stop, but what they reported happened to the weights: a resolved alert is not a recovery,
so the verdict never goes back to healthy. Stalls, memory pressure, throughput and the
warnings are about the job or are not sure enough to judge a run by; they do not count.

A NaN is said the way it ended: ``NaN since step S`` when the run's latest step still has a
non-finite loss (S is where that unbroken stretch began), ``NaN at step S`` when later steps
were finite again. The other causes are named with the step of their first finding, and
with what the detectors saw behind it (``after LR x100 at step 300``, an ``lr_jump`` the
finding cites as its likely cause). The first cause (by step) is the verdict's ``cause``;
the text names it, then a NaN the run is still in, else the next cause.

``label`` is what ``training_run_info`` carries in its ``verdict`` label: ``healthy`` or
``unhealthy_<cause type>``, a closed set of ``len(CAUSES) + 1`` values (``LABELS``).

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
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from monitor_agent.records.types import Finding, Record, Severity, StepRecord

CAUSES: dict[str, str] = {
    "nan_inf": "NaN", "divergence": "divergence", "grad_explosion": "gradient explosion",
    "activation_blowup": "activation blow-up", "loss_scale_collapse": "loss-scale collapse",
}
"""Finding types that make a run unhealthy (at error severity or above), and their words."""

LABELS: tuple[str, ...] = ("healthy", *(f"unhealthy_{t}" for t in CAUSES))
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


@dataclass(slots=True)
class VerdictTracker:
    """A run's causes so far (see module docstring); snapshot with ``asdict``."""

    first: dict[str, int] = field(default_factory=dict)  # cause type -> first step
    behind: dict[str, str] = field(default_factory=dict)  # cause type -> its likely cause
    nan_since: int | None = None   # start of the current non-finite stretch, if any
    nan_ranks: list[int] = field(default_factory=list)  # ranks whose last loss is non-finite

    def observe(self, record: Record, findings: list[Finding]) -> bool:
        """Fold in one record and the findings the detectors made of it; True when that
        may have changed the verdict (a cause, or a NaN stretch began or ended)."""
        before = (len(self.first), self.nan_since)
        if isinstance(record, StepRecord) and record.loss is not None:
            bad = not math.isfinite(record.loss)
            if bad != (record.rank in self.nan_ranks):  # this rank's NaN stretch began/ended
                self._nan_rank(record, bad)
        for f in findings:
            if (f.type in CAUSES and f.severity >= Severity.ERROR and not f.log_only
                    and f.type not in self.first):
                self.first[f.type] = f.step
                cause = f.evidence.get("likely_cause")
                if isinstance(cause, str):  # "LR x100 at step 300: a -> b, ...": its name
                    self.behind[f.type] = cause.split(":")[0][:80]
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
        if not self.first:
            words = "healthy" if ended else "healthy so far"
            return Verdict("healthy", f"{status}, {words}" if ended else words, words=words)
        causes = sorted(self.first.items(), key=lambda kv: (kv[1], kv[0]))
        cause, step = causes[0]
        # The first cause, then a NaN the run is still in (how it ended), else the next one.
        second = [t for t, _ in causes[1:] if t == "nan_inf" and self.nan_since is not None]
        named = [cause, *(second or [t for t, _ in causes[1:2]])]
        words = "unhealthy: " + "; ".join(self._words(t, self.first[t]) for t in named)
        return Verdict("unhealthy", f"{status}, {words}" if ended else words, cause, step, words)

    def _words(self, cause: str, step: int) -> str:
        if cause == "nan_inf":
            if self.nan_since is not None:
                return f"NaN since step {self.nan_since}"
            return f"NaN at step {step}"
        behind = f" after {self.behind[cause]}" if cause in self.behind else ""
        return f"{CAUSES[cause]} at step {step}{behind}"

    def restore(self, data: dict[str, Any]) -> None:
        self.first = {str(k): int(v) for k, v in (data.get("first") or {}).items()}
        self.behind = {str(k): str(v) for k, v in (data.get("behind") or {}).items()}
        since = data.get("nan_since")
        self.nan_since = int(since) if since is not None else None
        self.nan_ranks = [int(r) for r in data.get("nan_ranks") or []]
