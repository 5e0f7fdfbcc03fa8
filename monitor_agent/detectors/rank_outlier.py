"""``rank_outlier``: one rank's local loss far outside its peers' spread, step after step.

In data parallelism every rank runs the same weights on its own shard of the batch, so at
one step the ranks' local losses (the client's per-rank ``loss``, taken before any
all-reduce) differ only by batch-to-batch sampling noise. A rank whose loss sits far
outside that noise, step after step, computes on something different: a sick GPU (silent
data corruption, a bad HBM row), or a corrupt or mislabelled shard of the data. The
reduced gradient hides it from every global number until it poisons the rest; the local
loss shows it now. This is a warning of its own, naming the rank and its host.

The statistic, per step and rank ``r`` (judged once every rank still sending has reported
the step, or once a rank is ``STALE_STEPS`` (64) past it: ``support/front.py``, which
keeps the live ranks' slowest and newest steps at O(log ranks) a record, so the wait costs
a record nothing per rank; the judgement itself, once a step, sorts the step's losses once,
``peer_stats``: O(log ranks) a record amortised):

* ``z = (loss_r - median(peers)) / sigma_peers``: the robust z-score of the rank against
  the median of the *other* ranks at the same step (the rank itself, and so the fault, is
  left out of its own yardstick). ``sigma_peers`` is the peers' own spread at each step,
  the median of their pairwise distances scaled to a Gaussian sigma (a plain MAD of two or
  three peers is biased low: it counts the median's own zero distance), pooled as the
  median over the last ``rank_outlier_noise_steps`` (20) steps (one step's spread of
  three peers is itself a noisy number, near zero by chance now and then), and never
  below the peers' spread at the step judged (a divergence of the whole run spreads every
  rank's loss apart at once: the pooled spread lags behind it, this one does not; a rank
  with a corrupt shard is left out of its own peers, whose spread stays quiet), floored at
  1e-4 of the peers' median: ranks fed identical data agree to float32 rounding and
  nondeterministic kernels (atomics) well inside that, so a difference beyond the floor
  is a real one, not arithmetic.
* ``|z| >= rank_outlier_z`` (6): batch-mean losses are near Gaussian (the batch mean of
  many per-sample losses), where a 6-sigma reading has odds of 2e-9; the peers' median
  is itself noisy with few peers (three: about 0.6 sigma), so it is about 5 true sigmas
  there. A single hard batch is one reading, not a fault.
* sustained: ``rank_outlier_k`` (5) of the last ``rank_outlier_window`` (8) judged steps
  beyond it on the same side: "several steps" as a majority of a short window, so a
  corrupt shard is named within about 5 steps of starting, and a few hard batches in a
  row (k-in-W for independent 5-sigma readings: C(8,5) * (6e-7)^5, nil) are not.

With two ranks there are no peers' spread to judge against: each rank's only peer is the
other, and a gap between two numbers does not say which one is wrong; the detector stays
silent then (the NaN page and the gradient detectors still see the run). Ranks whose loss
is non-finite are left out of the step (``nan_inf`` owns them). A local gradient norm is
not judged: the client's ``grad_norm`` is measured after DDP's all-reduce, the same on
every rank; a local one would need a DDP communication hook on the user's model.

Four ranks; rank 3's shard turns bad at step 30 (its loss 3x its peers')::

    >>> from monitor_agent.detectors import FINDING_TYPES, DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings(disabled=set(FINDING_TYPES) - {"rank_outlier"}))
    >>> def loss(s, r): return 2.0 + 0.05 * ((s * 7 + r * 3) % 5 - 2) + (4.0 if r == 3 and s >= 30 else 0)
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s, "rank": r,
    ...                        "loss": loss(s, r)}) for s in range(1, 41) for r in range(4)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.rank, f.severity.label) for f in found]
    [('rank_outlier', 34, 3, 'warning')]
    >>> print(found[0].message)
    rank 3: local loss 6 vs its peers' median 2.05, 38 peers' sigmas above them in 5 of
    the last 8 steps, since step 30 (a sick GPU or a corrupt data shard on that rank)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.context import DetectorContext
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import MAD_TO_SIGMA, Window, finite, median
from monitor_agent.records.types import Finding, Severity, StepRecord

RANK_OUTLIER = (
    "Check that rank's data shard first: a corrupt, mislabelled or wrongly preprocessed "
    "shard (scaled inputs, shifted labels) shows as exactly this.",
    "Check its GPU: run a health check (nvidia-smi -q for ECC/XID errors, DCGM diagnostics); "
    "silent data corruption on one device reads as a loss apart from its peers.",
    "Pull the node out of the job, or restart from the last checkpoint without it, before "
    "its gradients drift the shared weights.",
)

_MIN_RANKS = 3     # below this a rank has no peers' spread to be judged against
_REL_FLOOR = 1e-4  # of the peers' median: float32 rounding and kernel nondeterminism
_PAIRWISE_MAX = 16  # peers; beyond, their MAD measures sigma (the median's own zero is 1/17th)
_PAIR_TO_SIGMA = math.sqrt(2) * 0.6745  # median |x_i - x_j| of a normal, in sigmas


class RankOutlierSettings(SharedSettings):
    """The knobs of ``rank_outlier`` (``detectors:`` in the sidecar's config)."""

    rank_outlier_z: float = Field(
        default=6.0, gt=0,
        description="How far a rank's local loss is from its peers' median, in their own "
        "robust sigmas, to count as one outlying step.")
    rank_outlier_k: int = Field(
        default=5, ge=1, description="Outlying steps (same side) among the last "
        "rank_outlier_window that make the warning.")
    rank_outlier_window: int = Field(
        default=8, ge=1, le=1000, description="Steps the rank_outlier_k are counted in.")
    rank_outlier_noise_steps: int = Field(
        default=20, ge=3, le=1000,
        description="Steps over which the peers' per-step spread is pooled (median).")

    @model_validator(mode="after")
    def _k_within_window(self) -> RankOutlierSettings:
        if self.rank_outlier_k > self.rank_outlier_window:
            raise ValueError("rank_outlier_k must be at most rank_outlier_window")
        return self


@dataclass(slots=True)
class RankSpread:
    """One rank against its peers: their pooled spread, its recent sides, its stretch."""

    spread: Window                      # the peers' MAD at each judged step
    sides: list[int] = field(default_factory=list)  # -1/0/+1 of the last window's steps
    since: int | None = None            # first outlying step of the current stretch


class RankOutlierDetector(DetectorBase[RankOutlierSettings]):
    """Warning for a rank whose local loss leaves its peers' spread (module docstring)."""

    type = "rank_outlier"
    severity = Severity.WARNING
    settings_model = RankOutlierSettings
    scope = "run"

    def __init__(self, settings: RankOutlierSettings, ctx: DetectorContext) -> None:
        super().__init__(settings, ctx)
        self.losses: dict[int, dict[int, float]] = {}  # step -> rank -> local loss

    def new_rank(self) -> RankSpread:
        return RankSpread(spread=Window.of(self.settings.rank_outlier_noise_steps))

    def on_step(self, rec: StepRecord, st: RankSpread) -> list[Finding]:
        if finite(rec.loss):
            self.losses.setdefault(rec.step, {})[rec.rank] = rec.loss
        out: list[Finding] = []
        front = self.ctx.front  # this record's rank counted: the context saw it first
        while self.losses:
            s = min(self.losses)  # a handful of steps at most are waiting
            if not front.complete(s):
                break  # a rank still to send this step
            out += self._judge(rec, s, self.losses.pop(s))
        return out

    def _judge(self, rec: StepRecord, step: int, losses: dict[int, float]) -> list[Finding]:
        if len(losses) < _MIN_RANKS:
            return []
        ranks = sorted(losses)
        values = np.array([losses[r] for r in ranks])
        centres, spreads = peer_stats(values)
        out = []
        for i, r in enumerate(ranks):
            centre = float(centres[i])
            st = self._rank(r)
            st.spread.add(float(spreads[i]))
            # Never below the peers' spread at this very step: when the whole run moves at
            # once (a divergence) the peers spread apart together, and a rank as far from
            # them as they are from each other is not news.
            sigma = max(st.spread.median(), float(spreads[i]), _REL_FLOOR * abs(centre), 1e-12)
            z = (values[i] - centre) / sigma
            side = int(np.sign(z)) if abs(z) >= self.settings.rank_outlier_z else 0
            st.sides = (st.sides + [side])[-self.settings.rank_outlier_window:]
            count = sum(1 for x in st.sides if x == side) if side else 0
            if side and st.since is None:
                st.since = step
            elif not any(st.sides):
                st.since = None
            if (not side or count < self.settings.rank_outlier_k
                    or len(st.spread) < self.settings.rank_outlier_window
                    or not self.repeat.due(f"{r}/", step, self.settings.repeat_every_steps)):
                continue
            out.append(self._finding(rec, r, step, float(values[i]), centre, sigma, z, count,
                                     st.since if st.since is not None else step, len(ranks)))
        return out

    def _finding(self, rec: StepRecord, rank: int, step: int, loss: float, centre: float,
                 sigma: float, z: float, count: int, since: int, n: int) -> Finding:
        host = self.ctx.rank(rank).host
        where = f" (host {host})" if host else ""
        side = "above" if z > 0 else "below"
        window = self.settings.rank_outlier_window
        msg = (f"rank {rank}{where}: local loss {fmt(loss)} vs its peers' median "
               f"{fmt(centre)}, {abs(z):.0f} peers' sigmas {side} them in {count} of the "
               f"last {window} steps, since step {since} (a sick GPU or a corrupt data shard "
               f"on that rank)")
        evidence = {"rank": rank, "host": host, "z": z, "loss": loss, "peers_median": centre,
                    "peers_sigma": sigma, "since_step": since, "outlying_steps": count,
                    "window": window, "ranks": n}
        found = self.finding(rec, msg, value=loss, evidence=evidence,
                             threshold=centre + math.copysign(self.settings.rank_outlier_z
                                                              * sigma, z),
                             suggestions=RANK_OUTLIER)
        return dataclasses.replace(found, rank=rank, step=step)

    def snapshot_extra(self) -> dict[str, Any]:
        return {"losses": {str(s): {str(r): v for r, v in by.items()}
                           for s, by in self.losses.items()}}

    def restore_extra(self, data: dict[str, Any]) -> None:
        self.losses = {int(s): {int(r): float(v) for r, v in by.items()}
                       for s, by in (data.get("losses") or {}).items()}


def peer_stats(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, its peers' median and sigma at one step (the rank itself left out).

    Up to ``_PAIRWISE_MAX`` peers, each rank's peers are taken apart (``_spread``). Beyond,
    where the MAD measures sigma, the values are sorted once and each rank's leave-one-out
    median read off the sorted array (the median of the rest is the middle of the sorted
    array with one index skipped); its peers' MAD likewise from the sorted distances to
    that median, which takes at most three values over all ranks. O(ranks log ranks) per
    step instead of O(ranks^2), and the very same numbers: the same multisets, sorted.

        >>> v = np.array([2.0, 2.1, 1.9, 2.05, 6.0] * 4)
        >>> centres, spreads = peer_stats(v)
        >>> slow = [(median(np.delete(v, i)), _spread(np.delete(v, i), median(np.delete(v, i))))
        ...         for i in range(len(v))]
        >>> [(float(c), float(s)) for c, s in zip(centres, spreads)] == slow
        True
    """
    n = len(values)
    if n - 1 <= _PAIRWISE_MAX:
        centres = np.empty(n)
        spreads = np.empty(n)
        for i in range(n):
            peers = np.delete(values, i)
            centres[i] = median(peers)
            spreads[i] = _spread(peers, centres[i])
        return centres, spreads
    order = np.argsort(values, kind="stable")
    pos = np.empty(n, dtype=np.intp)
    pos[order] = np.arange(n)
    centres = _loo_median(values[order], pos)
    spreads = np.empty(n)
    for c in np.unique(centres):  # at most three
        group = np.flatnonzero(centres == c)
        dist = np.abs(values - c)
        dorder = np.argsort(dist, kind="stable")
        dpos = np.empty(n, dtype=np.intp)
        dpos[dorder] = np.arange(n)
        spreads[group] = MAD_TO_SIGMA * _loo_median(dist[dorder], dpos)[group]
    return centres, spreads


def _loo_median(ordered: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """For each element (at ``pos`` in the sorted ``ordered``), the median of the others."""
    m = len(ordered) - 1
    lo, hi = (m - 1) // 2, m // 2
    return 0.5 * (ordered[lo + (lo >= pos)] + ordered[hi + (hi >= pos)])


def _spread(peers: np.ndarray, centre: float) -> float:
    """The peers' sigma at one step, unbiased whatever their number: the median of their
    pairwise distances over its Gaussian value, sqrt(2) * 0.6745 sigma (a MAD of an odd
    number of peers counts the median's own zero distance, and of three peers reads a
    third of sigma). Past ``_PAIRWISE_MAX`` peers the MAD is as good and O(n)."""
    if len(peers) > _PAIRWISE_MAX:
        return MAD_TO_SIGMA * median(np.abs(peers - centre))
    i, j = np.triu_indices(len(peers), k=1)
    return median(np.abs(peers[i] - peers[j])) / _PAIR_TO_SIGMA
