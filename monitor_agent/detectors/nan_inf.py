"""``nan_inf``: the loss, the gradient norm or a parameter statistic is NaN or infinite.

Mixed precision is respected: on a step the loss scaler skipped (``skipped`` or a finite
loss with an infinite gradient under a loss scale) the non-finite gradient is the scaler
working, not a fault. The suggestion depends on what preceded the NaN.

The finding names where it started, so the fix can start there:

* forward pass (the loss is non-finite): a NaN born in the forward pass poisons every
  gradient, so the gradients cannot say where; the client's per-module output check
  (``nonfinite_modules``, forward order) can: the first module listed is named.
* the loss computation (the loss is non-finite, the client checked every module output,
  ``nonfinite_module_count`` 0, and all were finite): the NaN is made after the last
  module, in the loss arithmetic; origin ``loss``, pass ``loss``. Only a step with no
  ``nonfinite_module_count`` at all is said to have had no per-module check.
* backward pass (the loss is finite, gradients are not): a NaN born in the backward pass
  reaches the parameters on the input side of where it appeared and leaves the output
  side finite, so the first non-finite gradient in backward order (output side first, the
  run's ``layer_order`` reversed) is named, with how many parameters are non-finite. The
  per-parameter norms come from a monitored step's ``layers`` or, on any other step, from
  ``grad_norms``, which the client sends whenever the global norm is non-finite.
* a step the loss scaler skipped pages nothing; its origin (from the unscaled gradients)
  is kept and shown as ``last_overflow_origin`` in the next finding's evidence.

``non_finite_fields`` is the rule itself, a pure function of one record: the detector
applies it to every step in order, and the sidecar's preview route (api/preview.py)
applies it, via ``NanInfDetector.preview``, to a NaN step that arrives ahead of its
backlog, so the page need not wait for the history to be replayed.

A NaN loss at step 3 whose forward pass first went non-finite in ``h.2.attn``::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> nan = {"loss": "NaN", "nonfinite_modules": ["h.2.attn", "h.2.mlp"],
    ...        "nonfinite_module_count": 2}
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        **(nan if s == 3 else {"loss": 2.0})}) for s in (1, 2, 3)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label, f.evidence["origin"]) for f in found]
    [('nan_inf', 3, 'critical', 'h.2.attn')]
    >>> print(found[0].message)
    loss is nan; forward pass: the output of h.2.attn went non-finite first, 2 module outputs
    non-finite in all at step 3
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.nonfinite import nonfinite_mask, nonfinite_params
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, amp_overflow, finite
from monitor_agent.records.types import EvalRecord, Finding, Severity, StepRecord

_GLOBAL_FIELDS = ("loss", "grad_norm", "param_norm", "update_norm")
NAN_AT_START = (
    "Inspect the input data: a NaN/inf in the first steps usually comes from the batch "
    "(bad values, division by zero in preprocessing, empty sequences).",
    "Check the initialisation and any log/sqrt/division in the loss for zero or negative inputs.",
    "Run a few steps with torch.autograd.set_detect_anomaly(True) to find the first bad op.",
)

NAN_AFTER_GROWTH = (
    "The gradient norm climbed before the NaN: lower the learning rate (2-10x) or lengthen warmup.",
    "Enable or tighten gradient clipping (clip_grad_norm_ 1.0).",
    "Restart from the last good checkpoint rather than continuing.",
)

NAN_SUDDEN = (
    "A NaN with no warning sign usually means one bad batch: inspect the batch of this step "
    "and skip or filter non-finite inputs.",
    "Guard the loss with torch.isfinite before backward() and skip the step.",
    "Run with torch.autograd.set_detect_anomaly(True) to find the op that produced it.",
)

NAN_FP16 = (
    "fp16 overflow: switch autocast to bfloat16 (same range as float32).",
    "Lower the learning rate; check the GradScaler is stepping and updating.",
)


class NanInfSettings(SharedSettings):
    """The knobs of ``nan_inf`` (``detectors:`` in the sidecar's config)."""

    nan_persist_steps: int = Field(
        default=3, ge=2,
        description="nan_inf reports again when non-finite this many steps in a row (what a "
        "rule's action_after: 2 acts on).",
    )


@dataclass(slots=True)
class NanState:
    grads: Window = field(default_factory=lambda: Window.of(50))
    streak: int = 0  # consecutive steps with a non-finite value
    overflow_origin: str | None = None  # first non-finite unscaled grad of the last skip


def non_finite_fields(rec: StepRecord) -> list[str]:
    """The global fields that make ``rec`` a nan_inf finding. On an AMP overflow step only
    a non-finite loss counts: inf gradients are the loss scaler working."""
    bad = [f for f in _GLOBAL_FIELDS if _nonfinite(getattr(rec, f))]
    return [f for f in bad if f == "loss"] if amp_overflow(rec) else bad


class NanInfDetector(DetectorBase[NanInfSettings]):
    """Critical finding on the first non-finite value, then at most every N steps.

    One more when the run is still non-finite ``nan_persist_steps`` steps in a row: that
    second finding is what a rule's ``action: stop, action_after: 2`` waits for, so one
    bad batch that the run recovers from does not stop it.
    """

    type = "nan_inf"
    severity = Severity.CRITICAL
    settings_model = NanInfSettings

    def new_rank(self) -> NanState:
        return NanState()

    def on_step(self, rec: StepRecord, st: NanState) -> list[Finding]:
        bad = non_finite_fields(rec)
        layers = self._bad_layers(rec)
        if amp_overflow(rec):
            if layers:
                st.overflow_origin = layers[0]
            layers = layers if bad else []
        if not bad and not layers:
            st.streak = 0
            if finite(rec.grad_norm) and rec.grad_norm > 0:
                st.grads.add(math.log(rec.grad_norm))
            return []
        st.streak += 1
        persisting = st.streak == self.settings.nan_persist_steps
        if not persisting and not self.due(rec):  # the milestone leaves the repeat clock be
            return []
        return [self._finding(rec, st, bad, layers)]

    def preview(self, rec: StepRecord) -> Finding | None:
        """The finding ``rec`` would bring were it the rank's next step, changing no state
        (neither the streak, nor the repeat clock, nor the run context); None when no
        global field is non-finite. For a page ahead of a backlog: the in-order copy of
        ``rec`` is judged by ``update`` when it arrives, and that finding is the one stored.

        A finding about parameters alone is not previewed: it names its layer, in the
        run's backward order, which needs the run's layer context (and the layer may be
        part of the alert's identity). Parameters named in a previewed message are in the
        record's own order, reversed; the in-order finding replaces it on the alert."""
        bad = non_finite_fields(rec)
        if not bad:
            return None
        table = rec.layer_grads
        mask = nonfinite_mask(table) if table is not None else None
        layers: list[str] = []
        if table is not None and mask is not None:
            layers = [table.names[c] for c in np.flatnonzero(mask)[::-1]]
        st = self.ranks.get(rec.rank) or self.new_rank()
        ahead = dataclasses.replace(st, streak=st.streak + 1)  # read only: grads shared
        return self._finding(rec, ahead, bad, layers)

    def on_eval(self, rec: EvalRecord, st: NanState) -> list[Finding]:
        if not _nonfinite(rec.val_loss) or not self.due(rec):
            return []
        msg = f"val_loss is {rec.val_loss} at step {rec.step}"
        return [self.finding(rec, msg, value=rec.val_loss, suggestions=NAN_SUDDEN)]

    def _bad_layers(self, rec: StepRecord) -> list[str]:
        return nonfinite_params(self.ctx, rec)

    def _finding(
        self, rec: StepRecord, st: NanState, bad: list[str], layers: list[str]
    ) -> Finding:
        parts = [f"{f} is {getattr(rec, f)}" for f in bad]
        origin, where, pass_ = _origin(rec, bad, layers)
        if where:
            parts.append(where)
        growth = self._growth(st)
        table = rec.layer_grads
        # Where it started comes first: a page shows the first dozen items.
        evidence = {"pass": pass_, "origin": origin, "non_finite_fields": ",".join(bad),
                    "non_finite_modules": rec.nonfinite_module_count,
                    "non_finite_layers": len(layers),
                    "parameters_measured": len(table) if table is not None else None,
                    "consecutive_steps": st.streak,
                    # Backward order says nothing when the forward pass poisoned them all.
                    "first_layer": layers[0] if layers and pass_ not in ("forward", "loss") else None,
                    "grad_norm_growth": growth}
        if st.overflow_origin is not None:
            evidence["last_overflow_origin"] = st.overflow_origin
        return self.finding(
            rec, "; ".join(parts) + f" at step {rec.step}",
            value=rec.loss if "loss" in bad else rec.grad_norm,
            evidence=evidence, suggestions=self._suggest(rec, growth),
            layer=layers[0] if layers and not bad else None,
        )

    def _growth(self, st: NanState) -> float | None:
        """Last finite grad norm over the median of the ones before it."""
        if len(st.grads) < 5:
            return None
        values = st.grads.values()
        return float(np.exp(values[-3:].max() - np.median(values[:-3])))

    def _suggest(self, rec: StepRecord, growth: float | None) -> tuple[str, ...]:
        info = self.ctx.state.ranks.get(str(rec.rank))  # read only (preview changes nothing)
        if info is None or info.steps < self.settings.min_history_steps:
            return NAN_AT_START
        if growth is not None and growth >= 3.0:
            return NAN_AFTER_GROWTH
        if rec.loss_scale is not None:
            return NAN_FP16 + NAN_SUDDEN
        return NAN_SUDDEN


def _origin(rec: StepRecord, bad: list[str], layers: list[str]
            ) -> tuple[str | None, str | None, str]:
    """(origin name, the clause that says it, which pass broke) for one non-finite step."""
    modules, n_mod = rec.nonfinite_modules, rec.nonfinite_module_count or 0
    forward = "loss" in bad or bool(modules)
    if forward and modules:
        more = f", {n_mod} module outputs non-finite in all" if n_mod > 1 else ""
        return (modules[0], f"forward pass: the output of {modules[0]} went non-finite "
                f"first{more}", "forward")
    if forward and n_mod == 0 and rec.nonfinite_module_count is not None:
        # Measured, not guessed: the client checked every module's output and all were
        # finite, so the arithmetic after the last module made it.
        return ("loss", "every module output finite; the loss is not: the NaN is made in "
                "the loss computation (check log/div/softmax of the targets)", "loss")
    if forward:
        clause = (f"{len(layers)} parameter gradient(s) non-finite (a forward NaN reaches "
                  f"every gradient; per-module output checks were not reported)"
                  if layers else None)
        return None, clause, "forward"
    if layers:
        table = rec.layer_grads
        of = f" of {len(table)}" if table is not None else ""
        kind = "parameter" if bad and "grad_norm" not in bad else "backward"
        what = ("backward pass (loss finite): " if kind == "backward" else "")
        return (layers[0], f"{what}{len(layers)}{of} parameter(s) non-finite, first on the "
                f"output side {layers[0]}", kind)
    return None, None, "backward" if "grad_norm" in bad else "parameter"


def _nonfinite(x: float | None) -> bool:
    return x is not None and not math.isfinite(x)
