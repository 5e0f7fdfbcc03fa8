"""``overfitting``: val loss rising while train loss falls, or a wide train-val gap once
val loss stops improving (post-eval analysis).

On every eval: the gap ``(val - train) / train`` is banded (mild from
``overfit_gap_mild``, high from ``overfit_gap_high``) and the val loss is compared with its
best so far. Fires when val is ``overfit_val_rise`` above its best while train loss kept
falling and the gap is at least mild, on ``overfit_evals`` evals in a row, or when the gap
is high and val has not improved for ``overfit_evals`` evals. The train loss
is the eval record's ``train_loss``, else the rank's loss EMA. A gap and a rise are
fractions of a positive train loss: judged only for a loss of kind ``error``
(``DetectorContext.level_units`` is ``"log"``, ``support/context.py``), not one that went below zero (a fraction of a level near zero is
any number) nor one declared ``nonstationary`` (its val loss moves with its target).

Three evals: the val loss rises from its best of 2.6 on two in a row while train keeps falling::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> evals = [parse_record({"kind": "eval", "run_id": "r", "step": s, "time": s,
    ...                        "val_loss": val, "train_loss": train})
    ...          for s, val, train in [(100, 2.6, 2.5), (200, 2.9, 2.1), (300, 3.0, 2.0)]]
    >>> found = [f for rec in evals for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('overfitting', 300, 'warning')]
    >>> print(found[0].message)
    val loss 3 is +15% above its best 2.6 (step 100) for 2 evals while train loss went 2.5 -> 2;
    train-val gap 50% (high)
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, model_validator

from monitor_agent.detectors.support.advice import STOP_EARLY
from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import finite
from monitor_agent.records.types import EvalRecord, Finding, Severity

OVERFITTING = (
    STOP_EARLY,
    "Add regularisation: weight decay, dropout, data augmentation; or get more data.",
    "Reduce model size or the number of epochs.",
)


class OverfittingSettings(SharedSettings):
    """The knobs of ``overfitting`` (``detectors:`` in the sidecar's config)."""

    overfit_val_rise: float = Field(
        default=0.1, gt=0, description="Val loss this fraction above its best, train still falling."
    )
    overfit_evals: int = Field(
        default=2, ge=1, description="Evals in a row a rising val loss / stalled val must hold."
    )
    overfit_gap_mild: float = Field(
        default=0.1, gt=0, description="(val - train) / train from which the gap is reported mild."
    )
    overfit_gap_high: float = Field(
        default=0.3, gt=0, description="(val - train) / train that is overfitting once val stalls."
    )

    @model_validator(mode="after")
    def _gap_levels_ordered(self) -> OverfittingSettings:
        if self.overfit_gap_high < self.overfit_gap_mild:
            raise ValueError("overfit_gap_high must be >= overfit_gap_mild")
        return self


@dataclass(slots=True)
class OverfitState:
    best_val: float | None = None
    best_step: int = -1
    train_at_best: float | None = None
    evals_since_best: int = 0
    evals_above: int = 0


class OverfittingDetector(DetectorBase[OverfittingSettings]):
    """Warning on val rising while train falls, or a high gap with stalled val."""

    type = "overfitting"
    severity = Severity.WARNING
    settings_model = OverfittingSettings

    def new_rank(self) -> OverfitState:
        return OverfitState()

    def on_eval(self, rec: EvalRecord, st: OverfitState) -> list[Finding]:
        train = rec.train_loss if finite(rec.train_loss) else self.ctx.ema_loss(rec.rank)
        if (not finite(rec.val_loss) or not finite(train) or train <= 0
                or self.ctx.level_units(rec.rank) != "log"):
            return []
        if st.best_val is None or rec.val_loss < st.best_val:
            st.best_val, st.best_step, st.train_at_best = rec.val_loss, rec.step, train
            st.evals_since_best = st.evals_above = 0
            return []
        st.evals_since_best += 1
        rise = rec.val_loss / st.best_val - 1.0
        gap = (rec.val_loss - train) / train
        s = self.settings
        # Val rising without a train-val gap is noise or instability, not overfitting; one
        # noisy eval above a lucky best is not a trend, so it must hold for a few evals.
        above = (rise >= s.overfit_val_rise and train < (st.train_at_best or train)
                 and gap >= s.overfit_gap_mild)
        st.evals_above = st.evals_above + 1 if above else 0
        diverging = st.evals_above >= s.overfit_evals
        wide = gap >= s.overfit_gap_high and st.evals_since_best >= s.overfit_evals
        if not (diverging or wide) or not self.due(rec):
            return []
        return [self._finding(rec, st, train, rise, gap, "val_rising" if diverging else "gap")]

    def _finding(self, rec: EvalRecord, st: OverfitState, train: float, rise: float,
                 gap: float, rule: str) -> Finding:
        s = self.settings
        band = "high" if gap >= s.overfit_gap_high else "mild" if gap >= s.overfit_gap_mild else "low"
        if rule == "val_rising":
            head = (f"val loss {fmt(rec.val_loss)} is {rise:+.0%} above its best "
                    f"{fmt(st.best_val)} (step {st.best_step}) for {st.evals_above} evals")
        else:
            head = (f"val loss {fmt(rec.val_loss)} has not beaten its best {fmt(st.best_val)} "
                    f"(step {st.best_step}) for {st.evals_since_best} evals")
        msg = (f"{head} while train loss went {fmt(st.train_at_best)} -> {fmt(train)}; "
               f"train-val gap {gap:.0%} ({band})")
        evidence = {"rule": rule, "val_loss": rec.val_loss, "train_loss": train,
                    "best_val": st.best_val, "best_step": st.best_step, "val_rise": rise,
                    "gap": gap, "gap_band": band, "evals_since_best": st.evals_since_best,
                    "evals_above": st.evals_above}
        return self.finding(rec, msg, value=rec.val_loss, threshold=st.best_val,
                            evidence=evidence, suggestions=OVERFITTING)
