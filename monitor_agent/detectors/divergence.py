"""``divergence``: the loss climbing away from where the run had got to, and staying there.

Three rules, all in units of the run's own noise and progress; each needs the condition on
several steps in a row, because one bad batch rises once and falls back:

* level (the main rule): the median log-loss of the last ``divergence_window`` steps
  against the median of the ``baseline_window`` steps before them, or the lowest such
  full-window median since warmup when that is lower (a slow creep drags the earlier
  window along with it; a 100-step median is a level, unlike the lowest single value,
  which in a noisy series is its most extreme outlier). The noise is
  ``sigma = MAD_TO_SIGMA * MAD`` of the first differences of the earlier log-losses over
  sqrt(2) (differences remove the downward trend), and the standard error of the
  difference of the two medians is ``1.2533 * sigma * sqrt(1/k + 1/n)``. The recent level
  must be ``divergence_z`` standard errors above the earlier one, at least
  ``divergence_rise`` above it as a ratio, and must have given back at least
  ``divergence_progress`` of what the run had learnt (start level minus earlier level) -
  the absolute floor that keeps a noisy near-zero classification loss (0.036 -> 0.075 out
  of a start at 2.3) from ever counting, however large its ratio. Never compared with the
  lowest value seen: the minimum of a noisy series is its most extreme outlier.

  A level shift that persists is a divergence; a burst of bad batches that returns to its
  level is a ``loss_spike`` (the remedies differ: roll back vs skip), and for as long as
  the bad batches last the two look the same. So the level rule fires only on evidence
  that the shift persists, while all three conditions hold on every step since:

  - its cause is still applied: the lr is at least ``divergence_lr_jump`` x its median
    from before the rise (an LR jump the optimizer applies again every step), after
    ``divergence_hold`` steps; or
  - time: ``divergence_persist`` (30) steps from the onset, the longest burst of bad
    batches we class as a spike (20 in a row: a bad shard or file; bursts of 1..20 are
    recorded in ``tests/traces/classes``) plus one recent window (10), so that the recent
    median is made of post-burst steps only; and the level has given back less than
    ``divergence_give_back`` (half) of its excursion, peak recent median minus the
    reference, in the excursion's own units: once bad batches stop, the loss on good data
    falls at once from the loss on bad ones, even if the damaged model needs a while to
    re-learn (a CNN knocked to chance by 20 of them sits at chance, far below its
    burst's peak); a divergence holds on to its level; or
  - a whole ``baseline_window`` (100 steps) from the onset without coming back, whatever
    the shape (a divergence that overshot and settled higher).

  The time and whole-window rules take "it holds" from the run itself where it has shown
  otherwise: a level that has risen, held past ``divergence_persist`` steps and come back
  on its own without paging is the run's own level swing (a DQN's TD loss rises 5-40x at
  each target-network sync and settles within 50 steps, ``tests/traces/shapes``
  ``h_dqn_s1``), and a new rise no higher than the largest level such a swing still held
  at that age (``recovered_rise`` in the evidence) shows no persistence the run has not
  already recovered from. The cause rule (a raised lr still applied) is not affected:
  the optimizer's cause is no part of the run's own dynamics. A burst of bad batches
  that came back within ``divergence_persist`` steps counts for nothing here (it never
  held that long), so a later divergence is judged as before.

  Measured on the class recordings' held-out seeds (``bench/detection.py``): divergence
  precision 33% -> 90%; the LR-kept runs are paged as early as before (the cause rule);
  a shift with no LR behind it is paged 30 steps after its onset instead of about 8
  (``dead_relu_mlp``'s bias shift at step 200: paged at 230 instead of 208).
* runaway: ``divergence_steps`` consecutive steps on which the loss rose, stands above
  ``divergence_ratio`` x its EMA and above the progress floor, while the grad norm also
  rose and stands above ``divergence_grad_ratio`` x its median (an LR too high, caught
  before the NaN); a shorter streak that ends in a non-finite loss fires on that step.
  A ratio says something only against the loss's own noise: 1.2x is 2.4 per-step sigmas
  of a GPT's log-loss (sigma 0.075) and a fifth of one of a DQN's TD loss near zero, whose
  batches swing by 10x. So each rising step must also stand ``divergence_runaway_z`` (3)
  per-step sigmas of the log-loss (the earlier window's, as the level rule measures it)
  above the EMA: a single step that far up is a tail one step in 700 reaches, three rising
  in a row with the gradient is none; where the noise is narrow the ratio binds first, as
  before (the recorded LR runaways on a GPT stand 3.2-18 sigmas up from their first step).
* jump: after warmup, ``divergence_hold`` consecutive steps whose update/param ratio is
  above the hard limit ``update_ratio_max`` (each step rewrote over 10% of the weights)
  and ``divergence_jump`` x its rolling median: an LR jump the optimizer keeps applying,
  seen before the loss has moved much. Plain SGD at the edge of stability makes a few
  such steps on its own and recovers (a catapult); an LR that stays too high keeps
  making them, hence the same hold as the level rule. When the LR itself is at least
  ``divergence_lr_jump`` x its rolling median on that step, the cause is the LR, which the
  optimizer applies again on every step: judged at once (the earliest warning there is,
  steps before the loss moves).
* early: a loss more than 2**24 times the highest the run had reported (float32's
  significand: every value it knew is below the new one's rounding error), on any step,
  the first included: the size of the jump is its own evidence, so it needs none of the
  history the rules above wait ``min_history_steps`` for (an LBFGS run of 15 steps whose
  loss rose 30 decades; ``support/ceiling.py`` argues the number). Judged where the
  runaway takes ratios (a loss measured from zero).

A divergence the lr rule attributes to a raised lr starts at or after the step the lr rose
(``onset_step``): an excursion that began before it is the run's own (an actor-critic's or
a GAN's loss moves as it learns), so the rule dates the excursion from the lr's rise and
waits until the steps since then hold on their own (``_caused``).

**Losses that are not a positive error falling toward zero** (``support/context.py``'s
``loss_kind``: an RL or TD loss around zero of either sign, a density's NLL, a GAN's):
a ratio or a percentage of a level near zero is any number, and the log of a negative
loss is none. A loss that went below zero, or is declared ``signed``, is judged in its own
linear units: the level rule's rise ``divergence_z`` standard errors of its level noise
(the larger of its per-step noise and the spread of its values: where successive steps are
correlated, as overlapping RL episodes are, differences undercount how far a median
wanders), and at least ``divergence_progress`` of its progress (start median minus the
reference) given back, with no percentage rule; the runaway's loss ``divergence_z`` of
those sigmas above its EMA instead of ``divergence_ratio`` x it. That is for a loss
declared ``signed`` (a density's NLL, which settles to a level of either sign). A loss
that goes below zero with nothing declared, or one declared ``nonstationary`` (``rl``,
``gan``, ...), has no stable level by default - an actor-critic or TD loss moves with its
targets (its payoffs are redrawn, its policy relearns) - so no level rise pages on it,
except one that a raised lr still drives (``divergence_lr_jump`` x its median from before:
the optimizer's, not the environment's); one ``info`` finding says so, once a run.
The runaway rule judges a ratio (in log units, in its own log noise, as for an error)
wherever the loss has stayed positive and is not declared ``signed``, whatever else is
declared: a TD loss declared ``nonstationary`` is still a squared error near zero, whose
batches swing by 10x; in linear units its spread (the MAD of values packed near zero)
would make every such swing dozens of sigmas.

Any kind: a progress (start median minus the reference) under ``divergence_z`` standard
errors of the same noise is no level either - the loss learnt nothing its noise can tell
from chance (a DQN's TD loss sitting near zero from its first steps), so a rise from it is
not judged; the same ``info`` finding says so. The runaway and jump rules, which judge the
gradient and the updates too, still page on such runs.

Every finding names the parameter whose gradient norm left its own band first, when one
has (``support/layer_bands.py``): ``first_layer_out`` and the order in the evidence; and
``onset_step``, the first step its own evidence shows the signal leaving its band (level:
the first step of the recent window above the rise the level needs, or 3 per-step sigmas;
runaway: the first rising step; jump: the first oversized update), which the checkpoint
ledger uses to judge which checkpoint is clean.

A healthy run for 100 steps, then loss and grad norm climbing together for three (a
learning rate too high, caught before the NaN); the first step up gets a ``loss_spike`` of
its own (the gradient, with no raised lr behind it, is ``grad_explosion``'s once it outlasts
a burst of bad batches, or goes non-finite)::

    >>> import math
    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> pairs = [(3.0 * 0.995**s * (1 + 0.03 * math.sin(7 * s)), 1 + 0.2 * math.sin(5 * s))
    ...          for s in range(1, 101)] + [(3.5, 4.0), (9.0, 30.0), (40.0, 900.0)]
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "loss": loss, "grad_norm": grad})
    ...          for s, (loss, grad) in enumerate(pairs, start=1)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('loss_spike', 101, 'warning'), ('divergence', 103, 'error')]
    >>> print(found[1].evidence["rule"], "|", found[1].message)
    runaway | loss rose 3 steps in a row to 40 (from 1.85) while grad norm grew to 900 (896x its
    median 1)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.ceiling import PRECISION, Ceiling, Jump
from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.layer_bands import locate
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import MAD_TO_SIGMA, Window, amp_overflow, finite, median
from monitor_agent.records.types import Finding, Severity, StepRecord

ONSET_Z = 3.0  # per-step sigmas above the reference that date a level rise's onset
MEDIAN_SE = 1.2533  # standard error of a median of n normal values: 1.2533 sigma / sqrt(n)


DIVERGENCE = (
    "Lower the learning rate 5-10x (or lengthen warmup), then restart from the last good checkpoint.",
    "Enable gradient clipping (clip_grad_norm_ 1.0) if it is off.",
    "Check for a learning-rate schedule bug (a jump in lr at the start of the rise).",
)


class DivergenceSettings(SharedSettings):
    """The knobs of ``divergence`` (``detectors:`` in the sidecar's config)."""

    divergence_steps: int = Field(
        default=3, ge=2,
        description="Consecutive steps a runaway (loss and grad norm rising far above baseline) "
        "must last to be a divergence.",
    )
    divergence_ratio: float = Field(
        default=1.2, gt=1,
        description="loss / EMA from which a rising step counts toward divergence.",
    )
    divergence_runaway_z: float = Field(
        default=3.0, gt=0,
        description="Runaway rule: log(loss / EMA) on each rising step at least this many "
        "per-step sigmas of the log-loss (as well as divergence_ratio).",
    )
    divergence_grad_ratio: float = Field(
        default=2.0, gt=1, description="grad norm / its median from which a rising step counts."
    )
    divergence_jump: float = Field(
        default=10.0, gt=1,
        description="Jump rule: update/param above update_ratio_max and this many times its "
        "rolling median.",
    )
    divergence_lr_jump: float = Field(
        default=2.0, gt=1,
        description="Jump rule: an update jump on a step whose lr is this many times its rolling "
        "median is judged at once (the LR, not one batch, made it).",
    )
    divergence_window: int = Field(
        default=10, ge=3, description="Steps in the recent loss level (median) compared with the "
        "median of the baseline_window steps before them."
    )
    divergence_rise: float = Field(
        default=0.3, gt=0, description="Level rule: the recent median loss at least this fraction "
        "above the earlier median..."
    )
    divergence_z: float = Field(
        default=6.0, gt=0, description="...and this many standard errors of the difference of the "
        "two medians above it (noise from the MAD of step-to-step log-loss changes)..."
    )
    divergence_progress: float = Field(
        default=0.25, gt=0,
        description="...and this fraction of the run's progress (start loss minus the earlier "
        "median) given back: the absolute floor for near-zero losses.",
    )
    divergence_hold: int = Field(
        default=5, ge=1,
        description="Consecutive steps the update jump rule, and the level rule while the lr "
        "that rose with it stays raised, must hold (not recover).",
    )
    divergence_persist: int = Field(
        default=30, ge=1,
        description="Level rule with no raised lr behind it: steps from its onset the level "
        "must have held (longer than a burst of bad batches, which is a loss_spike)...",
    )
    divergence_give_back: float = Field(
        default=0.5, gt=0, le=1,
        description="...while having given back less than this fraction of its excursion's "
        "peak (a burst that ended gives most of it back at once).",
    )


@dataclass(slots=True)
class DivergenceState:
    grads: Window
    recent: Window  # log loss, the last divergence_window steps
    earlier: Window  # log loss, the baseline_window steps before them
    ratios: Window
    lrs: Window
    first: list[float] = field(default_factory=list)  # the run's first losses (its start)
    prev_loss: float | None = None
    prev_grad: float | None = None
    streak: int = 0
    streak_start_loss: float | None = None
    held: int = 0
    recent_at: Window = field(default_factory=lambda: Window.of(0))  # the steps of ``recent``
    onset: int | None = None  # the first step of the current level excursion
    peak: float | None = None  # its highest recent median (log)
    lr_before: float | None = None  # the lr median when it began
    lr_raised_at: int | None = None  # the first step of the lr's current raised stretch
    streak_start: int | None = None  # the first step of the runaway streak
    jump_start: int | None = None  # the first step of the update jump streak
    best_level: float | None = None  # the lowest full earlier-window median (log)
    best_step: int | None = None
    jumps: int = 0
    # The same windows in the loss's own linear units, for a loss judged ``signed``
    # (``support/context.py``: one that went below zero, or declared so).
    lin_recent: Window = field(default_factory=lambda: Window.of(0))
    lin_earlier: Window = field(default_factory=lambda: Window.of(0))
    lin_at: Window = field(default_factory=lambda: Window.of(0))
    best_lin: float | None = None
    best_lin_step: int | None = None
    said: bool = False  # the info that the loss has no level to judge was given
    # The rise the current excursion still held divergence_persist steps or more after its
    # onset, whether it paged, and the largest such rise of an excursion that came back
    # without paging (log, or linear units): the run's own level swing (module docstring).
    held_rise: float | None = None
    paged: bool = False
    recovered: float | None = None
    ceiling: Ceiling = field(default_factory=Ceiling)  # the early rule's (support/ceiling.py)


class DivergenceDetector(DetectorBase[DivergenceSettings]):
    """Error when the loss climbs away and stays (see module docstring)."""

    type = "divergence"
    severity = Severity.ERROR
    settings_model = DivergenceSettings

    def new_rank(self) -> DivergenceState:
        s = self.settings
        return DivergenceState(grads=Window.of(s.baseline_window),
                               recent=Window.of(s.divergence_window),
                               recent_at=Window.of(s.divergence_window),
                               earlier=Window.of(s.baseline_window),
                               ratios=Window.of(s.baseline_window),
                               lrs=Window.of(s.baseline_window),
                               lin_recent=Window.of(s.divergence_window),
                               lin_earlier=Window.of(s.baseline_window),
                               lin_at=Window.of(s.divergence_window))

    def on_step(self, rec: StepRecord, st: DivergenceState) -> list[Finding]:
        if amp_overflow(rec):
            return []
        if not finite(rec.loss):
            found = self._ran_off(rec, st) if rec.loss is not None else []
            return locate(found, self.ctx.rank(rec.rank).bands, self.ctx)
        self._fold_loss(rec.step, rec.loss, st)
        self._fold_lr(rec, st)
        jump = st.ceiling.observe(rec.step, rec.loss)
        found = self._jump(rec, st)
        kind, units = self.ctx.loss_kind(rec.rank), self.ctx.level_units(rec.rank)
        if units is None:
            # No level to judge (said once), except a rise the raised lr still drives.
            level = (self._level(rec, st, linear=True, lr_only=True)
                     or self._unlevelled(rec, st, kind))
        else:
            level = self._level(rec, st, linear=units == "linear")
        # The runaway takes a ratio wherever the loss has a zero to take one from: it
        # stayed positive and was not declared signed (a TD loss declared nonstationary is
        # still an error measured from zero; its linear spread misses its heavy tail).
        ratio = kind != "signed" and self.ctx.rank(rec.rank).negative_loss_step < 0
        found = self._fast(rec, st, linear=not ratio) or level or found
        if not found and jump is not None and ratio:
            found = self._early(rec, jump)
        st.prev_loss = rec.loss
        if finite(rec.lr) and rec.lr > 0:  # after the rules: the median they judge excludes it
            st.lrs.add(math.log(rec.lr))
        if finite(rec.grad_norm) and rec.grad_norm > 0:
            st.prev_grad = rec.grad_norm
            st.grads.add(math.log(rec.grad_norm))
        return locate(found, self.ctx.rank(rec.rank).bands, self.ctx)

    def _fold_lr(self, rec: StepRecord, st: DivergenceState) -> None:
        """Where the lr's current raised stretch began (``divergence_lr_jump`` x its median
        before it): the earliest step a divergence the raised lr drives can start at."""
        s = self.settings
        if not finite(rec.lr) or len(st.lrs) < s.min_history_steps:
            return
        raised = rec.lr >= s.divergence_lr_jump * math.exp(st.lrs.median())
        st.lr_raised_at = (st.lr_raised_at or rec.step) if raised else None

    def _fold_loss(self, step: int, loss: float, st: DivergenceState) -> None:
        if len(st.first) < self.settings.min_history_steps:
            st.first.append(loss)
        if st.lin_recent.full:
            st.lin_earlier.add(st.lin_recent.values()[0])
        st.lin_recent.add(loss)
        st.lin_at.add(step)
        if loss <= 0:
            return
        if st.recent.full:  # the oldest recent value moves into the earlier window
            st.earlier.add(st.recent.values()[0])
        st.recent.add(math.log(loss))
        st.recent_at.add(step)

    def _reference(self, rec: StepRecord, st: DivergenceState, linear: bool = False
                   ) -> float | None:
        """The level a rise is measured from (log loss; ``linear``: the loss itself): the
        earlier window's median, or the lowest full-window median seen since warmup when
        that is lower (a slow creep moves the earlier window with it). A 100-step median,
        never a single noisy value."""
        earlier = st.lin_earlier if linear else st.earlier
        if len(earlier) < self.settings.min_history_steps or not st.first:
            return None
        before = earlier.median()
        best = st.best_lin if linear else st.best_level
        if earlier.full and not self.ctx.in_warmup(rec.step) and (best is None or before < best):
            best = before
            if linear:
                st.best_lin, st.best_lin_step = before, rec.step
            else:
                st.best_level, st.best_step = before, rec.step
        return before if best is None else min(before, best)

    def _floor(self, st: DivergenceState, ref: float) -> float:
        """The loss the progress rule needs reached: the reference level plus
        ``divergence_progress`` of what the run had learnt since its start."""
        level = math.exp(ref)
        learnt = max(median(np.asarray(st.first)) - level, 0.0)
        return level + self.settings.divergence_progress * learnt

    # -- early: a loss beyond float precision above the run's highest, no history needed -----

    def _early(self, rec: StepRecord, jump: Jump) -> list[Finding]:
        if not self.due(rec):
            return []
        msg = (f"loss {fmt(rec.loss)} is {jump.decades:.0f} decades above the highest the run "
               f"had reported ({fmt(jump.highest)} at step {jump.highest_step}), more than "
               f"float32's 7 digits tell apart: the loss exploded")
        if jump.onset < rec.step:
            msg += f", rising since step {jump.onset}"
        evidence = {"rule": "early", "onset_step": jump.onset, "loss": rec.loss,
                    "highest_loss": jump.highest, "highest_step": jump.highest_step,
                    "decades": jump.decades, "grad_norm": rec.grad_norm, "lr": rec.lr}
        return [self.finding(rec, msg, value=rec.loss, threshold=jump.highest * PRECISION,
                             evidence=evidence, suggestions=DIVERGENCE)]

    # -- jump: updates far too large, step after step -----------------------------------------

    def _jump(self, rec: StepRecord, st: DivergenceState) -> list[Finding]:
        ratio = rec.update_ratio
        if not finite(ratio) or ratio <= 0:
            return []
        s = self.settings
        med = st.ratios.median() if len(st.ratios) >= s.min_history_steps else None
        big = (med is not None and not self.ctx.in_warmup(rec.step)
               and ratio > s.update_ratio_max and ratio >= s.divergence_jump * med)
        lr_med = math.exp(st.lrs.median()) if len(st.lrs) >= s.min_history_steps else None
        if not big:  # the jump's own steps stay out of the median they are judged against
            st.ratios.add(ratio)
        st.jumps = st.jumps + 1 if big else 0
        st.jump_start = (st.jump_start or rec.step) if big else None
        lr_jump = (rec.lr / lr_med if big and lr_med and finite(rec.lr) else None)
        by_lr = lr_jump is not None and lr_jump >= s.divergence_lr_jump
        if med is None or (st.jumps < s.divergence_hold and not by_lr) or not self.due(rec):
            return []
        cause = (f"the lr {fmt(rec.lr)} is {lr_jump:.0f}x its median {fmt(lr_med)}" if by_lr
                 else f"for {st.jumps} steps in a row (lr {fmt(rec.lr)})")
        msg = (f"update/param ratio {fmt(ratio)} is {ratio / med:.0f}x its median {fmt(med)} "
               f"and above {fmt(s.update_ratio_max)}, {cause}: steps this large precede "
               f"divergence")
        evidence = {"rule": "update_jump", "onset_step": st.jump_start,
                    "update_ratio": ratio, "median_ratio": med,
                    "consecutive_steps": st.jumps, "lr": rec.lr, "lr_median": lr_med,
                    "loss": rec.loss, "grad_norm": rec.grad_norm}
        return [self.finding(rec, msg, value=ratio, threshold=s.update_ratio_max,
                             evidence=evidence, suggestions=DIVERGENCE)]

    # -- runaway: loss and grad norm climbing together --------------------------------------

    def _rising(self, rec: StepRecord, st: DivergenceState, linear: bool) -> bool:
        s = self.settings
        ema, ref = self.ctx.ema_loss(rec.rank), self._reference(rec, st)
        floor = None if ref is None else self._floor(st, ref)
        loss = rec.loss
        if (loss is None or st.prev_loss is None or ema is None
                or len(st.grads) < s.min_history_steps):
            return False
        if linear:  # no zero to take a ratio from: divergence_z of its own per-step noise
            sigma = _level_sigma(st.lin_earlier) if len(st.lin_earlier) >= 2 else math.nan
            loss_up = (loss > st.prev_loss and finite(sigma)
                       and loss - ema >= s.divergence_z * max(sigma, 1e-12))
        else:
            # A ratio is noise-free only where the log-loss is narrow: on a loss whose own
            # steps swing by 1.2x and more (a TD loss near zero), the rise must also stand
            # divergence_runaway_z per-step sigmas of its log-loss above its EMA.
            sigma = (_step_sigma(st.earlier) if len(st.earlier) >= s.min_history_steps
                     else math.nan)
            loss_up = (loss > st.prev_loss and loss >= s.divergence_ratio * abs(ema)
                       and (floor is None or loss >= floor)
                       and (not finite(sigma) or ema <= 0
                            or math.log(loss / ema) >= s.divergence_runaway_z * sigma))
        if not finite(rec.grad_norm) or st.prev_grad is None:
            return loss_up
        med = math.exp(st.grads.median())
        grad_up = rec.grad_norm > st.prev_grad and rec.grad_norm >= s.divergence_grad_ratio * med
        return loss_up and grad_up

    def _fast(self, rec: StepRecord, st: DivergenceState, linear: bool = False
              ) -> list[Finding]:
        if not self._rising(rec, st, linear):
            st.streak, st.streak_start_loss, st.streak_start = 0, None, None
            return []
        if st.streak == 0:
            st.streak_start_loss, st.streak_start = st.prev_loss, rec.step
        st.streak += 1
        if st.streak < self.settings.divergence_steps or not self.due(rec):
            return []
        med = math.exp(st.grads.median())
        msg = (f"loss rose {st.streak} steps in a row to {fmt(rec.loss)} (from "
               f"{fmt(st.streak_start_loss)}) while grad norm grew to {fmt(rec.grad_norm)} "
               f"({fmt((rec.grad_norm or math.nan) / med)}x its median {fmt(med)})")
        evidence = {"rule": "runaway", "onset_step": st.streak_start,
                    "consecutive_steps": st.streak, "loss": rec.loss,
                    "loss_before": st.streak_start_loss, "ema": self.ctx.ema_loss(rec.rank),
                    "grad_norm": rec.grad_norm, "grad_median": med, "lr": rec.lr}
        return [self.finding(rec, msg, value=rec.loss, threshold=self.ctx.ema_loss(rec.rank),
                             evidence=evidence, suggestions=DIVERGENCE)]

    def _ran_off(self, rec: StepRecord, st: DivergenceState) -> list[Finding]:
        """A runaway streak cut short by a non-finite loss: it could not hold any longer
        because it left the float range, which is the divergence completing."""
        (streak, start), st.streak, st.streak_start = (st.streak, st.streak_start), 0, None
        if streak == 0 or streak >= self.settings.divergence_steps or not self.due(rec):
            return []
        msg = (f"loss rose {streak} step(s) in a row to {fmt(st.prev_loss)} (from "
               f"{fmt(st.streak_start_loss)}) while the grad norm grew, then went "
               f"{rec.loss} at step {rec.step}")
        evidence = {"rule": "runaway", "onset_step": start,
                    "consecutive_steps": streak + 1, "loss": rec.loss,
                    "loss_before": st.streak_start_loss, "last_finite_loss": st.prev_loss,
                    "grad_norm": rec.grad_norm, "lr": rec.lr}
        return [self.finding(rec, msg, value=st.prev_loss, threshold=st.streak_start_loss,
                             evidence=evidence, suggestions=DIVERGENCE)]

    # -- level: the recent loss level far above the earlier one, and holding ----------------

    def _level(self, rec: StepRecord, st: DivergenceState, linear: bool = False,
               lr_only: bool = False) -> list[Finding]:
        s = self.settings
        ref = self._reference(rec, st, linear)
        recent, earlier = (st.lin_recent, st.lin_earlier) if linear else (st.recent, st.earlier)
        if ref is None or not recent.full or self.ctx.in_warmup(rec.step):
            self._ended(st)
            return []
        back = _same if linear else math.exp
        now, before = recent.median(), ref
        sigma = _level_sigma(earlier) if linear else _step_sigma(earlier)
        se = MEDIAN_SE * sigma * math.sqrt(1 / len(recent) + 1 / len(earlier))
        rise = now - before
        start = median(np.asarray(st.first))
        # A loss that has not moved from its start by divergence_z standard errors has
        # learnt nothing its noise can tell from chance: it has no level to diverge from
        # (a TD loss whose targets move, relearning after each change). Said once, as info.
        learnt = (start - before if linear
                  else math.log(start) - before if start > 0 else -math.inf)
        learnt_se = MEDIAN_SE * sigma * math.sqrt(1 / len(st.first) + 1 / len(earlier))
        levelled = learnt >= s.divergence_z * max(learnt_se, 1e-12)
        if lr_only:  # a loss with no level: only the rise in its own noise, if the lr drives it
            up, levelled = rise >= s.divergence_z * se, True
            band = before + ONSET_Z * sigma
        elif linear:
            # No zero to take ratios from: the rise and the progress in the loss's own units.
            up = rise >= s.divergence_z * se and rise >= s.divergence_progress * learnt
            band = before + max(s.divergence_progress * max(learnt, 0.0), ONSET_Z * sigma)
        else:
            floor = self._floor(st, ref)
            up = (rise >= math.log1p(s.divergence_rise) and rise >= s.divergence_z * se
                  and math.exp(now) >= floor)
            band = before + max(math.log1p(s.divergence_rise), ONSET_Z * sigma)
        if up and not levelled:
            self._ended(st)
            return self._unlevelled(rec, st, "no_progress", learnt=learnt, learnt_se=learnt_se,
                                    level=back(before), linear=linear)
        if not up:
            self._ended(st)
            return []
        if st.held == 0:
            st.onset = self._onset(st, band, rec.step, linear)
            st.peak = now
            st.lr_before = (math.exp(st.lrs.median())
                            if len(st.lrs) >= s.min_history_steps else None)
        st.held += 1
        st.peak = max(st.peak if st.peak is not None else now, now)
        if rec.step - (st.onset if st.onset is not None else rec.step) >= s.divergence_persist:
            st.held_rise = max(st.held_rise if st.held_rise is not None else rise, rise)
        why = self._persists(rec, st, before, now, back, lr_only, band, linear)
        if why is None or not self.due(rec):
            return []
        st.paged = True
        level_now, level_before = back(now), back(before)
        given_back = (level_now - level_before) / max(start - level_before, 1e-12)
        best = ref < earlier.median()
        best_step = st.best_lin_step if linear else st.best_step
        which = (f"its best {len(earlier)}-step median {fmt(level_before)} (step "
                 f"{best_step})" if best else
                 f"its median {fmt(level_before)} over the {len(earlier)} steps before")
        by = (f"{fmt(level_now - level_before)}" if linear
              else f"{level_now / level_before - 1:+.0%}")
        noise = " of its own noise" if linear else ""
        msg = (f"loss median {fmt(level_now)} over the last {len(recent)} steps is "
               f"{by} above {which} ({rise / max(se, 1e-12):.0f} standard errors{noise}), "
               f"for {st.held} steps in a row since step {st.onset}, {why}")
        if start > level_before:
            msg += f"; {given_back:.0%} of the progress from {fmt(start)} is lost"
        evidence = {"rule": "level", "onset_step": st.onset, "median": level_now,
                    "earlier_median": level_before, "earlier_is_best": best,
                    "rise_in_stderr": rise / max(se, 1e-12),
                    "noise_sigma": sigma, "units": "linear" if linear else "log",
                    "start": start,
                    "progress_lost": given_back if start > level_before else None,
                    "consecutive_steps": st.held, "peak_median": back(st.peak),
                    "recovered_rise": st.recovered,
                    "lr": rec.lr, "lr_before": st.lr_before}
        if not linear:
            evidence["noise_sigma_log"] = sigma
        return [self.finding(rec, msg, value=level_now, threshold=level_before,
                             evidence=evidence, suggestions=DIVERGENCE)]

    def _ended(self, st: DivergenceState) -> None:
        """The level is back within its band: an excursion that held past a burst's length
        and came back without paging is the run's own level swing (``recovered``)."""
        if st.held and not st.paged and st.held_rise is not None:
            st.recovered = max(st.recovered if st.recovered is not None else st.held_rise,
                               st.held_rise)
        st.held, st.onset, st.held_rise, st.paged = 0, None, None, False

    def _unlevelled(self, rec: StepRecord, st: DivergenceState, why: str,
                    learnt: float = math.nan, learnt_se: float = math.nan,
                    level: float = math.nan, linear: bool = True) -> list[Finding]:
        """Once a run: an info finding that this loss has no stable level, so no level
        judgement pages on it (declared ``nonstationary``, or a signed loss whose progress
        from its start is within its own noise)."""
        if st.said or len(st.first) < self.settings.min_history_steps:
            return []
        st.said = True
        if why == "nonstationary":
            msg = ("the run declares its loss nonstationary (loss_kind): it has no stable "
                   "level, so divergence's level rule, plateau and overfitting do not judge "
                   "it; gradients, non-finite values and a runaway still do")
        elif why == "signed":
            msg = (f"the loss went below zero (at step "
                   f"{self.ctx.rank(rec.rank).negative_loss_step}): it is no error measured "
                   "from zero, so a rise of its level is no percentage of anything, and a "
                   "loss of either sign (an RL or TD objective) has no stable level by "
                   "design: no level rise pages on it; gradients, non-finite values and a "
                   "runaway (judged in its own noise) still do. A run whose signed loss "
                   "does settle (a density's NLL) can declare loss_kind: signed to have its "
                   "level judged in its own units")
        else:
            start = median(np.asarray(st.first))
            moved = fmt(start - level) if linear else f"{start / level - 1:+.0%}"
            msg = (f"the loss's best level {fmt(level)} is {moved} from its start "
                   f"{fmt(start)}, {learnt / max(learnt_se, 1e-12):.1f} standard errors of "
                   f"its own noise (under {self.settings.divergence_z:g}): it has learnt no "
                   "stable level a rise could be judged against, so no level rise pages; "
                   "gradients, non-finite values and a runaway still do (a run can declare "
                   "loss_kind in its config)")
        evidence = {"rule": "no_level", "why": why, "learnt": learnt,
                    "learnt_stderr": learnt_se, "loss": rec.loss}
        # A note, not an alarm: recorded and listed with the run's findings, but no rule
        # matches it (a rule on ``divergence`` with ``action: rollback`` or ``severity:
        # critical`` would otherwise act on, or page, the very absence of a judgement).
        note = self.finding(rec, msg, value=rec.loss, evidence=evidence, severity=Severity.INFO)
        return [replace(note, log_only=True)]

    def _caused(self, rec: StepRecord, st: DivergenceState, band: float, linear: bool
                ) -> bool:
        """Whether the excursion, dated from the raised lr on, holds as long as the lr rule
        needs (``divergence_hold`` steps): a divergence attributed to an lr that rose
        starts at or after it. An excursion that began before the lr rose is not the lr's
        doing (the run's own level moves: an actor-critic's loss grows with its episodes
        as it learns), so it is re-dated to the first step at or after the rise above the
        band; none yet, or too recent, and the lr rule waits."""
        cause = st.lr_raised_at
        if cause is None or st.onset is None or st.onset >= cause:
            return True
        onset = self._onset(st, band, rec.step, linear, not_before=cause)
        if onset is None or rec.step - onset + 1 < self.settings.divergence_hold:
            return False
        st.onset, st.held = onset, rec.step - onset + 1
        return True

    def _onset(self, st: DivergenceState, band: float, now: int, linear: bool = False,
               not_before: int | None = None) -> int | None:
        """The first step of the recent window whose own loss (log loss) is above
        ``band``: where the loss left its level, a few steps before its median did. The
        band is the rise the level needs, or ``ONSET_Z`` per-step sigmas where the loss is
        noisier than that (a single step 3 sigma up is a tail one step in 700 reaches:
        within a 10-step window the first one is the excursion's, not noise).
        ``not_before``: only steps from there on count (None when none is above)."""
        recent, at = (st.lin_recent, st.lin_at) if linear else (st.recent, st.recent_at)
        values, steps = recent.values(), at.values()
        values = values[len(values) - len(steps):]  # a snapshot from before steps were kept
        if not_before is not None:
            keep = steps >= not_before
            values, steps = values[keep], steps[keep]
            above = np.flatnonzero(values >= band)
            return int(steps[above[0]]) if len(above) else None
        above = np.flatnonzero(values >= band)
        if not len(steps):
            return now
        return int(steps[above[0]] if len(above) else steps[0])

    def _persists(self, rec: StepRecord, st: DivergenceState, before: float, now: float,
                  back: Callable[[float], float] = math.exp, lr_only: bool = False,
                  band: float = math.inf, linear: bool = False) -> str | None:
        """Why the excursion is a persisting shift and not a burst that will return (None:
        not shown yet). See the module docstring's level rule. ``lr_only``: a loss with no
        level, whose rise only its cause still applied (a raised lr) makes a divergence.
        A rise the raised lr drives starts at or after the lr rose (``_caused``)."""
        s = self.settings
        lasted = rec.step - (st.onset if st.onset is not None else rec.step)
        # Past its own swing: a level no higher than one this run has held as long and
        # come back from on its own shows no persistence (module docstring).
        beyond = st.recovered is None or now - before > st.recovered
        if lasted >= s.baseline_window and not lr_only and beyond:
            return f"not back within a whole {s.baseline_window}-step baseline window"
        lr, lr_before = rec.lr, st.lr_before
        if (lr is not None and lr_before is not None and finite(lr)
                and lr >= s.divergence_lr_jump * lr_before and st.held >= s.divergence_hold
                and self._caused(rec, st, band, linear)):
            return (f"while the lr {fmt(lr)} is {lr / lr_before:.0f}x its median "
                    f"{fmt(lr_before)} before the rise (the cause is still applied)")
        if lr_only:
            return None
        peak = back(st.peak if st.peak is not None else now)
        level, base = back(now), back(before)
        returned = (peak - level) / max(peak - base, 1e-12)
        if lasted >= s.divergence_persist and returned < s.divergence_give_back and beyond:
            return (f"having given back {returned:.0%} of its peak {fmt(peak)}: it holds, a "
                    f"burst would have returned")
        return None


def _same(x: float) -> float:
    return x


def _level_sigma(window: Window) -> float:
    """The noise of a signed loss's level: the larger of its per-step noise and the
    spread of its values about their median (``Window.mad``). A loss judged in its own
    units has no log trend to difference away, and where successive steps are correlated
    (RL episodes overlap, a moving target) differences undercount how far a 10-step
    median wanders; the spread of the values does not (a trend only widens it: slower,
    never falser)."""
    return max(_step_sigma(window), window.mad())


def _step_sigma(window: Window) -> float:
    """The per-step noise of a window's values: ``MAD_TO_SIGMA`` x the MAD of their first
    differences over sqrt(2) (differences remove a trend)."""
    diffs = np.diff(window.values())
    if not len(diffs):
        return math.nan
    return MAD_TO_SIGMA * median(np.abs(diffs - median(diffs))) / math.sqrt(2)
