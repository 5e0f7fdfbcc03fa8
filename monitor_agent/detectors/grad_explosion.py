"""``grad_explosion``: the gradient norm far above its own recent level, and staying there
(or leaving it again and again).

Statistic (global): ``r = log(grad_norm) - median`` of the last ``baseline_window`` log grad
norms, in units of their robust spread ``sigma = MAD_TO_SIGMA * MAD``. A step is *elevated* when
``r >= log(explosion_ratio)`` (a floor: at least 3x, so a smooth run's tiny MAD cannot make
noise an explosion) and ``r >= explosion_z * sigma`` (6 sigma: a tail a healthy run's
gradient noise does not reach on one step, let alone on several; at low loss a CNN's grad
norm swings 50x from batch to batch, and its sigma says so).

**Burst, explosion, recurring.** Out-of-band steps come as *episodes* (a new one when the
last was more than 10 steps back). What they are:

* a *burst*: ``explosion_steps`` elevated steps in a row, or ``explosion_steps`` isolated
  spikes within ``explosion_window`` (50) steps rising from a level still in its band (the
  median of the last 10 norms under the ratio floor), all within
  ``explosion_burst_steps`` (20) of the first, with the lr where it was: bad batches
  (random labels, a corrupt shard, inputs x30), which the run recovers from once they
  stop. That is a ``loss_spike`` (warning), not this page; 20 is the longest burst of bad
  batches we record as a spike (``tests/traces/classes``, bursts of 1..20), the same limit
  ``divergence`` waits out.
* an *explosion* (this page): the same, and the cause still applied - the lr is
  ``explosion_lr_jump`` (2) x its median from before the episode (an LR jump the optimizer
  applies again every step: AdamW after one spikes 4-15x with collapsed norms between,
  rarely twice in a row), paged at once; or out-of-band steps still coming more than
  ``explosion_burst_steps`` after the first (a gradient that stays blown up, or whose whole
  level drifts up, as a deep tanh net leaving its plateau); or a streak cut short by a
  non-finite gradient (it outgrew the float range), on that step; or a burst after which
  the norm did not come back: the median of the 10 steps after its last spike still beyond
  the ratio floor and ``explosion_z`` sigmas of the median before it, either way (inputs
  x100 blow a ReLU net's gradient up 1000x for 6 steps, then leave it a tenth of its
  level: the weights were damaged), paged then, dated to the burst. The in-a-row and
  isolated rules' chance: a step beyond the band occurs 2.9 times per 10,000 healthy steps
  (public and corpus, 40,850 steps), so 3 within 50 by chance is of order
  C(50,3) p^3 = 5e-7 per window; 50 is half the baseline window, so the median the spikes
  are judged against is still the level before them.
* *recurring* (this page): ``explosion_recur_count`` (5) separate episodes within
  ``explosion_recur_window`` (1000) steps, or ``explosion_recur_decades`` (3) of them whose
  peak is ``explosion_recur_ratio`` (10) x the median or more - an order of magnitude, the
  same kind of outlier each time - whatever their spacing (one batch with inputs x30 every
  35-70 steps: each alone a bad batch, too far apart for the 50-step window), with the
  count, the mean period and the gaps in the message. Its false rate: on the recorded runs
  with no expected finding (public, corpus, classes, origin and the shapes tune half:
  54,400 steps) episodes occur 2.6 times per 10,000 steps, never more than 2 within 1000
  steps, and episodes 10x out 0.37 times per 10,000 steps, never 2 within 1000. As Poisson
  counts, 5 or more of mean 0.26 per 1000 steps is 7e-6 per window, 3 or more of mean
  0.037 is 8e-6: about 1e-4 per 10,000 steps each (windows slide). 1000 steps is ten
  baseline windows: a slow pattern still shows, while one healthy run's handful of
  outliers does not add up.

One huge batch that the next steps forget is a bad batch, reported by ``loss_spike``.
Every finding carries ``rule`` (``in_a_row``, ``isolated``, ``recurring``) and
``onset_step``: the first spike in the window, or the first episode of a recurring one (per
parameter: the first reading of its streak).

Per parameter: its grad norm ``layer_explosion_ratio`` x its own EMA (log space) on
``explosion_steps`` readings in a row, the EMA frozen while the streak lasts (so the
explosion does not become its own baseline).

The global finding names the parameter that left its own band first (``support/layer_bands.py``):
where to look, in the page and as ``first_layer_out`` in the evidence.

Warmup-aware: while the learning rate warms up, large gradient norms are normal, so the
ratio floors are multiplied by ``explosion_warmup_factor``. Overflow steps of a loss scaler
are not gradients and are skipped.

A grad norm around 1.0 for 100 steps (past the default 50 warmup steps) at lr 0.001, then
the lr x10 and the norm 8, 15 and 40 in a row::

    >>> import math
    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> grads = [1 + 0.3 * math.sin(5 * s) for s in range(1, 101)] + [8.0, 15.0, 40.0]
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "grad_norm": g, "lr": 0.001 if s <= 100 else 0.01})
    ...          for s, g in enumerate(grads, start=1)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('lr_jump', 101, 'warning'), ('grad_explosion', 103, 'error')]
    >>> print(found[1].message)
    grad norm 40 is 40x its median 1.01 (12 sigma) and has stayed at least 8.1x for 3 steps in a
    row; the lr 0.01 is 10x its median 0.001 from before it (the cause is still applied); likely
    cause: LR x10 at step 101: 0.001 -> 0.01, outside the run's schedule

The same three steps with the lr unchanged, then the norm back at its level, are a burst of
bad batches the run recovers from: no page (``loss_spike`` reports the batches' loss)::

    >>> suite = DetectorSuite(DetectorSettings())
    >>> grads = grads + [1.0] * 30
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "grad_norm": g, "lr": 0.001}) for s, g in enumerate(grads, start=1)]
    >>> [f.type for rec in steps for f in suite.update(rec)]
    []
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
    explosion_burst_steps: int = Field(
        default=20, ge=1,
        description="The longest burst of bad batches that is a loss_spike, not an "
        "explosion: out-of-band steps within this many steps of the first, with no raised lr "
        "behind them, wait for more evidence.",
    )
    explosion_lr_jump: float = Field(
        default=2.0, gt=1,
        description="An lr this many times its median from before the first out-of-band step "
        "is a cause still applied: the in-a-row and isolated rules page at once.",
    )
    explosion_recur_count: int = Field(
        default=5, ge=2,
        description="Separate out-of-band episodes within explosion_recur_window steps that "
        "are a recurring gradient problem, whatever their spacing...",
    )
    explosion_recur_window: int = Field(
        default=1000, ge=1, description="...within this many steps.",
    )
    explosion_recur_ratio: float = Field(
        default=10.0, gt=1,
        description="An episode whose peak is this many times the median (an order of "
        "magnitude) counts toward explosion_recur_decades...",
    )
    explosion_recur_decades: int = Field(
        default=3, ge=2,
        description="...and this many of them within explosion_recur_window steps are a "
        "recurring problem too.",
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
    episodes: list[int] = field(default_factory=list)  # first steps, in the recur window
    episode_peaks: list[float] = field(default_factory=list)  # the peak ratio of each
    last_spike: int = -1
    lrs: Window = field(default_factory=lambda: Window.of(0))  # log lr
    lr_before: float | None = None  # the lr median before the current episode
    # A burst not paged yet: its first step, and the log median and sigma before it; judged
    # once LEVEL_STEPS steps after its last spike show whether the norm came back.
    burst_onset: int = -1
    burst_median: float = math.nan
    burst_sigma: float = math.nan
    layers: LayerEma = field(default_factory=LayerEma)
    layer_streak: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    layer_onset: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class GradExplosionDetector(DetectorBase[GradExplosionSettings]):
    """Error when the grad norm stays far above its median (see module docstring)."""

    type = "grad_explosion"
    severity = Severity.ERROR
    settings_model = GradExplosionSettings

    def new_rank(self) -> ExplosionState:
        n = self.settings.baseline_window
        return ExplosionState(grads=Window.of(n), lrs=Window.of(n))

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
        if rec.grad_norm is None:  # not measured (a writer that sends it on some steps
            return []              # only): no reading, so it neither breaks nor extends a streak
        if not finite(rec.grad_norm) or rec.grad_norm <= 0:
            found = self._overflowed(rec, st)
            st.streak, st.streak_min_ratio = 0, math.inf
            return found
        log_g = math.log(rec.grad_norm)
        found = []
        if len(st.grads) >= self.settings.min_history_steps:
            found = self._judge(rec, st, log_g)
        st.grads.add(log_g)
        if finite(rec.lr) and rec.lr > 0 and st.last_spike != rec.step:
            st.lrs.add(math.log(rec.lr))
        return found

    def _episode(self, rec: StepRecord, st: ExplosionState, ratio: float) -> None:
        """Count this out-of-band step into its episode: a new one when the last spike is
        more than ``LEVEL_STEPS`` back (a burst of bad batches is one episode, however many
        of its steps leave the band)."""
        s = self.settings
        if st.last_spike < 0 or rec.step - st.last_spike > LEVEL_STEPS:
            st.episodes.append(rec.step)
            st.episode_peaks.append(0.0)
            st.lr_before = (math.exp(st.lrs.median())
                            if len(st.lrs) >= s.min_history_steps else None)
        st.episode_peaks[-1] = max(st.episode_peaks[-1], ratio)
        st.last_spike = rec.step
        keep = [i for i, k in enumerate(st.episodes) if k > rec.step - s.explosion_recur_window]
        st.episodes = [st.episodes[i] for i in keep]
        st.episode_peaks = [st.episode_peaks[i] for i in keep]

    def _recurring(self, st: ExplosionState) -> list[int] | None:
        """The first steps of the episodes that make a recurring problem, None if none do:
        ``explosion_recur_count`` episodes in the window, or ``explosion_recur_decades`` of
        them an order of magnitude out (module docstring)."""
        s = self.settings
        if len(st.episodes) >= s.explosion_recur_count:
            return st.episodes
        big = [k for k, peak in zip(st.episodes, st.episode_peaks, strict=True)
               if peak >= s.explosion_recur_ratio]
        return big if len(big) >= s.explosion_recur_decades else None

    def _lr_raised(self, rec: StepRecord, st: ExplosionState) -> float | None:
        """The lr over its median from before the episode, when at least
        ``explosion_lr_jump``: the cause is still applied."""
        if st.lr_before is None or not finite(rec.lr) or st.lr_before <= 0:
            return None
        ratio = rec.lr / st.lr_before
        return ratio if ratio >= self.settings.explosion_lr_jump else None

    def _judge(self, rec: StepRecord, st: ExplosionState, log_g: float) -> list[Finding]:
        s = self.settings
        median, sigma = st.grads.median(), max(st.grads.mad(), SIGMA_FLOOR)
        r = log_g - median
        floor = s.explosion_ratio * self._warm(rec)
        st.spikes = [k for k in st.spikes if k > rec.step - s.explosion_window]
        if r < math.log(floor) or r < s.explosion_z * sigma:
            st.streak, st.streak_min_ratio = 0, math.inf
            return self._after_burst(rec, st, log_g)
        st.streak += 1
        st.streak_min_ratio = min(st.streak_min_ratio, math.exp(r))
        st.spikes.append(rec.step)
        self._episode(rec, st, math.exp(r))
        # The level the spikes rise from: the median of the last few steps before this one.
        # Isolated spikes rise from a level still in its band; a level that moved up as a
        # whole is a drift of the gradient (judged by the in-a-row rule), not spikes.
        level = math.exp(float(np.median(st.grads.values()[-LEVEL_STEPS:])) - median)
        isolated = len(st.spikes) >= s.explosion_steps and level < floor
        # Persisting, not a burst the run will recover from: the lr that rose with it is
        # still raised, or out-of-band steps still come past the longest burst we class as
        # a loss_spike (module docstring).
        lr_up = self._lr_raised(rec, st)
        lasted = rec.step - st.spikes[0] + 1
        persists = lr_up is not None or lasted > s.explosion_burst_steps
        episodes = self._recurring(st)
        recurring = episodes is not None
        burst = st.streak >= s.explosion_steps or isolated
        if burst and st.burst_onset < 0:
            st.burst_onset, st.burst_median, st.burst_sigma = st.spikes[0], median, sigma
        if not ((burst and persists) or recurring):
            return []
        st.burst_onset = -1
        if not self.due(rec):
            return []
        ratio, base = math.exp(r), math.exp(median)
        why = (f"; the lr {fmt(rec.lr)} is {lr_up:.0f}x its median {fmt(st.lr_before)} from "
               f"before it (the cause is still applied)" if lr_up is not None else "")
        if episodes is not None and not (burst and persists):
            span = rec.step - episodes[0]
            gaps = np.diff(episodes)
            far = ("" if len(episodes) >= s.explosion_recur_count
                   else f" at least {s.explosion_recur_ratio:.0f}x")
            msg = (f"grad norm {fmt(rec.grad_norm)} is {ratio:.0f}x its median {fmt(base)} "
                   f"({r / sigma:.0f} sigma): out of its band{far} {len(episodes)} separate "
                   f"times in {span + 1} steps (since step {episodes[0]}), about every "
                   f"{span / (len(episodes) - 1):.0f} steps (gaps {int(gaps.min())}-"
                   f"{int(gaps.max())}), with the norm back at its level between them: a "
                   f"recurring gradient problem, not one bad batch")
            rule, onset = "recurring", episodes[0]
        elif st.streak >= s.explosion_steps:
            msg = (f"grad norm {fmt(rec.grad_norm)} is {ratio:.0f}x its median {fmt(base)} "
                   f"({r / sigma:.0f} sigma) and has stayed at least "
                   f"{st.streak_min_ratio:.1f}x for {st.streak} steps in a row{why}")
            rule, onset = "in_a_row", st.spikes[0]
        else:
            msg = (f"grad norm {fmt(rec.grad_norm)} is {ratio:.0f}x its median {fmt(base)} "
                   f"({r / sigma:.0f} sigma), spike {len(st.spikes)} beyond its band "
                   f"in {rec.step - st.spikes[0] + 1} steps (since step {st.spikes[0]}), "
                   f"with the norm back near its level between them{why}")
            rule, onset = "isolated", st.spikes[0]
        evidence = {"rule": rule, "onset_step": onset, "spikes_in_window": len(st.spikes),
                    "episodes": len(st.episodes), "recur_window_steps": s.explosion_recur_window,
                    "lr_before": st.lr_before, "lasted_steps": lasted,
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

    def _after_burst(self, rec: StepRecord, st: ExplosionState, log_g: float) -> list[Finding]:
        """A burst that ended: ``LEVEL_STEPS`` steps after its last spike, the median of
        those steps against the median before it. Back within its band (under the ratio
        floor and ``explosion_z`` sigmas either way): the run recovered, a loss_spike's.
        Not back - collapsed far below it (the blow-up killed units: inputs x100 leave a
        ReLU net with a tenth of its gradient) or stuck above it - is the explosion's
        damage: paged now, dated to the burst."""
        s = self.settings
        if st.burst_onset < 0 or rec.step - st.last_spike < LEVEL_STEPS:
            return []
        onset, st.burst_onset = st.burst_onset, -1
        after = np.append(st.grads.values()[-(LEVEL_STEPS - 1):], log_g)
        shift = float(np.median(after)) - st.burst_median
        limit = max(math.log(s.explosion_ratio * self._warm(rec)),
                    s.explosion_z * st.burst_sigma)
        if abs(shift) < limit or not self.due(rec):
            return []
        base, level = math.exp(st.burst_median), math.exp(st.burst_median + shift)
        way = "below" if shift < 0 else "above"
        msg = (f"grad norm blew up from step {onset} to {st.last_spike} and did not come "
               f"back: its median over the {LEVEL_STEPS} steps since is {fmt(level)}, "
               f"{math.exp(abs(shift)):.0f}x {way} its median {fmt(base)} before "
               f"({abs(shift) / st.burst_sigma:.0f} sigma): the weights were damaged, not one "
               f"bad batch")
        evidence = {"rule": "not_recovered", "onset_step": onset,
                    "last_spike_step": st.last_spike, "level_after": level, "median": base,
                    "ratio": level / base, "z": shift / st.burst_sigma,
                    "grad_norm": rec.grad_norm, "lr": rec.lr, "loss": rec.loss,
                    "clip_threshold": rec.clip_threshold}
        return [self.finding(rec, msg, value=level, threshold=base, evidence=evidence,
                             suggestions=GRAD_EXPLOSION)]

    def _overflowed(self, rec: StepRecord, st: ExplosionState) -> list[Finding]:
        """A streak cut short by a non-finite gradient: it blew past what a float holds,
        which is the explosion completing, not recovering."""
        if st.streak == 0 or not self.due(rec):
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
        if not hit.any():  # most steps: no streak goes on, every reading joins its baseline
            streak[view.slots] = 0
            st.layers.add(view.slots, logs, LAYER_ALPHA, view.size)
            return []
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
