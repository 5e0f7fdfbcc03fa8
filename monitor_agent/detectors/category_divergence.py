"""``category_divergence``: one category's eval loss rising while the rest do not.

Eval records may carry per-category losses as ``metrics["loss/<category>"]`` (the
client's ``CategoryLoss`` helper makes them, normalised per sample). A category's
*standing* is its log loss minus the median log loss of the other categories: it moves
when that category alone gets better or worse, not when the whole run does (a run-wide
rise is ``divergence``/``overfitting``'s). Per-category eval losses are noisy (few samples
each), so the standing is judged against its own recent history: a category diverges when,
on ``category_evals`` evals in a row, its standing is above the median of its last
``CATEGORY_HISTORY`` standings by more than ``category_noise_k`` robust sigmas
(``MAD_TO_SIGMA * MAD``) and by at least ``category_drift`` (as a ratio), AND its loss is
``category_rise`` above its own best. Everything is a ratio or in log space: the loss scale does not matter.
Nothing is judged before ``category_min_evals`` evals of a category (early training moves
every category a lot).

Three categories improving together for four evals, then ``code`` jumping to 2.4 on two in
a row::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> def losses(k):
    ...     down = 0.95**k
    ...     return {"loss/code": 1.2 * down if k <= 4 else 2.4, "loss/prose": 2.1 * down,
    ...             "loss/math": 1.6 * down}
    >>> evals = [parse_record({"kind": "eval", "run_id": "r", "step": 100 * k, "time": k,
    ...                        "metrics": losses(k)}) for k in range(1, 7)]
    >>> found = [f for rec in evals for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label, f.evidence["category"]) for f in found]
    [('category_divergence', 600, 'warning', 'code')]
    >>> print(found[0].message)
    eval loss of category 'code' is 2.4, +146% from its best 0.977 and +172% worse against the
    other categories than usual (2 evals in a row)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import MAD_TO_SIGMA
from monitor_agent.records.types import EvalRecord, Finding, Severity

PREFIX = "loss/"
MAX_CATEGORIES = 256  # state stays bounded whatever a client sends
CATEGORY_HISTORY = 10  # standings a category is judged against
NOISE_FLOOR = 0.05     # log units: below this, eval noise is not measurable anyway


CATEGORY_DIVERGENCE = (
    "Look at this category's data: a new or shifted source, a tokenisation or labelling bug, "
    "or a mixture weight that changed.",
    "Check the data mixture: the category may be under-sampled now, or drowned by another "
    "that grew.",
    "If it is forgetting (learned early, lost later), raise its sampling weight or replay it.",
)


class CategoryDivergenceSettings(SharedSettings):
    """The knobs of ``category_divergence`` (``detectors:`` in the sidecar's config)."""

    category_rise: float = Field(
        default=0.1, gt=0,
        description="category_divergence: the category's eval loss at least this fraction above "
        "its own best...",
    )
    category_drift: float = Field(
        default=0.5, gt=0, description="...and its standing against the other categories at least "
        "this ratio worse than its recent median standing..."
    )
    category_noise_k: float = Field(
        default=4.0, gt=0, description="...and more than this many robust sigmas of its own "
        "eval-to-eval noise."
    )
    category_evals: int = Field(
        default=2, ge=1, description="Evals in a row a category must diverge before it is reported."
    )
    category_min_evals: int = Field(
        default=4, ge=2, description="Evals of a category seen before it is judged at all."
    )


@dataclass(slots=True)
class CategoryState:
    best: dict[str, float] = field(default_factory=dict)            # lowest loss seen
    standing: dict[str, list[float]] = field(default_factory=dict)  # recent standings
    streak: dict[str, int] = field(default_factory=dict)


def category_losses(metrics: dict[str, float | None]) -> dict[str, float]:
    """``loss/<category>`` entries with a finite positive value, by category."""
    out = {}
    for key, value in metrics.items():
        if key.startswith(PREFIX) and isinstance(value, int | float) and math.isfinite(value) \
                and value > 0:
            out[key[len(PREFIX):]] = float(value)
    return out


def standings(losses: dict[str, float]) -> dict[str, float]:
    """Each category's log loss minus the median log loss of the others."""
    names = list(losses)
    logs = np.log(np.fromiter(losses.values(), dtype=np.float64, count=len(names)))
    out = {}
    for i, name in enumerate(names):
        out[name] = float(logs[i] - np.median(np.delete(logs, i)))
    return out


class CategoryDivergenceDetector(DetectorBase[CategoryDivergenceSettings]):
    """Warning when one category's eval loss rises against its own best and the rest."""

    type = "category_divergence"
    severity = Severity.WARNING
    settings_model = CategoryDivergenceSettings

    def new_rank(self) -> CategoryState:
        return CategoryState()

    def on_eval(self, rec: EvalRecord, st: CategoryState) -> list[Finding]:
        losses = category_losses(rec.metrics)
        if len(losses) < 2:
            return []
        rel = standings(losses)
        findings = []
        for name, loss in losses.items():
            if name not in st.best and len(st.best) >= MAX_CATEGORIES:
                continue
            found = self._judge(rec, st, name, loss, rel[name])
            if found is not None:
                findings.append(found)
            st.best[name] = min(st.best.get(name, loss), loss)
            history = st.standing.setdefault(name, [])
            history.append(rel[name])
            del history[:-CATEGORY_HISTORY]
        return findings

    def _judge(self, rec: EvalRecord, st: CategoryState, name: str, loss: float,
               rel: float) -> Finding | None:
        s = self.settings
        history = st.standing.get(name, [])
        if len(history) < s.category_min_evals:
            return None
        past = np.asarray(history)
        centre = float(np.median(past))
        noise = max(MAD_TO_SIGMA * float(np.median(np.abs(past - centre))), NOISE_FLOOR)
        margin = max(s.category_noise_k * noise, math.log1p(s.category_drift))
        rise = loss / st.best[name] - 1.0
        drift = math.exp(rel - centre) - 1.0
        diverging = rise >= s.category_rise and rel - centre > margin
        st.streak[name] = st.streak.get(name, 0) + 1 if diverging else 0
        if st.streak[name] < s.category_evals or not self.due(rec, layer=f"category:{name}"):
            return None
        msg = (f"eval loss of category '{name}' is {fmt(loss)}, {rise:+.0%} from its best "
               f"{fmt(st.best[name])} and {drift:+.0%} worse against the other categories "
               f"than usual ({st.streak[name]} evals in a row)")
        evidence = {"category": name, "loss": loss, "best_loss": st.best[name], "rise": rise,
                    "relative_drift": drift, "noise_sigma_log": noise, "margin_log": margin,
                    "evals": st.streak[name], "categories": len(st.best)}
        return self.finding(rec, msg, value=loss, threshold=st.best[name] * (1 + s.category_rise),
                            evidence=evidence, suggestions=CATEGORY_DIVERGENCE)
