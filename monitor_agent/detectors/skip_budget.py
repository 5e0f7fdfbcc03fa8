"""``skip_budget``: the client's step guard skipped ``skip_budget_skips`` or more optimizer
steps within the last ``skip_budget_steps`` steps of one rank.

The guard (client ``watch(..., guard=True)``) skips a step whose gradient is non-finite or
a robust-sigma outlier and logs it with ``skipped`` and ``skip_reason``; one skip is the
guard doing its job and pages nobody. Repeated skipping is a broken run the guard is hiding
(bad data shard, an LR too high, a numerics bug), so past the budget a human is paged, with
the count, the reasons and the steps. GradScaler skips (``loss_scale``) are not counted:
they are the scaler's normal working, judged by ``loss_scale_collapse``.

Why 5 in 500 by default: at the guard's defaults a healthy run skips 0.33 steps per
10,000 (2 of the 61,267 healthy steps recorded in tests/traces, ``bench/guard_precision.py``),
so even 2 skips within 500 steps would be rare on a healthy run, and 5 (1%) is not chance:
something keeps producing bad batches or gradients. Only the guard's own skips count
(``GUARD_REASONS``): a step the trainer did not take for another reason is not its doing.

Three outlier skips and one NaN skip within 20 steps, against a budget of 4 in 20::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings(skip_budget_skips=4, skip_budget_steps=20))
    >>> bad = {5: "grad_norm_outlier", 9: "grad_norm_outlier", 12: "nonfinite_grad",
    ...        15: "grad_norm_outlier"}
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "loss": 2.0, **({"skipped": True, "skip_reason": bad[s]}
    ...                                        if s in bad else {})}) for s in range(1, 21)]
    >>> found = [f for rec in steps for f in suite.update(rec) if f.type == "skip_budget"]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('skip_budget', 15, 'error')]
    >>> print(found[0].message)
    the step guard skipped 4 of the last 20 steps (budget: 4 in 20): grad_norm_outlier x3,
    nonfinite_grad x1; steps 5, 9, 12, 15
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.records.types import GUARD_SKIP_REASONS, Finding, Severity, StepRecord

GUARD_REASONS = GUARD_SKIP_REASONS
SKIP_BUDGET = (
    "Look at the batches of the skipped steps: a corrupt shard or a bad sample repeating "
    "shows up as skips at a regular interval.",
    "Outlier skips that keep coming usually mean the learning rate is too high: lower it, "
    "or roll back to the last clean checkpoint.",
    "Non-finite skips point at numerics: check the loss for log/sqrt/division of zero, and "
    "the mixed-precision settings.",
)
_MAX_STEPS_LISTED = 20  # the message lists this many steps at most (the latest)


class SkipBudgetSettings(SharedSettings):
    """The knobs of ``skip_budget`` (``detectors:`` in the sidecar's config)."""

    skip_budget_skips: int = Field(
        default=5, ge=1,
        description="Step-guard skips within skip_budget_steps that page (the budget)."
    )
    skip_budget_steps: int = Field(
        default=500, ge=1, description="Optimizer steps the skip budget is counted over."
    )


@dataclass(slots=True)
class SkipState:
    steps: list[int] = field(default_factory=list)    # the guard's skips in the window
    reasons: list[str] = field(default_factory=list)


class SkipBudgetDetector(DetectorBase[SkipBudgetSettings]):
    """Error when the step guard skips too many steps in a window."""

    type = "skip_budget"
    severity = Severity.ERROR
    settings_model = SkipBudgetSettings

    def new_rank(self) -> SkipState:
        return SkipState()

    def on_step(self, rec: StepRecord, st: SkipState) -> list[Finding]:
        s = self.settings
        oldest = rec.step - s.skip_budget_steps  # steps after this one are in the window
        keep = [i for i, step in enumerate(st.steps) if oldest < step < rec.step]
        st.steps = [st.steps[i] for i in keep]
        st.reasons = [st.reasons[i] for i in keep]
        if not (rec.skipped and rec.skip_reason in GUARD_REASONS):
            return []
        st.steps.append(rec.step)
        st.reasons.append(str(rec.skip_reason))
        count = len(st.steps)
        if count < s.skip_budget_skips or not self.due(rec):
            return []
        by_reason = Counter(st.reasons).most_common()
        listed = st.steps[-_MAX_STEPS_LISTED:]
        more = "..., " if count > len(listed) else ""
        msg = (f"the step guard skipped {count} of the last {s.skip_budget_steps} steps "
               f"(budget: {s.skip_budget_skips} in {s.skip_budget_steps}): "
               + ", ".join(f"{reason} x{n}" for reason, n in by_reason)
               + f"; steps {more}{', '.join(map(str, listed))}")
        return [self.finding(rec, msg, value=count, threshold=s.skip_budget_skips,
                             evidence={"skips": count, "window_steps": s.skip_budget_steps,
                                       "by_reason": dict(by_reason), "steps": listed,
                                       "onset_step": st.steps[0]},
                             suggestions=SKIP_BUDGET)]
