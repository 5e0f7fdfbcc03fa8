"""``grad_vanishing``: early layers get < 1% of the late layers' gradient, or one parameter
dominates the gradient so that, after clipping, every other one is starved.

Depth comes from the run's ``layer_order`` (else parameter order). Early = the first
quarter of the parameters, late = the last quarter, each summarised by its median grad
norm; the ratio is judged as a median over ``vanishing_window`` steps so one odd batch
never fires. A run that watches several models (a GAN's generator and discriminator, an
actor and a critic) is judged model by model, since depth orders one model's layers and
two models' gradients have scales of their own: the model whose ratio is lowest, and for
dominance the parameter that dominates its own model most. Dominance compares relative gradients (grad norm / param norm, with the
norm floored at the typical parameter's), which removes the size differences between
embeddings, matrices and norms; the output head, which normally takes most of the
gradient, is left out.

Eight blocks whose gradient shrinks threefold per block toward the input, judged once the
10-step window of ratios is full::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> layers = {f"blocks.{k}.weight": {"grad_norm": 3.0 ** (k - 7), "param_norm": 1.0}
    ...           for k in range(8)}
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "layers": layers}) for s in range(1, 21)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('grad_vanishing', 10, 'warning')]
    >>> print(found[0].message)
    early layers get 0.00137 of the late layers' gradient norm (median 0.000914 vs 0.667)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, amp_overflow, median, sorted_median
from monitor_agent.records.types import Finding, LayerTable, Severity, StepRecord

GRAD_VANISHING = (
    "Early layers get < 1% of the late layers' gradient: add residual connections or "
    "normalisation (LayerNorm/BatchNorm).",
    "Use a non-saturating activation (ReLU/GELU instead of sigmoid/tanh) and a fan-in "
    "aware init (Kaiming/Xavier).",
    "Check the gradient actually reaches the early layers (detach(), no_grad, frozen params).",
)

GRAD_DOMINANCE = (
    "One parameter dominates the gradient: check its initialisation (e.g. a randn-initialised "
    "scale instead of ones) and its learning rate.",
    "Clipping the global norm then starves every other parameter: clip per parameter group "
    "or fix the dominant parameter's scale.",
)


class GradVanishingSettings(SharedSettings):
    """The knobs of ``grad_vanishing`` (``detectors:`` in the sidecar's config)."""

    vanishing_ratio: float = Field(
        default=0.01, gt=0, lt=1,
        description="Early-layer / late-layer grad norm below this vanishes.",
    )
    vanishing_window: int = Field(
        default=10, ge=1, description="Steps whose median ratio is judged (vanishing, dominance)."
    )
    dominance_ratio: float = Field(
        default=100.0, gt=1, description="One parameter's relative gradient (grad/param norm) over "
        "the median of the others' that dominates.",
    )


@dataclass(slots=True)
class VanishingState:
    ratios: Window
    dominance: Window
    dominant: str = ""


class GradVanishingDetector(DetectorBase[GradVanishingSettings]):
    """Warning on early/late grad ratio < ``vanishing_ratio`` or a dominating parameter."""

    type = "grad_vanishing"
    severity = Severity.WARNING
    settings_model = GradVanishingSettings
    _head_cache: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]] | None = None

    def new_rank(self) -> VanishingState:
        w = self.settings.vanishing_window
        return VanishingState(ratios=Window.of(w), dominance=Window.of(w))

    def on_step(self, rec: StepRecord, st: VanishingState) -> list[Finding]:
        if rec.layers is None or amp_overflow(rec) or len(rec.layers) < 2:
            return []
        view = self.ctx.align(rec.layers)
        grad_norm = rec.layers.stats["grad_norm"]
        groups = view.models()
        per_model = [grad_norm[cols] for cols in groups if len(cols) >= 2]
        if not per_model or not all(np.isfinite(g).all() for g in per_model):
            return []
        return self._depth(rec, st, per_model) + self._dominance(rec, st, rec.layers, groups)

    def _depth(self, rec: StepRecord, st: VanishingState,
               per_model: list[np.ndarray]) -> list[Finding]:
        found = []
        for grads in per_model:
            q = max(1, len(grads) // 4)
            early, late = median(grads[:q]), median(grads[-q:])
            if late > 0:
                found.append((early / late, early, late, q))
        if not found:
            return []
        _, early, late, q = min(found)
        st.ratios.add(early / late)
        ratio = st.ratios.median()
        if not st.ratios.full or ratio >= self.settings.vanishing_ratio or not self.due(rec):
            return []
        msg = (f"early layers get {fmt(ratio)} of the late layers' gradient norm "
               f"(median {fmt(early)} vs {fmt(late)})")
        evidence = {"ratio": ratio, "early_median": early, "late_median": late,
                    "layers_per_group": q}
        return [self.finding(rec, msg, value=ratio, threshold=self.settings.vanishing_ratio,
                             evidence=evidence, suggestions=GRAD_VANISHING)]

    def _dominance(self, rec: StepRecord, st: VanishingState, table: LayerTable,
                   groups: tuple[np.ndarray, ...]) -> list[Finding]:
        if self._head_cache is None or self._head_cache[0] is not groups:
            # The aligned groups are shared by every record with the same layer names.
            self._head_cache = (groups, tuple(_without_output_head(table.names, order)
                                              for order in groups))
        best: tuple[float, str, float] | None = None
        for order in self._head_cache[1]:
            judged = _dominant(table, order)
            if judged is not None and (best is None or judged[0] > best[0]):
                best = judged
        if best is None:
            return []
        log_ratio, name, base = best
        if name != st.dominant:
            st.dominance.clear()
            st.dominant = name
        st.dominance.add(log_ratio)
        ratio = math.exp(st.dominance.median())
        limit = self.settings.dominance_ratio
        if not st.dominance.full or ratio < limit or not self.due(rec, name):
            return []
        msg = (f"{name} dominates the gradient: its grad/param norm is {ratio:.0f}x "
               f"the median of the other parameters")
        return [self.finding(rec, msg, value=ratio, threshold=limit, layer=name,
                             evidence={"ratio": ratio, "others_median": base},
                             suggestions=GRAD_DOMINANCE)]


def _dominant(table: LayerTable, order: np.ndarray) -> tuple[float, str, float] | None:
    """The parameter whose relative gradient stands out most among ``order``'s, as (log of
    its ratio to the others' median, its name, that median); None when it cannot be
    judged."""
    g, p = table.stats["grad_norm"][order], table.stats["param_norm"][order]
    if len(order) < 3 or not np.isfinite(p).all():
        return None
    # A near-zero parameter (a fresh bias) has a meaningless relative gradient: judge
    # every parameter against at least the typical parameter norm.
    rel = g / np.maximum(p, median(p) or 1.0)
    top = int(np.argmax(rel))
    base = sorted_median(np.sort(rel)[:-1])  # every parameter but the top one
    if base <= 0:
        return None
    return math.log(rel[top] / base), table.names[int(order[top])], base


def _without_output_head(names: tuple[str, ...], order: np.ndarray) -> np.ndarray:
    """The depth order minus the output module (its weight and bias): the output head
    normally takes most of the gradient, so only the others can dominate abnormally."""
    if len(order) < 2:
        return order
    head = names[int(order[-1])].rsplit(".", 1)[0]
    keep = [c for c in order if names[int(c)].rsplit(".", 1)[0] != head]
    return np.asarray(keep, dtype=np.intp)
