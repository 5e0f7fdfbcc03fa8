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
  module, in the loss arithmetic; origin ``loss``, pass ``loss``. After the client's
  default ``sampled`` check (``nonfinite_check``: each row's first features) the finding
  says the NaN may also sit in features of the last output the sample did not read. Only
  a step with no ``nonfinite_module_count`` at all is said to have had no per-module
  check.
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
from typing import Any

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.context import DetectorContext
from monitor_agent.detectors.support.first_rank import RankBreak, attribute
from monitor_agent.detectors.support.nonfinite import nonfinite_mask, nonfinite_params
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.state import dump
from monitor_agent.detectors.support.stats import Window, amp_overflow, finite
from monitor_agent.records.types import (
    EndRecord,
    EvalRecord,
    Finding,
    Record,
    Severity,
    StepRecord,
)

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
    nan_first_rank_wait_seconds: float = Field(
        default=5.0, gt=0, le=600,
        description="In a multi-rank run the first NaN is paged once every rank has reported "
        "its step (or ended); a rank gone without either is waited for this long at most.",
    )


@dataclass(slots=True)
class NanState:
    grads: Window = field(default_factory=lambda: Window.of(50))
    streak: int = 0  # consecutive steps with a non-finite value
    overflow_origin: str | None = None  # first non-finite unscaled grad of the last skip


@dataclass(slots=True)
class NanEpisode:
    """A run's non-finite episode across its ranks: each rank's first break, the findings
    held back until the first rank is decided, and the ranks then named first."""

    breaks: dict[int, RankBreak] = field(default_factory=dict)
    held: dict[int, Finding] = field(default_factory=dict)
    later: list[Finding] = field(default_factory=list)  # repeats/milestones while undecided
    opened_at: float | None = None   # record time of the first break to arrive
    lead: list[int] = field(default_factory=list)  # set once decided
    first: int | None = None  # the earliest step of ``breaks`` (derived: not snapshotted)

    @property
    def decided(self) -> bool:
        return bool(self.lead)


_MAX_WAITED_RANKS = 4096  # ranks never heard from that are waited for (a forged count is cheap)


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

    With several ranks the run's episode is judged once, not once per rank: the first
    non-finite record to arrive need not be the first rank's (ranks' records interleave,
    and a follower's reduced gradient is NaN at the very step the culprit's loss is), so
    the findings of the episode's first step ``p`` are held until every rank has reported
    step ``p`` (or a later one, or its end record), then one finding names the rank that
    broke first (support/first_rank.py: its local loss non-finite at the earliest step)
    and how the others followed.

    The wait is the run's own step ``p``, no more: under data parallelism every rank's
    step-``p`` record is non-finite (the reduced gradient is), and the client sends a
    non-finite step without its linger, so the last of them arrives within one delivery
    of the first. Steps cannot bound it further: a rank ahead by any number of steps in
    *delivery* does not make a missing rank dead (in synchronous data parallelism no rank
    gets past step ``p + 1`` before every rank finished step ``p``; a live sidecar sees
    one rank's batch run 13 steps ahead of the others' on a loaded machine), and a rank
    that did die leaves its peers blocked in the next all-reduce, sending nothing more.
    So for a rank gone with neither its step nor its end record the clock decides,
    ``nan_first_rank_wait_seconds`` (5 s: ten client lingers) after the first break
    arrived, naming it as not heard from: a safety net, not the usual path. A rank the
    run record counts (``hardware.reporting_ranks``) but never heard from at all is waited
    for only in the run's first ``nan_first_rank_wait_seconds`` (its client's first batch
    may still be lingering); later it reports to another sidecar (one per node, where each
    sees its node's ranks) and is not waited for. With one rank
    there is nobody to wait for and the finding goes out with its record. Until every
    rank is finite again, later findings (repeats, the persistence milestone) come from
    the first rank(s) only, so a rule's ``action_after`` counts the run's episode, not
    ranks.
    """

    type = "nan_inf"
    severity = Severity.CRITICAL
    settings_model = NanInfSettings
    scope = "run"

    def __init__(self, settings: NanInfSettings, ctx: DetectorContext) -> None:
        super().__init__(settings, ctx)
        self.episode = NanEpisode()
        self.started: float | None = None  # record time of the run's first step here
        self.streaking = 0  # ranks whose streak is open (derived from theirs: not snapshotted)

    def new_rank(self) -> NanState:
        return NanState()

    def update(self, record: Record) -> list[Finding]:
        if isinstance(record, EndRecord) and self.episode.breaks and not self.episode.decided:
            # The rank's end counts as its report (ctx marked it ended before the detectors).
            return self._settle(record.rank, record.step, record.time)
        return super().update(record)

    def tick(self, now: float) -> list[Finding]:
        ep = self.episode
        if (ep.breaks and not ep.decided and ep.opened_at is not None
                and now - ep.opened_at >= self.settings.nan_first_rank_wait_seconds):
            return self._decide()
        return []

    def on_step(self, rec: StepRecord, st: NanState) -> list[Finding]:
        if self.started is None:
            self.started = rec.time
        found = self._judge(rec, st)
        ep = self.episode
        if st.streak and rec.rank not in ep.breaks and not ep.decided:
            ep.breaks[rec.rank] = RankBreak(rec.step, non_finite_fields(rec) or ["parameters"],
                                            rec.loss, rec.grad_norm)
            ep.first = rec.step if ep.first is None else min(ep.first, rec.step)
            if ep.opened_at is None:
                ep.opened_at = rec.time
            if found:
                ep.held[rec.rank] = found[0]
                found = []
        if not ep.breaks:
            return found
        if not ep.decided:
            ep.later += found  # a repeat or milestone of a broken rank, while undecided
            out = self._settle(rec.rank, rec.step, rec.time)
            if ep.decided:  # the first rank(s)' own, in order, after the onset
                out += [f for f in ep.later if f.rank in ep.lead]
                ep.later = []
            return out
        # A follower's repeat is left out: the episode's page already names it.
        out = found if rec.rank in ep.lead or not any(self._streak(r) for r in ep.lead) else []
        if not self.streaking:
            self.episode = NanEpisode()  # every rank finite again: the episode is over
        return out

    def _streak(self, rank: int) -> int:
        st = self.ranks.get(rank)
        return st.streak if st is not None else 0

    def _settle(self, rank: int, step: int, now: float) -> list[Finding]:
        """Decide the episode once every rank reported its first step or ended.

        Per record while the episode waits, O(1) (the context's step front: the slowest
        live rank, this one counted), not a pass over every rank: at a run leader every
        rank's step is non-finite at once, a thousand records each waiting for the rest."""
        first = self.episode.first
        if first is None:
            first = self.episode.first = min(b.step for b in self.episode.breaks.values())
        front = self.ctx.front
        if len(front) and front.slowest < first:
            return []  # a live rank has not reported the first step yet
        if self._young(now):  # ranks the run record counts, not heard from yet
            infos = self.ctx.state.ranks
            for r in range(min(self.ctx.state.reporting_ranks, _MAX_WAITED_RANKS)):
                info = infos.get(str(r))
                if r != rank and (info is None or not (info.steps or info.ended)):
                    return []
        return self._decide(self._last_steps(rank, step, now))

    def _young(self, now: float | None) -> bool:
        """In the run's first ``nan_first_rank_wait_seconds``: a rank not heard from yet may
        still be lingering over its first batch."""
        return (now is not None and self.started is not None
                and now - self.started < self.settings.nan_first_rank_wait_seconds)

    def _last_steps(self, rank: int | None = None, step: int = -1,
                    now: float | None = None) -> dict[int, int]:
        """Every rank's latest step: the ranks that sent one, ``rank`` at the ``step``
        being judged, and, at -1, in the run's first ``nan_first_rank_wait_seconds``
        only, the ones the run record says report but that have not been heard from yet
        (their client's first batch may still be lingering). Later, a rank never heard
        from reports elsewhere (one sidecar per node) and is not waited for."""
        last = {r: info.last_step for r, info in self.ctx.ranks().items() if info.steps}
        for r in range(min(self.ctx.state.reporting_ranks, _MAX_WAITED_RANKS)
                       if self._young(now) else 0):
            last.setdefault(r, -1)
        if rank is not None:
            last[rank] = max(step, last.get(rank, -1))
        return last

    def _decide(self, last: dict[int, int] | None = None) -> list[Finding]:
        ep = self.episode
        last = last if last is not None else self._last_steps()
        who = attribute(ep.breaks, last, {r: info.host for r, info in self.ctx.ranks().items()})
        ep.lead = who.lead
        # The first rank's own finding carries where it started (forward/loss/backward); a
        # rank whose repeat limit held its finding back leaves the word to another's.
        held = ep.held.get(who.lead[0]) or next(iter(ep.held.values()), None)
        if held is None or len(last) <= 1:
            return [held] if held is not None else []  # one rank: its own finding, as it was
        suggestions = held.suggestions
        if who.evidence["first_rank"] is not None:
            suggestions = (f"Inspect rank {who.lead[0]}'s batch and host first: the other "
                           f"ranks only received its NaN.", *suggestions)
        return [dataclasses.replace(
            held, rank=who.lead[0], message=f"{who.message}. {held.message}",
            evidence={**who.evidence, **held.evidence}, suggestions=suggestions)]

    def snapshot_extra(self) -> dict[str, Any]:
        ep = self.episode
        return {"started": self.started,
                "breaks": {str(r): dump(b) for r, b in ep.breaks.items()},
                "held": {str(r): f.to_dict() for r, f in ep.held.items()},
                "later": [f.to_dict() for f in ep.later],
                "opened_at": ep.opened_at, "lead": list(ep.lead)}

    def restore_extra(self, data: dict[str, Any]) -> None:
        self.started = data.get("started")
        self.streaking = sum(1 for st in self.ranks.values() if st.streak)
        self.episode = NanEpisode(
            breaks={int(r): RankBreak(**b) for r, b in (data.get("breaks") or {}).items()},
            held={int(r): Finding.from_dict(f) for r, f in (data.get("held") or {}).items()},
            later=[Finding.from_dict(f) for f in data.get("later") or []],
            opened_at=data.get("opened_at"), lead=[int(r) for r in data.get("lead") or []])

    def _judge(self, rec: StepRecord, st: NanState) -> list[Finding]:
        """This rank's own finding for ``rec`` (the single-rank rule)."""
        bad = non_finite_fields(rec)
        layers = self._bad_layers(rec)
        if amp_overflow(rec):
            if layers:
                st.overflow_origin = layers[0]
            layers = layers if bad else []
        if not bad and not layers:
            self.streaking -= st.streak > 0
            st.streak = 0
            if finite(rec.grad_norm) and rec.grad_norm > 0:
                st.grads.add(math.log(rec.grad_norm))
            return []
        self.streaking += st.streak == 0
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
        # finite, so the arithmetic after the last module made it. After the default
        # sampled check (each row's first features) a value confined to other features of
        # the last module's output is not excluded, and the finding says so.
        sampled = rec.nonfinite_check == "sampled"
        where = " where sampled (each row's first features)" if sampled else ""
        also = (" or in unsampled features of the last module's output (WatchSettings("
                "finite_flags=\"full\") reads every element)") if sampled else ""
        return ("loss", f"every module output finite{where}; the loss is not: the NaN is "
                f"made in the loss computation (check log/div/softmax of the targets){also}",
                "loss")
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
