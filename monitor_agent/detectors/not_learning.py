"""``not_learning``: the run stopped learning, shown by exact values, not by a trend.

Three signals, each stated in its own terms, where nothing is noise:

* **no gradient**: the global gradient norm is exactly 0 (every parameter's gradient is
  all zeros: a saturated sigmoid under ``BCELoss``, a one-column ``cross_entropy``, a
  loss cut from the graph);
* **no update**: the measured update norm is exactly 0 on weights that are not (the
  optimizer does not hold the parameters, ``optimizer.step()`` is never called, the lr is
  0); measured on the client's layer-statistics steps only, so the steps between them
  neither break nor extend the stretch;
* **zero loss**: a non-negative error (``loss_kind`` error, or nothing declared and never
  below zero) that is exactly 0 is at its minimum, where its gradient is 0 (a
  ``cross_entropy`` over one class is 0 whatever the model says); what a script that
  reports only its loss shows of a dead run;
* **constant**: the loss and the gradient norm are both the same to the last bit as at
  the step measured before (a loss that no batch changes, and a gradient that does not
  move with the data as every learning run's does). Judged on the client's
  layer-statistics steps only, where the gradient norm is the one the client measured
  from the gradients themselves: a value a script passes may be one it forgot to update
  or a running average it reports every N steps, and a loss alone that repeats is not
  enough for the same reason.

A learning run's loss and gradient norm change every step (each batch is another sample),
so an exact 0 or an exact repeat is not a small value that noise could produce: it is
evidence about the run, certain for that step. What a stretch of them must outlast is not
noise but the single batch that legitimately gives one (every sample masked, a loss at
its clamp on one batch). The stretch it takes is ``min_history_steps`` (20): the history
every other detector needs before it judges a run at all, so a run that has shown nothing
else for that long has shown no learning to judge. Loss-scaler overflow steps (nothing
updates there by design) and steps the client's step guard skipped are passed over: they
neither count nor break a stretch. ``dead_layer`` warns about one parameter; this is the
run, and it pages (error): the verdict says "stopped learning".

A one-column classifier under ``cross_entropy``: the loss is exactly 0 and so is every
gradient, from the first step::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "loss": 0.0, "grad_norm": 0.0}) for s in range(1, 31)]
    >>> found = [f for rec in steps for f in suite.update(rec) if f.type == "not_learning"]
    >>> [(f.step, f.severity.label) for f in found]
    [(20, 'error')]
    >>> print(found[0].message)
    the run stopped learning: the gradient norm is exactly 0 on every step since step 1 (20
    steps), and the loss is exactly 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import amp_overflow
from monitor_agent.records.types import Finding, Severity, StepRecord

NOT_LEARNING = (
    "An exactly zero gradient: check what cuts the loss from the weights (a saturated "
    "sigmoid under BCELoss - use BCEWithLogitsLoss -, a cross_entropy over one class, a "
    "detach(), a loss built from constants).",
    "Weights that do not move: check optimizer.step() is called, the optimizer holds the "
    "model's parameters, and the lr is not 0.",
    "A GAN or actor-critic whose gradient died after an lr change: roll back to a checkpoint "
    "from before it and lower the lr.",
)

SIGNALS = {
    "zero_grad": "the gradient norm is exactly 0",
    "zero_update": "the update norm is exactly 0 at every measured step",
    "zero_loss": "the loss is exactly 0, the minimum of an error, where its gradient is 0",
    "constant": "the loss and gradient norm are the same to the last bit",
}


@dataclass(slots=True)
class StretchState:
    """The first step of each signal's current unbroken stretch (-1: none), and the last
    step it was seen at: a stretch is as long as its signal was seen, not up to the latest
    step (a signal measured every 25 steps says nothing of the steps between: one measured
    zero update, at a warmup's lr of 0 on step 1, is one step of evidence, not 20)."""

    zero_grad: int = -1
    zero_update: int = -1
    zero_loss: int = -1
    constant: int = -1
    zero_grad_last: int = -1
    zero_update_last: int = -1
    zero_loss_last: int = -1
    constant_last: int = -1
    prev_loss: float | None = None
    prev_grad: float | None = None
    prev_step: int = -1


class NotLearningDetector(DetectorBase[SharedSettings]):
    """Error when exact zeros or exact repeats hold for ``min_history_steps`` steps."""

    type = "not_learning"
    severity = Severity.ERROR
    settings_model = SharedSettings

    def new_rank(self) -> StretchState:
        return StretchState()

    def on_step(self, rec: StepRecord, st: StretchState) -> list[Finding]:
        if amp_overflow(rec) or rec.guard_skipped:
            return []
        self._fold(rec, st)
        need = self.settings.min_history_steps
        held = [(name, getattr(st, f"{name}_last") - since + 1) for name in SIGNALS
                if (since := getattr(st, name)) >= 0]
        held = [(name, n) for name, n in held if n >= need]
        if not held or not self.due(rec):
            return []
        name, steps = max(held, key=lambda kv: kv[1])
        since = getattr(st, name)
        msg = f"the run stopped learning: {SIGNALS[name]} on every step since step {since} " \
              f"({steps} steps)"
        if name == "zero_update":
            msg = (f"the run stopped learning: {SIGNALS[name]} since step {since} ({steps} "
                   f"steps; lr {fmt(rec.lr)})")
        if name not in ("constant", "zero_loss") and 0 <= st.zero_loss <= since:
            msg += ", and the loss is exactly 0"
        elif name != "constant" and 0 <= st.constant <= since:
            msg += f", and the loss is {fmt(rec.loss)} to the last bit"
        evidence = {"signal": name, "since_step": since, "onset_step": since, "steps": steps,
                    "loss": rec.loss, "grad_norm": rec.grad_norm,
                    "update_norm": rec.update_norm, "lr": rec.lr,
                    "signals": sorted(n for n, _ in held)}
        return [self.finding(rec, msg, value=float(steps), threshold=float(need),
                             evidence=evidence, suggestions=NOT_LEARNING)]

    def _fold(self, rec: StepRecord, st: StretchState) -> None:
        """Extend or break each signal's stretch with this step's exact values."""
        grad, loss, step = rec.grad_norm, rec.loss, rec.step
        if grad is not None and math.isfinite(grad):
            st.zero_grad, st.zero_grad_last = _extend(
                st.zero_grad, step, step, grad == 0.0)
        if rec.update_norm is not None and rec.param_norm:
            st.zero_update, st.zero_update_last = _extend(
                st.zero_update, step, step, rec.update_norm == 0.0)
        finite = loss is not None and math.isfinite(loss)
        if finite and self.ctx.loss_kind(rec.rank) == "error":
            st.zero_loss, st.zero_loss_last = _extend(st.zero_loss, step, step, loss == 0.0)
        if finite and rec.layers is not None:
            same = (st.prev_loss is not None and loss == st.prev_loss
                    and grad is not None and grad == st.prev_grad)
            # the first step of a repeat is the one repeated: it began the constant stretch
            st.constant, st.constant_last = _extend(st.constant, st.prev_step, step, same)
            st.prev_loss, st.prev_grad, st.prev_step = loss, grad, step


def _extend(since: int, begins: int, step: int, dead: bool) -> tuple[int, int]:
    """The stretch's first step and the last step it was seen at, after ``step``: kept
    (and seen at ``step``), begun at ``begins``, or broken (-1, -1)."""
    if not dead:
        return -1, -1
    return (since if since >= 0 else begins), step
