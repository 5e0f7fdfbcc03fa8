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
  until the history holding it is replaced (a rollback or restart): as pipeline/verdict.py
  argues, a resolved alert is not a recovery, and weights saved after the damage carry
  it. Any other page-worthy fault (a stall, memory pressure) is about the job, not the
  weights: it is in force from its onset to the step it was found at.
- Otherwise **clean**. The judgement is a function of the checkpoints and findings only,
  so it is redone whenever a finding arrives: a divergence found at 12050 with onset
  11900 makes the checkpoint at 12000 suspect after the fact.

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

from dataclasses import dataclass, field
from typing import Any, Literal

from monitor_agent.pipeline.verdict import CAUSES
from monitor_agent.records import wire
from monitor_agent.records.types import Finding, Severity
from monitor_agent.storage.store import Store

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
        """The fault a finding stands for, or None when it pages nobody."""
        if finding.log_only or not finding.severity.pages:
            return None
        return cls._build(finding.type, finding.rank, finding.step, finding.layer,
                          finding.evidence)

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> Fault | None:
        """The fault of a stored finding's JSON (``Finding.to_dict``)."""
        if data.get("log_only") or Severity.parse(data["severity"]) < Severity.ERROR:
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
    findings arrive. ``last_clean_step`` is a plain copy for the /metrics thread."""

    entries: dict[tuple[int, int], LedgerEntry] = field(default_factory=dict)
    faults: set[Fault] = field(default_factory=set)
    last_clean_step: int | None = None
    # Judged again only when an entry or a fault is added: every page's RunContext reads it.
    _judged: list[Judged] = field(default_factory=list, repr=False)

    @classmethod
    def load(cls, store: Store, run_id: str) -> CheckpointLedger:
        """The ledger of a run's current history, from the store."""
        ledger = cls()
        for c in store.checkpoints(run_id):
            ledger.entries[(c.step, c.attempt)] = LedgerEntry(
                c.step, c.path, c.rank, c.time, c.attempt, c.bytes, c.tag, c.token, c.position)
        for body in store.page_findings(run_id):
            fault = Fault.from_stored(wire.loads(body))
            if fault is not None:
                ledger.faults.add(fault)
        ledger._refresh()
        return ledger

    def add(self, entry: LedgerEntry) -> None:
        self.entries.setdefault((entry.step, entry.attempt), entry)
        self._refresh()

    def get(self, step: int, attempt: int) -> LedgerEntry | None:
        return self.entries.get((step, attempt))

    def observe(self, finding: Finding) -> bool:
        """Take a finding into account; True when it is a fault the ledger did not know."""
        fault = Fault.of(finding)
        if fault is None or fault in self.faults:
            return False
        self.faults.add(fault)
        self._refresh()
        return True

    def judged(self) -> list[Judged]:
        return list(self._judged)

    def clean(self) -> list[LedgerEntry]:
        """The clean checkpoints, oldest first."""
        return [j.entry for j in self._judged if j.status == "clean"]

    def last_clean(self) -> LedgerEntry | None:
        return next((j.entry for j in reversed(self._judged) if j.status == "clean"), None)

    def line(self) -> str | None:
        """What every page of the run says of it; None when the run reported no checkpoint."""
        if not self.entries:
            return None
        last = self.last_clean()
        if last is None:
            return "no clean checkpoint reported"
        return f"last clean checkpoint: step {last.step}, {last.path}"

    def _refresh(self) -> None:
        self._judged = judge(list(self.entries.values()), sorted(self.faults, key=_fault_order))
        last = self.last_clean()
        self.last_clean_step = None if last is None else last.step


def _fault_order(f: Fault) -> tuple[int, int, str, int, str]:
    return (f.onset, f.step, f.type, f.rank, f.layer or "")


def judged_dict(j: Judged) -> dict[str, Any]:
    """One checkpoint as ``GET /v1/runs/{run_id}/checkpoints`` shows it."""
    e = j.entry
    return {"step": e.step, "path": e.path, "rank": e.rank, "time": e.time,
            "attempt": e.token if e.token is not None else str(e.attempt), "bytes": e.bytes,
            "tag": e.tag, "data_position": e.position, "status": j.status, "reason": j.reason}

