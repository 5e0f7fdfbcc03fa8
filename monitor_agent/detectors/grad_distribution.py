"""``grad_distribution``: a parameter's gradient distribution changed shape against its own
history: it collapsed, grew heavy tails, or its centre moved away from zero.

It reads the optional ``quantiles`` of ``grad_hist`` (min, p1, p25, p50, p75, p95, p99, max
of a bounded sample, sent every ``hist_every`` steps) and turns each reading into three
scale-free numbers per parameter, vectorised over parameters:

- tail = log((p99 - p1) / (p75 - p25)): about 1.24 for a Gaussian, larger for heavy tails;
- spread = p99 - p1: judged as a ratio to its own baseline median (collapse to ~0);
- centre = |p50| / (p75 - p25): how many IQRs the median sits from zero.

Each parameter keeps its last ``dist_window`` readings; once it has ``dist_min_readings``
(and the run is past warmup) a reading is abnormal when the tail is ``dist_z`` robust
deviations (MAD) above its baseline median and ``dist_tail_jump`` times it, on this reading and the
previous one (a single odd sample is noise); when the spread
falls below ``dist_collapse_ratio`` of its baseline (an all-zero gradient is dead_layer's);
or when the centre is at least ``dist_shift`` IQRs and ``dist_z`` MADs above its baseline.
The evidence names the sub-kind (collapsed / heavy_tail / shifted).

A parameter's gradient sample, Gaussian-shaped for ten readings every 25 steps, then with p1
and p99 ten times as far out on two readings in a row::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> usual = [-4.0, -2.3, -0.7, 0.0, 0.7, 1.6, 2.3, 4.0]  # min, p1, p25, p50, ..., p99, max
    >>> heavy = [-40.0, -23.0, -0.7, 0.0, 0.7, 1.6, 23.0, 40.0]
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": 25 * k, "time": k,
    ...     "grad_hist": {"h.3.mlp.weight": {"edges": [-1.0, 0.0, 1.0], "counts": [50, 50],
    ...                                      "quantiles": usual if k <= 10 else heavy}}})
    ...     for k in range(1, 13)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.layer, f.evidence["kind"]) for f in found]
    [('grad_distribution', 300, 'h.3.mlp.weight', 'heavy_tail')]
    >>> print(found[0].message)
    h.3.mlp.weight: gradient distribution grew heavy tails: (p99-p1)/IQR 32.9 vs 3.29 usually
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.slots import SlotIndex, grown
from monitor_agent.detectors.support.stats import MAD_TO_SIGMA, amp_overflow
from monitor_agent.records.types import QUANTILE_LEVELS, Finding, Severity, StepRecord

_MIN, _P1, _P25, _P50, _P75, _P99, _MAX = (QUANTILE_LEVELS.index(q)
                                           for q in (0.0, 0.01, 0.25, 0.5, 0.75, 0.99, 1.0))
_TAIL, _SPREAD, _CENTRE = 0, 1, 2
_FEATURES = 3
GRAD_DIST_COLLAPSED = (
    "Most gradient entries of this parameter became one value (usually 0): look for dead "
    "units (ReLU after a large update: lower the lr, or use GELU/LeakyReLU) or saturated "
    "activations (tanh/sigmoid, softmax with huge logits).",
    "Check the parameter is still used in the forward pass (masking, a detached branch).",
)

GRAD_DIST_HEAVY_TAIL = (
    "A few gradient entries grew far beyond the bulk: look for outlier tokens or features "
    "(rare embeddings, attention logits growing); clipping hides them, it does not fix them.",
    "Lower the lr or raise warmup; consider QK-norm / logit soft-capping for attention.",
)

GRAD_DIST_SHIFTED = (
    "The gradient of this parameter is consistently one-signed: the parameter is being "
    "pushed in one direction (a bias compensating for a data or normalisation shift).",
    "Check input normalisation and the label distribution of recent batches.",
)

MAX_SLOTS = 20_000  # parameter names tracked per rank (a name bomb must not grow memory)
_KINDS = ("collapsed", "heavy_tail", "shifted")  # reporting priority
_TIPS = {"collapsed": GRAD_DIST_COLLAPSED, "heavy_tail": GRAD_DIST_HEAVY_TAIL,
         "shifted": GRAD_DIST_SHIFTED}


class GradDistributionSettings(SharedSettings):
    """The knobs of ``grad_distribution`` (``detectors:`` in the sidecar's config)."""

    dist_window: int = Field(
        default=16, ge=4, description="Distribution readings in each parameter's own baseline."
    )
    dist_min_readings: int = Field(
        default=8, ge=2, description="Readings a parameter needs before its distribution is judged."
    )
    dist_z: float = Field(
        default=6.0, gt=0,
        description="Robust z (MAD) above its baseline that makes the tail ratio "
        "log((p99-p1)/(p75-p25)) or the centre |p50|/(p75-p25) abnormal.",
    )
    dist_tail_jump: float = Field(
        default=2.0, gt=1, description="...and the tail ratio must be this many times its baseline."
    )
    dist_shift: float = Field(
        default=1.0, gt=0, description="...and the centre |p50| must be this many IQRs from zero."
    )
    dist_collapse_ratio: float = Field(
        default=0.01, gt=0, lt=1, description="p1..p99 spread below this fraction of its baseline "
        "median: a collapsed distribution.",
    )


@dataclass(slots=True)
class DistState:
    """Per rank: parameter slots and a ring of the last readings, (slots, window, 3)."""

    names: list[str] = field(default_factory=list)
    readings: np.ndarray = field(default_factory=lambda: np.zeros(0))
    count: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def features(q: np.ndarray) -> np.ndarray:
    """(P, 8) quantiles -> (P, 3): log tail ratio, p1..p99 spread, centre in IQRs."""
    iqr = q[:, _P75] - q[:, _P25]
    spread = q[:, _P99] - q[:, _P1]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        tail = np.where(iqr > 0, np.log(spread / iqr), np.nan)
        centre = np.where(iqr > 0, np.abs(q[:, _P50]) / iqr, np.nan)
    return np.stack([tail, spread, centre], axis=1)


def nanmedian(a: np.ndarray) -> np.ndarray:
    """Median over axis 1 ignoring NaN, NaN where a row has none: (P, W, F) -> (P, F).

    One sort (NaN last) and two picks; np.nanmedian is ~20x slower on such small windows.
    """
    ordered = np.sort(a, axis=1)
    n = np.count_nonzero(~np.isnan(a), axis=1)
    lo = np.maximum((n - 1) // 2, 0)[:, None, :]
    hi = np.minimum(n // 2, a.shape[1] - 1)[:, None, :]
    med = 0.5 * (np.take_along_axis(ordered, lo, axis=1)
                 + np.take_along_axis(ordered, hi, axis=1))[:, 0, :]
    return np.where(n > 0, med, np.nan)


class GradDistributionDetector(DetectorBase[GradDistributionSettings]):
    """Warning per parameter whose gradient distribution left its own baseline."""

    type = "grad_distribution"
    severity = Severity.WARNING
    settings_model = GradDistributionSettings

    def __init__(self, settings, ctx) -> None:
        super().__init__(settings, ctx)
        self._slot_cache: dict[int, tuple[tuple[str, ...], np.ndarray, SlotIndex]] = {}

    def new_rank(self) -> DistState:
        return DistState()

    def restore_extra(self, data: dict) -> None:
        self._slot_cache = {}

    def on_step(self, rec: StepRecord, st: DistState) -> list[Finding]:
        table = rec.grad_quantiles
        if table is None or amp_overflow(rec):
            return []
        slots = self._slots(rec.rank, st, table.names)
        keep = np.flatnonzero(slots >= 0)
        q = table.values[keep]
        ok = np.isfinite(q).all(axis=1) & ((q[:, _MIN] != 0) | (q[:, _MAX] != 0))
        keep, q = keep[ok], q[ok]
        if not len(keep):
            return []
        feats, slots = features(q), slots[keep]
        history = self._history(st, slots)
        last = self._last(st, slots)
        ready = st.count[slots] >= self.settings.dist_min_readings
        found = []
        if ready.any() and not self.ctx.in_warmup(rec.step):
            found = self._judge(rec, table.names, keep[ready], q[ready], feats[ready],
                                history[ready], last[ready])
        self._remember(st, slots, feats)
        return found

    # -- state ------------------------------------------------------------------------------

    def _slots(self, rank: int, st: DistState, names: tuple[str, ...]) -> np.ndarray:
        cached = self._slot_cache.get(rank)
        if cached is not None and (cached[0] is names or cached[0] == names):
            return cached[1]
        index = cached[2] if cached is not None else SlotIndex(st.names, MAX_SLOTS)
        out = index.of(names)
        self._slot_cache[rank] = (names, out, index)
        return out

    def _ring(self, st: DistState) -> np.ndarray:
        w, size = self.settings.dist_window, len(st.names)
        ring = st.readings
        if ring.ndim != 3 or ring.shape[1:] != (w, _FEATURES):  # fresh, restored, resized
            flat = np.asarray(ring, dtype=np.float64).reshape(-1)
            rows = flat.size // (w * _FEATURES)
            if rows * w * _FEATURES != flat.size:  # the window setting changed: start over
                rows, flat, st.count = 0, flat[:0], st.count[:0]
            ring = flat.reshape(rows, w, _FEATURES)
        st.readings = ring = grown(ring, size, np.nan)
        st.count = grown(st.count, size, 0)
        return ring

    def _history(self, st: DistState, slots: np.ndarray) -> np.ndarray:
        return self._ring(st)[slots]

    def _last(self, st: DistState, slots: np.ndarray) -> np.ndarray:
        """Each slot's previous reading (NaN where there is none)."""
        pos = (st.count[slots] - 1) % self.settings.dist_window
        return st.readings[slots, pos]

    def _remember(self, st: DistState, slots: np.ndarray, feats: np.ndarray) -> None:
        pos = st.count[slots] % self.settings.dist_window
        st.readings[slots, pos] = feats
        st.count[slots] += 1

    # -- judging ----------------------------------------------------------------------------

    def _judge(self, rec: StepRecord, names: tuple[str, ...], cols: np.ndarray, q: np.ndarray,
               feats: np.ndarray, history: np.ndarray, last: np.ndarray) -> list[Finding]:
        s = self.settings
        med = nanmedian(history)
        mad = MAD_TO_SIGMA * nanmedian(np.abs(history - med[:, None, :]))
        with np.errstate(invalid="ignore"):
            tail_limit = med[:, _TAIL] + np.maximum(s.dist_z * mad[:, _TAIL],
                                                    np.log(s.dist_tail_jump))
            centre_limit = np.maximum(med[:, _CENTRE] + s.dist_z * mad[:, _CENTRE],
                                      s.dist_shift)
            collapse_limit = s.dist_collapse_ratio * med[:, _SPREAD]
            # Two readings in a row: one odd sample is noise (a sparse embedding gradient's
            # IQR jumps with which rows a batch touched), a changed shape persists.
            hits = {
                "collapsed": (feats[:, _SPREAD] < collapse_limit) & (med[:, _SPREAD] > 0)
                & (last[:, _SPREAD] < collapse_limit),
                "heavy_tail": (feats[:, _TAIL] > tail_limit) & (last[:, _TAIL] > tail_limit),
                "shifted": (feats[:, _CENTRE] > centre_limit)
                & (last[:, _CENTRE] > centre_limit),
            }
        limits = {"collapsed": collapse_limit, "heavy_tail": np.exp(tail_limit),
                  "shifted": centre_limit}
        values = {"collapsed": feats[:, _SPREAD], "heavy_tail": np.exp(feats[:, _TAIL]),
                  "shifted": feats[:, _CENTRE]}
        bases = {"collapsed": med[:, _SPREAD], "heavy_tail": np.exp(med[:, _TAIL]),
                 "shifted": med[:, _CENTRE]}
        total = int(np.logical_or.reduce([hits[k] for k in _KINDS]).sum())
        found: list[Finding] = []
        seen: set[int] = set()
        for kind in _KINDS:
            for i in np.flatnonzero(hits[kind]):
                if i in seen or len(found) >= s.max_layer_findings:
                    continue
                seen.add(int(i))
                name = names[int(cols[i])]
                if not self.due(rec, name):
                    continue
                found.append(self._finding(rec, name, kind, float(values[kind][i]),
                                           float(limits[kind][i]), float(bases[kind][i]),
                                           q[i], total))
        return found

    def _finding(self, rec: StepRecord, name: str, kind: str, value: float, limit: float,
                 base: float, q: np.ndarray, total: int) -> Finding:
        if kind == "collapsed":
            msg = (f"{name}: gradient distribution collapsed: p1..p99 spread {fmt(value)} "
                   f"vs {fmt(base)} usually (max |g| {fmt(max(-q[_MIN], q[_MAX]))})")
        elif kind == "heavy_tail":
            msg = (f"{name}: gradient distribution grew heavy tails: (p99-p1)/IQR "
                   f"{fmt(value)} vs {fmt(base)} usually")
        else:
            msg = (f"{name}: gradient distribution shifted: median {fmt(q[_P50])} is "
                   f"{fmt(value)} IQRs from zero vs {fmt(base)} usually")
        evidence = {"kind": kind, "baseline": base, "layers": total, "p1": q[_P1],
                    "p50": q[_P50], "p99": q[_P99], "min": q[_MIN], "max": q[_MAX]}
        return self.finding(rec, msg, value=value, threshold=limit, layer=name,
                            evidence=evidence, suggestions=_TIPS[kind])
