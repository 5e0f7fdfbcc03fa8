"""Which layer left its own band first: the per-parameter view behind a global alarm.

A global grad norm that explodes, or a loss that diverges, says that something went wrong
but not where. Each parameter's gradient norm has its own level and its own noise; the one
whose norm left its band earliest is where to look first (an input-scale bug shows up as
the input embedding / first layer leaving first, an LR spike as whichever layer the
optimizer over-steps first).

Band, per parameter, on log grad norm: the median of its last ``WINDOW`` in-band readings,
and the robust spread ``sigma = MAD_TO_SIGMA * MAD`` of those readings. A reading has left the
band when it is at least ``BAND_Z`` (4) sigma above the median and at least ``BAND_RATIO``
(2x) above it (the floor keeps a very smooth parameter, whose MAD is tiny, from leaving on
rounding noise), or when it is non-finite. 4 sigma is a tail a normal reading reaches about
once in 30,000: over a few hundred parameters a stray one per step is possible, which is
why this only ORDERS parameters for a finding that another rule decided on; it never fires
anything by itself. A parameter needs ``MIN_READINGS`` readings before it has a band.

Readings come from every record that carries per-parameter norms: the monitored steps'
``layers`` and the client's gated ``grad_norms`` (sent on each step whose global norm is
non-finite or far above its median, i.e. step by step through an explosion). Readings
outside stay out of the baseline, so an excursion never becomes its own reference.

An episode: the step a parameter left is kept while it is out and, once it was out on
two readings in a row (or non-finite: one stray reading of a noisy parameter is not an
episode), for ``HORIZON`` (100) steps after it came back; a new departure within that
horizon continues the same episode. A divergence is often judged tens of steps after the gradients flared and
settled again (its level rule compares a 10-step median with the 100 steps before), and
by then the parameter that went first is still the answer.

The run context keeps one per rank and folds in every step's per-parameter norms
(``DetectorContext.observe``); a detector's findings get the answer from ``locate``. Three
parameters steady for ten steps, then the embedding's norm 20x at step 11 and the first
block's 5x at step 12::

    >>> import math
    >>> from monitor_agent.detectors import DetectorSettings
    >>> from monitor_agent.detectors.support.context import DetectorContext
    >>> from monitor_agent.records.types import LayerTable
    >>> def norms(step):
    ...     wobble = 1 + 0.1 * math.sin(step)
    ...     return {"embed.weight": wobble * (20 if step >= 11 else 1),
    ...             "blocks.0.weight": wobble * (5 if step >= 12 else 1), "head.weight": wobble}
    >>> ctx, bands = DetectorContext(DetectorSettings()), LayerBands()
    >>> for step in range(1, 13):
    ...     bands.update(ctx.align(LayerTable.from_norms(norms(step))), step)
    >>> [(name, left, round(ratio)) for name, left, ratio in bands.first_out(ctx, now=12)]
    [('embed.weight', 11, 18), ('blocks.0.weight', 12, 5)]

A fault whose onset is step 30 names neither: they left 19 and 18 steps before it, more
than ``ONSET_SLACK``, another episode than the one the fault began with::

    >>> bands.first_out(ctx, now=40, since=30 - ONSET_SLACK)
    []
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from monitor_agent.detectors.support.slots import grown
from monitor_agent.detectors.support.stats import MAD_TO_SIGMA

WINDOW = 32
MIN_READINGS = 5
BAND_Z = 4.0
BAND_RATIO = 2.0
SIGMA_FLOOR = 1e-3  # log units
HORIZON = 100  # steps an episode is remembered after its parameter came back
# How far before a finding's onset (its evidence's ``onset_step``: where the loss left its
# level) a parameter may have left its band and still be named as where the fault began:
# gradients flare a few steps before the loss they drive rises. A departure earlier than
# that is another episode (a stray flare 60 steps before a divergence is not its origin).
ONSET_SLACK = 10


@dataclass(slots=True)
class LayerBands:
    """Per-slot rolling window of in-band log grad norms and the step each slot left."""

    buf: np.ndarray = field(default_factory=lambda: np.full((0, WINDOW), np.nan))
    n: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    left_at: np.ndarray = field(default_factory=lambda: np.zeros(0))   # episode start
    back_at: np.ndarray = field(default_factory=lambda: np.zeros(0))   # NaN: still out
    ratio: np.ndarray = field(default_factory=lambda: np.zeros(0))     # when it left
    confirmed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def _grow(self, size: int) -> None:
        if self.buf.ndim != 2:  # restored from an empty snapshot
            self.buf = self.buf.reshape(-1, WINDOW)
        self.buf = grown(self.buf, size, np.nan)
        self.n = grown(self.n, size, 0)
        self.left_at = grown(self.left_at, size, np.nan)
        self.back_at = grown(self.back_at, size, np.nan)
        self.confirmed = grown(self.confirmed, size, False)
        self.ratio = grown(self.ratio, size, np.nan)

    def update(self, view: Any, step: int) -> None:
        """Fold one record's per-parameter grad norms (``view``: ``ctx.align(table)``)."""
        table = view.table
        grads = table.stats["grad_norm"]
        seen = table.measured["grad_norm"] & ~table.grad_none
        self._grow(view.size)
        slots = view.slots[seen]
        g = grads[seen]
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(g)
        nonfinite = ~np.isfinite(g)
        usable = np.isfinite(logs)  # a zero gradient is no reading
        counts = np.minimum(self.n[slots], WINDOW)
        rows = self.buf[slots]
        med = _medians(np.sort(rows, axis=1), counts)
        r = logs - med
        # Out: at least BAND_RATIO above the median and BAND_Z sigma. The spread is needed
        # only where the ratio already is (few slots, most steps none): its sort is skipped
        # for the rest, whose answer it cannot change.
        out = nonfinite.copy()
        near = np.flatnonzero((counts >= MIN_READINGS) & usable & (r >= math.log(BAND_RATIO)))
        if len(near):
            sigma = np.fmax(_mads(rows[near], med[near], counts[near]), SIGMA_FLOOR)
            out[near] |= r[near] >= BAND_Z * sigma  # fmax: no spread (NaN) gets the floor
        inside = usable & ~out
        back, was_out = self.back_at[slots], np.isfinite(self.left_at[slots])
        still = out & was_out & np.isnan(back)  # out on this reading and the one before
        new = out & (~was_out | (step - back > HORIZON))
        self.left_at[slots[new]] = step
        self.ratio[slots[new]] = np.where(nonfinite[new], np.inf, np.exp(r[new]))
        self.confirmed[slots[new]] = nonfinite[new]
        self.confirmed[slots[still]] = True
        self.back_at[slots[out]] = np.nan
        returned = inside & was_out & np.isnan(back)
        stray = returned & ~self.confirmed[slots]  # one reading out: not an episode
        self.left_at[slots[stray]] = np.nan
        self.back_at[slots[returned & ~stray]] = step
        into = slots[inside]  # each slot once per record, so one fancy write is exact
        self.buf[into, self.n[into] % WINDOW] = logs[inside]
        self.n[into] += 1

    def _episode(self, now: int) -> np.ndarray:
        recent = np.isnan(self.back_at) | (self.confirmed & (now - self.back_at <= HORIZON))
        return np.isfinite(self.left_at) & recent

    def first_out(self, ctx: Any, now: int, k: int = 5,
                  since: int | None = None) -> list[tuple[str, int, float]]:
        """Up to ``k`` parameters of the current episode: (name, step it left, ratio then),
        earliest first; on the same step the farthest out first. ``since``: only those that
        left at or after that step."""
        episode = self._episode(now)
        if since is not None:
            episode &= self.left_at >= since
        idx = np.flatnonzero(episode)
        if not len(idx):
            return []
        order = np.lexsort((-np.nan_to_num(self.ratio[idx], posinf=1e300), self.left_at[idx]))
        return [(ctx.layer_name(int(s)), int(self.left_at[s]), float(self.ratio[s]))
                for s in idx[order][:k]]

    def count_out(self, now: int, since: int | None = None) -> int:
        episode = self._episode(now)
        if since is not None:
            episode &= self.left_at >= since
        return int(episode.sum())


