"""``lr_jump``: the learning rate rose far outside the run's own schedule in one record, and
the pages that follow while it is in force name it as their likely cause.

Every step record carries ``lr``. A run that watches several models (a GAN's generator and
discriminator, an actor and a critic) sends each one's own LR in ``models.<name>.lr``, where
``lr`` is only the first model's: each model has its own optimizer and schedule, so each
model's LR is judged as a series of its own, and a jump names its model ("LR of G x100 at
step 200"); the first model's is judged there, under its name, not twice. The statistic is
the log-ratio of consecutive LRs of one series (a rank's, or a rank's model's),
``x = log(lr_t / lr_prev)``: 0 for a constant LR, a small smooth value along a warmup
ramp or a cosine/linear decay, one large negative value at a step decay or a
ReduceLROnPlateau cut. The schedule's own prediction of the next ratio is the median of the
last ``WINDOW`` ratios (a ramp or a decay changes its ratio slowly, so the median follows
it; a single milestone drop is an outlier the median ignores), and its step-to-step
variation is their robust spread (``Window.mad``, a standard deviation).

A record is a jump when all of these hold:

* its ratio is at least ``JUMP_Z`` (8) robust sigmas and at least ``JUMP_RATIO`` (5x) above
  the predicted ratio. 8 sigma: a run has thousands of steps and a normal tail that far
  out has probability ~1e-15. The ratio floor carries the decision when the spread is near
  zero (a constant LR, a smooth ramp): no schedule in use multiplies the LR by even 5 in
  one step outside a warmup, and half an order of magnitude leaves room for a x10 jump
  landing on a step where the schedule itself was cutting the LR;
* it is upward. A drop of any factor is what step decay, MultiStepLR and ReduceLROnPlateau
  do, and a smaller step cannot make a run diverge, explode or go NaN;
* the new LR is above ``CEILING_RATIO`` (2x) the highest LR the rank used before. A warm
  restart (SGDR, cyclic and one-cycle policies) climbs back to the schedule's own peak, not
  past it; a warmup ramp sets new highs only by its own small per-step ratio. The price:
  a jump back to a level the run already used (a scheduler reset that undoes a decay) is
  not flagged, because from the LR series alone it looks exactly like a warm restart;
* the series has ``MIN_READINGS`` ratios of history, and the step before it was past the
  run's declared warmup (a step from a constant warmup LR to the base LR is the schedule).

While the LR stays above twice that earlier peak the jump is *in force*; it explains the
findings of ``EXPLAINS`` types (divergence, gradient explosion, loss spike, NaN, blown-up
activations, oversized updates) from the jump's step until ``EXPLAIN_AFTER`` steps after
the LR was last in force (the weights an LR blew up stay blown up for a while after it is
undone). ``DetectorSuite`` asks ``explain`` of each such finding and puts the answer into
its message and, first, its evidence, so a page carries the cause in its summary. A finding
whose own evidence dates its onset (``onset_step``) before the jump began before its
would-be cause, so the jump does not explain it.

A constant LR for 60 steps, then x100 at step 61 (3e-4 -> 3e-2)::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "lr": 3e-4 if s <= 60 else 3e-2, "loss": 2.0})
    ...          for s in range(1, 70)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('lr_jump', 61, 'warning')]
    >>> print(found[0].message)
    LR x100 at step 61: 0.0003 -> 0.03, outside the run's schedule (the highest LR before
    was 0.0003; step-to-step ratios 1x +- 0%)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.state import load_into
from monitor_agent.detectors.support.stats import Window, finite
from monitor_agent.records.types import Finding, Severity, StepRecord

WINDOW = 32
MIN_READINGS = 10
JUMP_Z = 8.0
JUMP_RATIO = 5.0
CEILING_RATIO = 2.0
SIGMA_FLOOR = 1e-3  # log units: 0.1% step-to-step, below any schedule's resolution
EXPLAIN_AFTER = 100
EXPLAINS = frozenset({"divergence", "grad_explosion", "loss_spike", "nan_inf",
                      "activation_blowup", "update_ratio_high"})

LR_JUMP = (
    "Find what set the LR: a scheduler stepped per batch instead of per epoch, a resumed "
    "checkpoint whose scheduler state was not loaded, a param-group lr overwritten by hand, "
    "or an lr given in the wrong unit.",
    "Restore the schedule (or lower the LR back) and restart from the last checkpoint before "
    "the jump if the loss has moved.",
    "If the rise is intended, silence this warning for the run.",
)


@dataclass(slots=True)
class LrSeries:
    """One LR series: a rank's ``lr``, or one watched model's on that rank."""

    ratios: Window = field(default_factory=lambda: Window.of(WINDOW))  # log(lr_t / lr_prev)
    prev_lr: float = 0.0
    prev_step: int = -1
    ceiling: float = 0.0      # highest LR this series used before (a jump raises it)
    # The latest jump: where, its text, and the peak it left behind.
    jump_step: int = -1
    jump_text: str = ""
    jump_floor: float = 0.0   # in force while the LR stays above this
    in_force_until: int = -1  # last step the LR was still above jump_floor


@dataclass(slots=True)
class LrJumpState:
    """A rank's LR series by model name ("": the record's own ``lr``, a run of one model)."""

    series: dict[str, LrSeries] = field(default_factory=dict)


class LrJumpDetector(DetectorBase[SharedSettings]):
    """Warning on an upward LR jump far outside the run's schedule (see docstring)."""

    type = "lr_jump"
    severity = Severity.WARNING
    settings_model = SharedSettings

    def new_rank(self) -> LrJumpState:
        return LrJumpState()

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        # A series is a dataclass in a dict, which the generic restore leaves as plain data;
        # a snapshot from before models were judged apart holds the rank's one series flat.
        for r, st in self.ranks.items():
            saved = state["ranks"][str(r)]
            st.series = {name: load_into(LrSeries(), data) for name, data in st.series.items()}
            if "series" not in saved and "ratios" in saved:
                st.series[""] = load_into(LrSeries(), saved)

    def on_step(self, rec: StepRecord, st: LrJumpState) -> list[Finding]:
        found: list[Finding] = []
        for name, lr in _lrs(rec).items():
            series = st.series.get(name)
            if series is None:
                series = st.series[name] = LrSeries()
            jump = self._judge(rec, series, lr, name)
            if jump is not None:
                found.append(jump)
        return found

    def _judge(self, rec: StepRecord, st: LrSeries, lr: float, name: str) -> Finding | None:
        """Fold ``lr`` into its series; the finding when it is a jump that is due."""
        found = None
        if st.jump_step >= 0 and lr > st.jump_floor:
            st.in_force_until = rec.step
        if st.prev_lr > 0 and rec.step > st.prev_step:
            x = math.log(lr / st.prev_lr)
            jump = self._jump(rec, st, lr, x, name)
            if jump is None:
                st.ratios.add(x)  # a jump never becomes its own baseline
            elif self.due(rec, name or None):  # one report per repeat_every, per model
                found = jump
        st.prev_lr, st.prev_step = lr, rec.step
        st.ceiling = max(st.ceiling, lr)
        return found

    def _jump(self, rec: StepRecord, st: LrSeries, lr: float, x: float, name: str
              ) -> Finding | None:
        if (len(st.ratios) < MIN_READINGS or st.prev_step <= self.ctx.warmup
                or lr <= CEILING_RATIO * st.ceiling):
            return None
        predicted, sigma = st.ratios.median(), max(st.ratios.mad(), SIGMA_FLOOR)
        r = x - predicted
        if r < math.log(JUMP_RATIO) or r < JUMP_Z * sigma:
            return None
        factor = math.exp(r)  # against what the schedule would have done this step
        # Two digits: the schedule's own move on this step is not known to more.
        lr_of, whose = (f"LR of {name}", f"{name}'s") if name else ("LR", "the run's")
        text = (f"{lr_of} x{float(f'{factor:.2g}'):g} at step {rec.step}: {fmt(st.prev_lr)} -> "
                f"{fmt(lr)}, outside {whose} schedule")
        st.jump_step, st.jump_text = rec.step, text
        st.jump_floor, st.in_force_until = CEILING_RATIO * st.ceiling, rec.step
        msg = (f"{text} (the highest LR before was {fmt(st.ceiling)}; step-to-step ratios "
               f"{math.exp(predicted):.3g}x +- {100 * (math.exp(sigma) - 1):.0f}%)")
        evidence: dict[str, Any] = {"model": name} if name else {}
        evidence.update(lr=lr, previous_lr=st.prev_lr, factor=factor,
                        ratio_to_previous=lr / st.prev_lr, previous_peak_lr=st.ceiling,
                        predicted_ratio=math.exp(predicted), z=r / sigma,
                        limit_ratio=JUMP_RATIO, limit_z=JUMP_Z)
        return self.finding(rec, msg, value=lr, threshold=st.prev_lr * math.exp(predicted),
                            evidence=evidence, suggestions=LR_JUMP)

    def explain(self, finding: Finding) -> str | None:
        """The jump in force at ``finding``'s step, as its likely cause; None when none is
        or the finding's type is not one an LR jump causes."""
        if finding.type not in EXPLAINS:
            return None
        onset = finding.evidence.get("onset_step")
        began = onset if isinstance(onset, int) and onset <= finding.step else finding.step
        causes = [s for st in self.ranks.values() for s in st.series.values()
                  if 0 <= s.jump_step <= began
                  and finding.step <= s.in_force_until + EXPLAIN_AFTER]
        if not causes:
            return None
        # Of two models' jumps in force, the later one: the nearest before the finding.
        return str(max(causes, key=lambda s: s.jump_step).jump_text)


def _lrs(rec: StepRecord) -> dict[str, float]:
    """The record's LRs to judge, by model name: each watched model's own (``models``),
    else the record's ``lr`` under "" (a run of one model); only positive finite ones."""
    named = {name: m.get("lr") for name, m in (rec.models or {}).items()
             if isinstance(m, dict)}
    lrs = {name: float(lr) for name, lr in named.items() if _usable(lr)}
    if not lrs and _usable(rec.lr):
        lrs[""] = float(rec.lr)
    return lrs


def _usable(lr: Any) -> TypeGuard[float]:
    return isinstance(lr, int | float) and not isinstance(lr, bool) and finite(lr) and lr > 0
