"""What every detector class shares: record dispatch, per-rank state, repeat limiting,
finding construction and snapshot/restore.

A detector subclasses ``DetectorBase[ItsSettings]``, names its ``type``, its usual
``severity`` and its knobs (``settings_model``, a ``SharedSettings`` subclass whose fields
carry a description), declares its per-rank state as a dataclass returned by ``new_rank()``
(handed to ``on_step`` as ``st``) and implements ``on_step`` (and ``on_eval`` or ``tick``
when it needs them). Listing the class in ``DETECTOR_CLASSES`` (detectors/catalogue.py)
registers it, and ``DetectorSettings`` (detectors/settings.py) takes its settings model
from there.

A detector of a loss above a fixed limit, with no per-rank state, driven on its own; the
third step is still high but within ``repeat_every_steps`` of the first report::

    >>> class HighLossSettings(SharedSettings):
    ...     loss_limit: float = 10.0
    >>> class HighLossDetector(DetectorBase[HighLossSettings]):
    ...     type = "high_loss"
    ...     severity = Severity.WARNING
    ...     settings_model = HighLossSettings
    ...     def on_step(self, rec, st):
    ...         if not rec.loss or rec.loss <= self.settings.loss_limit or not self.due(rec):
    ...             return []
    ...         return [self.finding(rec, f"loss {fmt(rec.loss)} is high", value=rec.loss)]
    >>> settings = HighLossSettings(loss_limit=5.0)
    >>> det = HighLossDetector(settings, DetectorContext(settings))
    >>> steps = [StepRecord(run_id="r", step=s, time=s, loss=2.0 + 10 * (s > 1)) for s in (1, 2, 3)]
    >>> [(f.type, f.step, f.severity.label, f.message) for r in steps for f in det.update(r)]
    [('high_loss', 2, 'warning', 'loss 12 is high')]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from monitor_agent.detectors.support.context import DetectorContext
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.state import dump, load_into, plain
from monitor_agent.records.types import EvalRecord, Finding, Record, Severity, StepRecord


@dataclass(slots=True)
class Repeater:
    """Reports a condition when it starts and then at most every ``every`` units (steps,
    or seconds for clock checks) while it persists, per key (rank, layer)."""

    last: dict[str, float] = field(default_factory=dict)

    def due(self, key: str, at: float, every: float) -> bool:
        previous = self.last.get(key)
        if previous is not None and at - previous < every:
            return False
        self.last[key] = at
        return True


S = TypeVar("S", bound=SharedSettings)
SettingsModel = type[SharedSettings]  # named here: inside DetectorBase, ``type`` is its field


class DetectorBase(Generic[S]):
    """Dispatch, per-rank state and snapshot for one finding type (see module docstring)."""

    #: The finding type it raises, and the severity that type usually carries.
    type: ClassVar[str] = ""
    severity: ClassVar[Severity] = Severity.WARNING
    #: Its own knobs (a ``SharedSettings`` subclass); ``DetectorSettings`` extends it.
    settings_model: ClassVar[SettingsModel] = SharedSettings
    #: "rank": it judges each rank's own records, on the sidecar its rank reports to.
    #: "run": it judges the ranks against each other, so in a multi-node run only the
    #: run's leader, which hears every rank (monitor_agent/cluster), makes its findings.
    scope: ClassVar[str] = "rank"

    def __init__(self, settings: S, ctx: DetectorContext) -> None:
        self.settings = settings
        self.ctx = ctx
        self.ranks: dict[int, Any] = {}
        self.repeat = Repeater()

    # -- protocol -------------------------------------------------------------------------

    def update(self, record: Record) -> list[Finding]:
        if isinstance(record, StepRecord):
            return self.on_step(record, self._rank(record.rank))
        if isinstance(record, EvalRecord):
            return self.on_eval(record, self._rank(record.rank))
        return []

    def tick(self, now: float) -> list[Finding]:
        return []

    def snapshot(self) -> dict[str, Any]:
        return {
            "ranks": {str(r): dump(s) for r, s in self.ranks.items()},
            "repeat": dump(self.repeat),
            "extra": dump(self.snapshot_extra()),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.ranks = {int(r): load_into(self.new_rank(), s) for r, s in state["ranks"].items()}
        self.repeat = load_into(Repeater(), state.get("repeat", {}))
        self.restore_extra(plain(state.get("extra") or {}))

    # -- for subclasses ---------------------------------------------------------------------

    def new_rank(self) -> Any:
        return None

    def on_step(self, rec: StepRecord, st: Any) -> list[Finding]:
        return []

    def on_eval(self, rec: EvalRecord, st: Any) -> list[Finding]:
        return []

    def snapshot_extra(self) -> dict[str, Any]:
        return {}

    def restore_extra(self, data: dict[str, Any]) -> None:
        return None

    def _rank(self, rank: int) -> Any:
        st = self.ranks.get(rank)
        if st is None:
            st = self.ranks[rank] = self.new_rank()
        return st

    def due(self, rec: StepRecord | EvalRecord, layer: str | None = None) -> bool:
        """Whether a condition present at ``rec`` should be reported now (not spammed)."""
        key = f"{rec.rank}/{layer or ''}"
        return self.repeat.due(key, rec.step, self.settings.repeat_every_steps)

    def finding(
        self,
        rec: StepRecord | EvalRecord,
        message: str,
        *,
        value: float | None = None,
        threshold: float | None = None,
        evidence: dict[str, Any] | None = None,
        suggestions: tuple[str, ...] = (),
        layer: str | None = None,
        severity: Severity | None = None,
    ) -> Finding:
        return Finding(
            type=self.type,
            severity=severity if severity is not None else self.severity,
            run_id=rec.run_id,
            step=rec.step,
            rank=rec.rank,
            layer=layer,
            value=_num(value),
            threshold=_num(threshold),
            message=message,
            evidence={k: _num(v) for k, v in (evidence or {}).items()},
            suggestions=suggestions,
            time=rec.time,
        )


def _num(v: Any) -> Any:
    """numpy scalars to Python numbers, so findings serialise anywhere."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isfinite(v):
        return float(f"{v:.6g}")
    return v


def fmt(x: float | None) -> str:
    """A number for a one-line message: 4.26, 2.5e+11, 0.00012."""
    if x is None:
        return "n/a"
    return f"{x:.3g}"