def _medians(ordered: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The median of each sorted row's first ``counts`` readings (the rest NaN).

    One sort for all rows at once (NaN sorts last, so the middle of the filled part is at
    ``(count - 1) // 2`` and ``count // 2``): ``np.nanmedian`` loops in Python over rows
    and cost more than every other detector together."""
    at = np.arange(len(ordered))
    lo, hi = np.maximum((counts - 1) // 2, 0), np.minimum(counts // 2, WINDOW - 1)
    return (ordered[at, lo] + ordered[at, hi]) / 2


def _mads(rows: np.ndarray, med: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The robust sigma (``MAD_TO_SIGMA`` x MAD) of each row's first ``counts`` readings
    about its median ``med``."""
    return MAD_TO_SIGMA * _medians(np.sort(np.abs(rows - med[:, None]), axis=1), counts)


def describe(first: list[tuple[str, int, float]], total: int) -> tuple[str, dict[str, Any]]:
    """The page clause and the evidence for a finding, from ``first_out``."""
    if not first:
        return "", {"first_layer_out": None, "layers_out_of_band": 0}
    name, step, ratio = first[0]
    how = "non-finite" if math.isinf(ratio) else f"{ratio:.1f}x its median"
    clause = f"; first layer out of its band: {name} (step {step}, {how})"
    if total > 1:
        clause += f", {total} layers left theirs"
    evidence = {"first_layer_out": name, "first_layer_out_step": step,
                "first_layer_out_ratio": ratio, "layers_out_of_band": total,
                "layers_out_order": ", ".join(f"{n}@{s}" for n, s, _ in first)}
    return clause, evidence


def locate(findings: list, bands: LayerBands, ctx: Any) -> list:
    """``findings`` with the first layer out of its band added to message and evidence; a
    finding that says where its fault began (``onset_step``) names only a parameter that
    left its band at most ``ONSET_SLACK`` steps before that."""
    out = []
    for f in findings:
        onset = f.evidence.get("onset_step")
        since = onset - ONSET_SLACK if isinstance(onset, int) and not isinstance(
            onset, bool) else None
        clause, evidence = describe(bands.first_out(ctx, f.step, since=since),
                                    bands.count_out(f.step, since=since))
        ratio = evidence.get("first_layer_out_ratio")
        if isinstance(ratio, float) and math.isfinite(ratio):
            evidence["first_layer_out_ratio"] = float(f"{ratio:.4g}")
        # First in the evidence: a page shows the first dozen items (notify/format.py).
        out.append(dataclasses.replace(f, message=f.message + clause,
                                       evidence={**evidence, **f.evidence}))
    return out
