"""``grad_explosion``: the gradient norm far above its own recent level, and staying there.

Statistic (global): ``r = log(grad_norm) - median`` of the last ``baseline_window`` log grad
norms, in units of their robust spread ``sigma = MAD_TO_SIGMA * MAD``. A step is *elevated* when
``r >= log(explosion_ratio)`` (a floor: at least 3x, so a smooth run's tiny MAD cannot make
noise an explosion) and ``r >= explosion_z * sigma`` (6 sigma: a tail a healthy run's
gradient noise does not reach on one step, let alone on several; at low loss a CNN's grad
norm swings 50x from batch to batch, and its sigma says so). It fires on
``explosion_steps`` elevated steps in a row, or on ``explosion_steps`` isolated spikes
within ``explosion_window`` (50) steps, consecutive or not, rising from a level still in
its band (the median of the last 10 norms under the ratio floor): a gradient that stays
blown up, or keeps being kicked out of its band, is an optimizer driving the weights
somewhere bad (an LR too high: AdamW after an LR jump spikes 4-15x with collapsed norms
between, rarely twice in a row). One huge batch that the next steps forget is a bad batch,
reported by ``loss_spike`` instead. The window: on the healthy public and corpus runs
(40,850 steps) a step beyond the band occurs 2.9 times per 10,000 steps, so 3 within 50
steps by chance is of order C(50,3) p^3 = 5e-7 per window; and 50 is half the baseline
window, so the median the spikes are judged against is still the level before them. A
gradient whose whole level drifts up (a deep tanh net leaving its plateau) is not spikes:
the in-a-row rule judges it. A streak cut short by a non-finite gradient (it outgrew the
float range) fires on that step. Every finding carries ``onset_step``: the first spike in
the window (per parameter: the first reading of its streak).

Per parameter: its grad norm ``layer_explosion_ratio`` x its own EMA (log space) on
``explosion_steps`` readings in a row, the EMA frozen while the streak lasts (so the
explosion does not become its own baseline).

The global finding names the parameter that left its own band first (``support/layer_bands.py``):
where to look, in the page and as ``first_layer_out`` in the evidence.

Warmup-aware: while the learning rate warms up, large gradient norms are normal, so the
ratio floors are multiplied by ``explosion_warmup_factor``. Overflow steps of a loss scaler
are not gradients and are skipped.

A grad norm around 1.0 for 100 steps (past the default 50 warmup steps), then 8, 15 and 40
in a row::

    >>> import math
    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> grads = [1 + 0.3 * math.sin(5 * s) for s in range(1, 101)] + [8.0, 15.0, 40.0]
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "grad_norm": g}) for s, g in enumerate(grads, start=1)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('grad_explosion', 103, 'error')]
    >>> print(found[0].message)
    grad norm 40 is 40x its median 1.01 (12 sigma) and has stayed at least 8.1x for 3 steps in a
    row
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.layer_bands import locate
from monitor_agent.detectors.support.layer_stats import LayerEma
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.slots import grown
from monitor_agent.detectors.support.stats import Window, amp_overflow, finite
from monitor_agent.records.types import Finding, LayerTable, Severity, StepRecord

LAYER_ALPHA = 0.95  # per-layer baseline: about the last 20 steps
LEVEL_STEPS = 10  # the level isolated spikes rise from: the median of this many steps
SIGMA_FLOOR = 1e-3  # log units: a perfectly constant grad norm still has rounding noise


GRAD_EXPLOSION = (
    "Lower the learning rate; the gradient norm has stayed far above its history for "
    "several steps (an LR jump outside the schedule is named in the summary as the likely "
    "cause).",
    "Enable or tighten gradient clipping.",
    "Check the layers named in the evidence for missing normalisation or a bad init.",
)

GRAD_EXPLOSION_CLIPPED = (
    "Lower the learning rate; the gradient norm has stayed far above its history for "
    "several steps (an LR jump outside the schedule is named in the summary as the likely "
    "cause).",
    "Clipping is on, so each update is bounded, but the optimizer keeps being pushed off "
    "course: clipping hides the cause, it does not fix it.",
    "Check the layers named in the evidence for missing normalisation or a bad init.",
)


class GradExplosionSettings(SharedSettings):
    """The knobs of ``grad_explosion`` (``detectors:`` in the sidecar's config)."""

    explosion_ratio: float = Field(
        default=3.0, gt=1, description="grad norm / its rolling median each step of an explosion "
        "must reach (a floor under explosion_z)..."
    )
    explosion_z: float = Field(
        default=6.0, gt=0,
        description="...and this many robust sigmas (MAD of log grad norm) above the median...",
    )
    explosion_steps: int = Field(
        default=3, ge=1,
        description="...on this many steps in a row, or this many isolated spikes within "
        "explosion_window steps (one bad batch is a loss_spike).",
    )
    explosion_window: int = Field(
        default=50, ge=1,
        description="Steps within which explosion_steps isolated spikes (the level between "
        "them back in its band) are an explosion.",
    )
    explosion_warmup_factor: float = Field(
        default=5.0, ge=1, description="During warmup the explosion ratio is multiplied by this."
    )
    layer_explosion_ratio: float = Field(
        default=100.0, gt=1, description="A parameter's grad norm / its own EMA that is an "
        "explosion (explosion_steps readings in a row)."
    )


@dataclass(slots=True)
class ExplosionState:
    grads: Window
    streak: int = 0
    streak_min_ratio: float = math.inf
    spikes: list[int] = field(default_factory=list)  # steps of the spikes in the window
    layers: LayerEma = field(default_factory=LayerEma)
    layer_streak: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    layer_onset: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class GradExplosionDetector(DetectorBase[GradExplosionSettings]):
    """Error when the grad norm stays far above its median (see module docstring)."""

    type = "grad_explosion"
    severity = Severity.ERROR
    settings_model = GradExplosionSettings

    def new_rank(self) -> ExplosionState:
        return ExplosionState(grads=Window.of(self.settings.baseline_window))

    def on_step(self, rec: StepRecord, st: ExplosionState) -> list[Finding]:
        if amp_overflow(rec):
            return []
        found = locate(self._global(rec, st), self.ctx.rank(rec.rank).bands, self.ctx)
        if rec.layers is not None:
            layer_found = self._per_layer(rec, rec.layers, st)
            found = found or layer_found
        return found

    def _warm(self, rec: StepRecord) -> float:
        return self.settings.explosion_warmup_factor if self.ctx.in_warmup(rec.step) else 1.0

    # -- global -----------------------------------------------------------------------------

    def _global(self, rec: StepRecord, st: ExplosionState) -> list[Finding]:
        if not finite(rec.grad_norm) or rec.grad_norm <= 0:
            found = self._overflowed(rec, st) if rec.grad_norm is not None else []
            st.streak, st.streak_min_ratio = 0, math.inf
            return found
        log_g = math.log(rec.grad_norm)
        found = []
        if len(st.grads) >= self.settings.min_history_steps:
            found = self._judge(rec, st, log_g)
        st.grads.add(log_g)
        return found

    def _judge(self, rec: StepRecord, st: ExplosionState, log_g: float) -> list[Finding]:
        s = self.settings
        median, sigma = st.grads.median(), max(st.grads.mad(), SIGMA_FLOOR)
        r = log_g - median
        floor = s.explosion_ratio * self._warm(rec)
        st.spikes = [k for k in st.spikes if k > rec.step - s.explosion_window]
        if r < math.log(floor) or r < s.explosion_z * sigma:
            st.streak, st.streak_min_ratio = 0, math.inf
            return []
        st.streak += 1
        st.streak_min_ratio = min(st.streak_min_ratio, math.exp(r))
        st.spikes.append(rec.step)
        # The level the spikes rise from: the median of the last few steps before this one.
        # Isolated spikes rise from a level still in its band; a level that moved up as a
        # whole is a drift of the gradient (judged by the in-a-row rule), not spikes.
        level = math.exp(float(np.median(st.grads.values()[-LEVEL_STEPS:])) - median)
        isolated = len(st.spikes) >= s.explosion_steps and level < floor
        if (st.streak < s.explosion_steps and not isolated) or not self.due(rec):
            return []
        ratio, base = math.exp(r), math.exp(median)
        if st.streak >= s.explosion_steps:
            msg = (f"grad norm {fmt(rec.grad_norm)} is {ratio:.0f}x its median {fmt(base)} "
                   f"({r / sigma:.0f} sigma) and has stayed at least "
                   f"{st.streak_min_ratio:.1f}x for {st.streak} steps in a row")
        else:
            msg = (f"grad norm {fmt(rec.grad_norm)} is {ratio:.0f}x its median {fmt(base)} "
                   f"({r / sigma:.0f} sigma), spike {len(st.spikes)} beyond its band "
                   f"in {rec.step - st.spikes[0] + 1} steps (since step {st.spikes[0]}), "
                   f"with the norm back near its level between them")
        evidence = {"onset_step": st.spikes[0], "spikes_in_window": len(st.spikes),
                    "window_steps": s.explosion_window, "level_ratio": level,
                    "grad_norm": rec.grad_norm, "median": base, "ratio": ratio,
                    "z": r / sigma, "consecutive_steps": st.streak,
                    "min_ratio_in_streak": st.streak_min_ratio, "limit_ratio": floor,
                    "limit_z": s.explosion_z, "in_warmup": self.ctx.in_warmup(rec.step),
                    "clip_threshold": rec.clip_threshold, "lr": rec.lr, "loss": rec.loss}
        clipped = finite(rec.clip_threshold) and rec.clip_threshold > 0
        return [self.finding(rec, msg, value=rec.grad_norm, threshold=base, evidence=evidence,
                             suggestions=GRAD_EXPLOSION_CLIPPED if clipped
                             else GRAD_EXPLOSION)]

    def _overflowed(self, rec: StepRecord, st: ExplosionState) -> list[Finding]:
        """A streak cut short by a non-finite gradient: it blew past what a float holds,
        which is the explosion completing, not recovering."""
        if st.streak == 0 or st.streak >= self.settings.explosion_steps or not self.due(rec):
            return []
        base = math.exp(st.grads.median())
        msg = (f"grad norm went {rec.grad_norm} after {st.streak} step(s) at least "
               f"{st.streak_min_ratio:.1f}x its median {fmt(base)}")
        evidence = {"onset_step": st.spikes[0] if st.spikes else rec.step,
                    "grad_norm": rec.grad_norm, "median": base,
                    "consecutive_steps": st.streak + 1,
                    "min_ratio_in_streak": st.streak_min_ratio,
                    "clip_threshold": rec.clip_threshold, "lr": rec.lr, "loss": rec.loss}
        return [self.finding(rec, msg, value=rec.grad_norm, threshold=base, evidence=evidence,
                             suggestions=GRAD_EXPLOSION)]

    # -- per parameter ----------------------------------------------------------------------

    def _per_layer(self, rec: StepRecord, table: LayerTable, st: ExplosionState
                   ) -> list[Finding]:
        view = self.ctx.align(table)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(table.stats["grad_norm"])
        logs = np.where(np.isfinite(logs), logs, np.nan)
        before = st.layers.value(view.slots, LAYER_ALPHA, view.size)
        count = st.layers.count(view.slots, view.size)
        ratio = np.exp(logs - before)
        ratio[(count < self.settings.min_history_steps) | ~np.isfinite(ratio)] = 0.0
        limit = self.settings.layer_explosion_ratio * self._warm(rec)
        hit = ratio >= limit
        st.layer_streak = grown(st.layer_streak, view.size, 0)
        st.layer_onset = grown(st.layer_onset, view.size, 0)
        streak = st.layer_streak
        st.layer_onset[view.slots] = np.where(hit & (streak[view.slots] == 0), rec.step,
                                              st.layer_onset[view.slots])
        streak[view.slots] = np.where(hit, streak[view.slots] + 1, 0)
        # The streak's readings stay out of the baseline: it must not learn the explosion.
        st.layers.add(view.slots, np.where(hit, np.nan, logs), LAYER_ALPHA, view.size)
        n = self.settings.explosion_steps
        hits = np.flatnonzero(streak[view.slots] >= n)
        found = []
        for c in hits[np.argsort(-ratio[hits])][: self.settings.max_layer_findings]:
            name = table.names[c]
            if not self.due(rec, name):
                continue
            g, k = float(table.stats["grad_norm"][c]), int(streak[view.slots[c]])
            msg = (f"{name}: grad norm {fmt(g)} is {ratio[c]:.0f}x its level before, "
                   f"at least {limit:.0f}x for {k} steps in a row")
            found.append(self.finding(
                rec, msg, value=g, threshold=g / ratio[c], layer=name,
                evidence={"onset_step": int(st.layer_onset[view.slots[c]]),
                          "ratio": float(ratio[c]), "limit_ratio": limit,
                          "consecutive_steps": k},
                suggestions=GRAD_EXPLOSION,
            ))
        return found
