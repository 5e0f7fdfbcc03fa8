"""``plateau``: the loss flat for a long window, or the val loss without a new best for
``plateau_evals`` evaluations.

Training loss (warning): the median of the last quarter of a ``plateau_window``-step
window against the median of its first quarter; improvement below
``plateau_min_improvement`` (relative) is flat, and when the loss has also not improved
since the run's first steps the run is not learning. A flat stretch after progress is
normal (the tail of a decaying schedule) and is judged on the val loss instead (info): no
new best for ``plateau_evals`` evaluations. The training-loss rule judges only a loss of
kind ``error`` (``DetectorContext.level_units`` is ``"log"``, ``support/context.py``): a loss
that goes below zero, or one declared ``nonstationary``, has no stable level at all, and one
declared ``signed`` has no zero a relative improvement is a fraction of.

A loss that barely moves from 4.6 from the first step: once the window is full, not learning::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "loss": 4.6 - 0.0001 * s}) for s in range(1, 251)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('plateau', 200, 'warning')]
    >>> print(found[0].message)
    loss flat over the last 200 steps: median 4.6 -> 4.58 (-0.3%, limit 1%), and 4.6 at the
    start: the run is not learning
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.advice import STOP_EARLY
from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, finite, median
from monitor_agent.records.types import EvalRecord, Finding, Severity, StepRecord

PLATEAU = (
    "The loss is flat: raise the learning rate if it is tiny, or check the schedule.",
    "Check the data pipeline (same batch repeated, labels shuffled) and that gradients flow.",
    "If it improved before, the model may be at capacity: a bigger model or more data.",
)

PLATEAU_LR_RAISED = (
    "The learning rate was raised within this window and the loss still did not move: check "
    "that the optimizer steps the parameters (frozen or detached parameters, the LR set on "
    "the wrong param group, a scheduler overriding it).",
    "Check the data pipeline (same batch repeated, labels shuffled) and that gradients flow.",
)


class PlateauSettings(SharedSettings):
    """The knobs of ``plateau`` (``detectors:`` in the sidecar's config)."""

    plateau_window: int = Field(
        default=200, ge=20, description="Steps over which the loss must improve (plateau)."
    )
    plateau_min_improvement: float = Field(
        default=0.01, ge=0,
        description="Relative loss improvement over the window below which it is flat.",
    )
    plateau_evals: int = Field(
        default=5, ge=2, description="Evals without a new best val loss that make a plateau."
    )


@dataclass(slots=True)
class PlateauState:
    losses: Window
    lrs: Window
    first: list[float] = field(default_factory=list)
    best_val: float | None = None
    evals_since_best: int = 0


class PlateauDetector(DetectorBase[PlateauSettings]):
    """Warning (never learnt) or info (stalled progress) on a flat loss."""

    type = "plateau"
    severity = Severity.WARNING
    settings_model = PlateauSettings

    def new_rank(self) -> PlateauState:
        w = self.settings.plateau_window
        return PlateauState(losses=Window.of(w), lrs=Window.of(w))

    def on_step(self, rec: StepRecord, st: PlateauState) -> list[Finding]:
        if not finite(rec.loss) or self.ctx.level_units(rec.rank) != "log":
            return []  # flat "as a fraction of its level": only an error from zero has one
        if len(st.first) < self.settings.min_history_steps:
            st.first.append(rec.loss)
        st.losses.add(rec.loss)
        st.lrs.add(rec.lr if finite(rec.lr) else np.nan)
        if not st.losses.full or self.ctx.in_warmup(rec.step):
            return []
        values = st.losses.values()
        q = len(values) // 4
        before, now = median(values[:q]), median(values[-q:])
        gain = (before - now) / max(abs(before), 1e-12)
        start = median(np.asarray(st.first))
        since_start = (start - now) / max(abs(start), 1e-12)
        # A flat stretch after real progress is normal (the tail of a decaying schedule);
        # its val-loss side is judged per eval. Flat since the first steps is not learning.
        never = since_start < 2 * self.settings.plateau_min_improvement
        # Flat both ways: a loss that rose by more than the limit is not a plateau (it is
        # divergence's to judge), whatever its sign says about improvement.
        flat = abs(gain) < self.settings.plateau_min_improvement
        if not flat or not never or not self.due(rec):
            return []
        return [self._finding(rec, st, before, now, gain, start)]

    def _finding(self, rec: StepRecord, st: PlateauState, before: float, now: float,
                 gain: float, start: float) -> Finding:
        n = self.settings.plateau_window
        msg = (f"loss flat over the last {n} steps: median {fmt(before)} -> {fmt(now)} "
               f"({now / before - 1:+.1%}, limit {self.settings.plateau_min_improvement:.0%}), "
               f"and {fmt(start)} at the start: the run is not learning")
        lr_then = float(st.lrs.values()[0])
        raised = finite(rec.lr) and np.isfinite(lr_then) and lr_then > 0 and \
            rec.lr >= 2 * lr_then
        evidence = {"before": before, "now": now, "improvement": gain, "start": start,
                    "lr": rec.lr, "lr_window_start": lr_then if np.isfinite(lr_then) else None}
        return self.finding(rec, msg, value=gain, threshold=self.settings.plateau_min_improvement,
                            evidence=evidence,
                            suggestions=PLATEAU_LR_RAISED if raised else PLATEAU,
                            severity=Severity.WARNING)

    def on_eval(self, rec: EvalRecord, st: PlateauState) -> list[Finding]:
        if not finite(rec.val_loss):
            return []
        if st.best_val is None or rec.val_loss < st.best_val:
            st.best_val, st.evals_since_best = rec.val_loss, 0
            return []
        st.evals_since_best += 1
        if st.evals_since_best < self.settings.plateau_evals or not self.due(rec):
            return []
        msg = (f"val loss {fmt(rec.val_loss)} has not beaten its best {fmt(st.best_val)} "
               f"for {st.evals_since_best} evals")
        evidence = {"val_loss": rec.val_loss, "best_val": st.best_val,
                    "evals_since_best": st.evals_since_best}
        return [self.finding(rec, msg, value=rec.val_loss, threshold=st.best_val,
                             evidence=evidence, suggestions=PLATEAU + (STOP_EARLY,),
                             severity=Severity.INFO)]
