"""What every detector of one run shares: the run's config, layer order and per-rank EMA.

The suite owns one ``DetectorContext`` and hands it to each detector, so the run record, the
layer alignment and the loss EMA are computed once per record, not once per detector.

What the suite does with a run record and one step; its detectors judge the step between
``observe`` and ``after``, and ``align`` gives them its layer columns input to output::

    >>> from monitor_agent.detectors import DetectorSettings
    >>> from monitor_agent.records.schemas import parse_record
    >>> ctx = DetectorContext(DetectorSettings())
    >>> ctx.observe(parse_record({"kind": "run", "run_id": "r", "config": {"warmup_steps": 10},
    ...                           "model": {"layer_order": ["embed.weight", "head.weight"]}}))
    >>> step = parse_record({"kind": "step", "run_id": "r", "step": 1, "time": 1, "loss": 2.5,
    ...     "layers": {"head.weight": {"grad_norm": 0.5}, "embed.weight": {"grad_norm": 0.1}}})
    >>> ctx.observe(step)
    >>> ctx.align(step.layers).order.tolist(), ctx.in_warmup(step.step)
    ([1, 0], True)
    >>> ctx.after(step)
    >>> ctx.ema_loss(rank=0), ctx.rank(0).steps
    (2.5, 1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from monitor_agent.detectors.support.front import StepFront
from monitor_agent.detectors.support.layer_bands import LayerBands
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.slots import SlotIndex
from monitor_agent.detectors.support.state import dump, load_into
from monitor_agent.detectors.support.stats import Ema, amp_overflow
from monitor_agent.records.types import (
    EndRecord,
    Finding,
    LayerTable,
    Record,
    RunRecord,
    Severity,
    StepRecord,
)


@dataclass(slots=True)
class RankFacts:
    """Per-rank facts: the loss EMA, how many steps were seen, and each parameter's
    gradient-norm band (shared by the detectors that name the first layer out of it)."""

    ema: Ema = field(default_factory=Ema)
    bands: LayerBands = field(default_factory=LayerBands)
    steps: int = 0
    last_step: int = -1
    last_time: float | None = None
    host: str | None = None  # the node it runs on, from its run record's labels
    ended: bool = False  # its end record arrived
    negative_loss_step: int = -1  # the first step whose loss was below zero (-1: none yet)


@dataclass(frozen=True, slots=True)
class SkipPlan:
    """The run's newest applied rollback plan, as detectors/window_trained.py checks the
    resumed run against it: the plan's action id, its data windows (inclusive, every earlier
    rollback's included), where its data resumed, the first step of the resumed attempt and
    the unit (``positions``; ``steps`` when the run reports no data position)."""

    action_id: int
    skip: tuple[tuple[int, int], ...]
    resume_position: int | None
    start_step: int
    unit: str


@dataclass(frozen=True, slots=True)
class LayerView:
    """A record's layer table aligned to the run: ``order`` lists its columns from input
    to output, ``slots`` maps each column to the run's stable per-layer index. ``groups``
    is ``order`` cut by model, for a run that watches several (a GAN's generator and
    discriminator): depth means something within one model only, so the detectors that
    compare layers by depth compare them model by model (one group, ``order``, else)."""

    table: LayerTable
    order: np.ndarray
    slots: np.ndarray
    size: int
    groups: tuple[np.ndarray, ...] = ()

    def models(self) -> tuple[np.ndarray, ...]:
        return self.groups or (self.order,)


@dataclass(slots=True)
class ContextState:
    warmup: int = 0
    total_steps: int | None = None
    layer_order: list[str] = field(default_factory=list)
    # The parameter-name prefixes of the run's models when it watches several ("G.",
    # "D."): the run record's model.models (docs/format.md); empty for one model.
    model_prefixes: list[str] = field(default_factory=list)
    layer_names: list[str] = field(default_factory=list)
    ranks: dict[str, RankFacts] = field(default_factory=dict)
    ended: bool = False
    reporting_ranks: int = 0  # how many ranks send records (run record), 0: not said
    loss_kind: str = "auto"  # the objective the run declared (``LOSS_KINDS``), "auto": not said
    # The latest finding of each type that alerts (warning or above, not log-only), at most
    # ``RECENT_TYPES`` types: what a page about the run's end lists as what came before it.
    recent: dict[str, dict[str, Any]] = field(default_factory=dict)


RECENT_TYPES = 5  # finding types ``recent`` keeps: a page lists what came before, not a log


LOSS_KINDS = {
    "auto": "auto", "error": "error", "signed": "signed",
    "nonstationary": "nonstationary", "rl": "nonstationary", "td": "nonstationary",
    "actor_critic": "nonstationary", "gan": "nonstationary", "adversarial": "nonstationary",
}
"""What a run may declare as its objective (the run record's ``config["loss_kind"]``,
``Monitor(config={"loss_kind": ...})``), and what the loss-level detectors make of it:

* ``auto`` (the default, nothing said): an ``error`` until the loss first goes below zero,
  ``signed`` from then on - but with no level ``divergence`` judges (a loss of either sign
  that nobody declared may be an RL objective, whose level moves by design);
* ``error``: a non-negative error that falls as the run learns (cross-entropy, MSE): its
  changes are judged as ratios (in log units) against its own noise;
* ``signed``: a loss with no zero to measure ratios from (an NLL of a density, a loss
  around zero of either sign): judged in its own linear units, its noise and its progress;
* ``nonstationary`` (``rl``, ``td``, ``actor_critic``, ``gan``, ``adversarial``): a loss
  with no stable level by design (its target moves): no level judgement (divergence's
  level rule, plateau, overfitting) pages or warns on it; ``divergence`` says so once, as
  an info finding. Gradients, non-finite values and the runaway rule still judge the run.
"""


class DetectorContext:
    """Shared, snapshot-able facts about one run (see module docstring)."""

    def __init__(self, settings: SharedSettings) -> None:
        self.settings = settings
        self.state = ContextState(warmup=settings.default_warmup_steps)
        self._slots = SlotIndex(self.state.layer_names)
        self._cache: tuple[tuple[str, ...], LayerView] | None = None
        # Ranks the run's leader cannot hear (their node's sidecar is away:
        # monitor_agent/cluster): silent for that, not because they are gone. Set by the
        # engine before each tick; not part of the snapshot.
        self.unreachable: set[int] = set()
        # The run's newest applied rollback (runs/lifecycle.py), set by the engine when the
        # run loads and when a rollback is applied; not part of the snapshot.
        self.skip_plan: SkipPlan | None = None
        # When the run's current attempt began (the record time of the record that settled
        # it: a restart or relaunch), set by the engine; not part of the snapshot. A rank
        # not heard since is a process of the new job still starting, not one gone: its
        # silence counts from then (detectors/hang.py).
        self.attempt_began: float | None = None
        # The live ranks' newest and slowest steps, for the detectors that judge a step
        # once every rank reported it; derived from ``state.ranks`` (rebuilt on restore).
        self.front = StepFront()

    # -- run facts ------------------------------------------------------------------------

    def observe(self, record: Record) -> None:
        """Take what the detectors need from a run or end record."""
        if isinstance(record, RunRecord):
            self._observe_run(record)
        elif isinstance(record, EndRecord):
            self.state.ended = True
            self.rank(record.rank).ended = True
            self.front.left(record.rank)
        elif isinstance(record, StepRecord):
            # Before the detectors judge the step: the front counts it, and a finding names
            # this step's layers.
            self.front.saw(record.rank, record.step)
            if record.loss is not None and -math.inf < record.loss < 0:
                info = self.rank(record.rank)
                if info.negative_loss_step < 0:
                    info.negative_loss_step = record.step
            if record.layer_grads is not None and not amp_overflow(record):
                self.rank(record.rank).bands.update(self.align(record.layer_grads),
                                                    record.step)

    def _observe_run(self, record: RunRecord) -> None:
        reporting = _as_int(record.hardware.get("reporting_ranks"))
        if reporting is not None:
            self.state.reporting_ranks = reporting
        host = host_label(record.labels)
        if host is not None:
            self.rank(record.rank).host = host
        warmup = _as_int(record.config.get("warmup_steps"))
        if warmup is not None:
            self.state.warmup = warmup
        self.state.total_steps = _as_int(record.config.get("total_steps"))
        kind = record.config.get("loss_kind")
        if isinstance(kind, str) and kind.strip().lower() in LOSS_KINDS:
            self.state.loss_kind = LOSS_KINDS[kind.strip().lower()]
        order = record.layer_order
        if order:
            self.state.layer_order = [str(n) for n in order]
            self._slots.of(tuple(self.state.layer_order))
        self.state.model_prefixes = record.model_prefixes
        self._cache = None

    @property
    def warmup(self) -> int:
        return self.state.warmup

    def in_warmup(self, step: int) -> bool:
        return step <= self.state.warmup

    def rank(self, rank: int) -> RankFacts:
        info = self.state.ranks.get(str(rank))
        if info is None:
            info = self.state.ranks[str(rank)] = RankFacts(ema=Ema(self.settings.ema_alpha))
        return info

    def ranks(self) -> dict[int, RankFacts]:
        return {int(r): info for r, info in self.state.ranks.items()}

    def after(self, record: Record) -> None:
        """Fold a step into the per-rank facts, after the detectors judged it."""
        if not isinstance(record, StepRecord):
            return
        info = self.rank(record.rank)
        info.steps += 1
        info.last_step = record.step
        info.ended = False  # a step after its end: the rank is back
        info.last_time = record.time
        if record.loss is not None and math.isfinite(record.loss):
            info.ema.add(record.loss)

    def loss_kind(self, rank: int = 0) -> str:
        """How the loss-level detectors judge this rank's loss (``LOSS_KINDS``): what the run
        declared, else ``signed`` once its loss went below zero, else ``error``."""
        kind = self.state.loss_kind
        if kind in ("error", "auto") and self.rank(rank).negative_loss_step >= 0:
            return "signed"  # a declared "error" that goes negative is not one
        return "error" if kind == "auto" else kind

    def level_units(self, rank: int = 0) -> str | None:
        """The one judgement of whether this rank's loss has a stable level, and in what
        units the loss-level detectors (``divergence``'s level rule, ``loss_spike``,
        ``plateau``, ``overfitting``) measure a move away from it: ``"log"`` for an
        ``error`` (a ratio to its level, in log units), ``"linear"`` for a loss the run
        declared ``signed`` (its own units: no zero to take a ratio from), ``None`` where it
        has no stable level - declared ``nonstationary``, or a loss that went below zero
        with nothing declared (an RL or TD objective, whose level moves by design as its
        targets are redrawn). "Far above its recent level" means nothing where the level
        moves by design, so none of them judges one; gradients, non-finite values and the
        runaway rule still do.

            >>> from monitor_agent.detectors import DetectorSettings
            >>> ctx = DetectorContext(DetectorSettings())
            >>> ctx.level_units()
            'log'
            >>> ctx.rank(0).negative_loss_step = 40  # the loss went below zero at step 40
            >>> ctx.level_units() is None, ctx.loss_kind()
            (True, 'signed')
            >>> ctx.state.loss_kind = "signed"  # the run declared it
            >>> ctx.level_units()
            'linear'
        """
        kind = self.loss_kind(rank)
        if kind == "error":
            return "log"
        if kind == "signed" and self.state.loss_kind == "signed":
            return "linear"
        return None

    def saw(self, findings: list[Finding]) -> None:
        """Keep the latest alerting finding of each type (``ContextState.recent``)."""
        recent = self.state.recent
        for f in findings:
            if f.log_only or f.severity < Severity.WARNING:
                continue
            recent.pop(f.type, None)  # re-inserted last: the dict keeps them oldest first
            recent[f.type] = {"step": f.step, "rank": f.rank, "severity": f.severity.label}
        while len(recent) > RECENT_TYPES:
            recent.pop(next(iter(recent)))

    def ema_loss(self, rank: int = 0) -> float | None:
        info = self.state.ranks.get(str(rank))
        return info.ema.value if info is not None else None

    # -- layers ---------------------------------------------------------------------------

    def align(self, table: LayerTable) -> LayerView:
        """Columns of ``table`` in depth order plus stable slots (cached per name tuple)."""
        if self._cache is not None:
            names, view = self._cache
            if view.table is table:  # several detectors align the same record
                return view
            if names is table.names or names == table.names:
                view = LayerView(table, view.order, view.slots, len(self.state.layer_names),
                                 view.groups)
                self._cache = (names, view)
                return view
        slots = self._slots.of(table.names)
        order = self._depth_order(table.names)
        view = LayerView(table, order, slots, len(self.state.layer_names),
                         self._by_model(table.names, order))
        self._cache = (table.names, view)
        return view

    def _by_model(self, names: tuple[str, ...], order: np.ndarray) -> tuple[np.ndarray, ...]:
        """``order`` cut into the run's models (by name prefix, each in depth order); the
        one group ``order`` for a run of one model."""
        prefixes = self.state.model_prefixes
        if not prefixes:
            return (order,)
        groups: dict[int, list[int]] = {}
        for col in order.tolist():
            name = names[col]
            which = next((i for i, p in enumerate(prefixes) if name.startswith(p)), -1)
            groups.setdefault(which, []).append(col)
        return tuple(np.array(cols, dtype=np.intp) for _, cols in sorted(groups.items()))

    def _depth_order(self, names: tuple[str, ...]) -> np.ndarray:
        if not self.state.layer_order:
            return np.arange(len(names), dtype=np.intp)
        rank = {n: i for i, n in enumerate(self.state.layer_order)}
        cols = [c for c, n in enumerate(names) if n in rank]
        if not cols:  # the order names none of these parameters: use parameter order
            return np.arange(len(names), dtype=np.intp)
        cols.sort(key=lambda c: rank[names[c]])
        return np.array(cols, dtype=np.intp)

    def layer_name(self, slot: int) -> str:
        return self.state.layer_names[slot]

    # -- snapshot -------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return dump(self.state)

    def restore(self, data: dict[str, Any]) -> None:
        ranks = data.get("ranks", {})
        self.state = load_into(ContextState(), {k: v for k, v in data.items() if k != "ranks"})
        self.state.ranks = {
            r: load_into(RankFacts(ema=Ema(self.settings.ema_alpha)), v) for r, v in ranks.items()
        }
        self._slots = SlotIndex(self.state.layer_names)
        self._cache = None
        self.front = StepFront()
        for r, info in self.state.ranks.items():
            if info.steps and not info.ended:
                self.front.saw(int(r), info.last_step)


def host_label(labels: dict[str, str]) -> str | None:
    """The node a rank runs on: Kubernetes' ``node`` (the machine; ``hostname`` is the pod
    there), else ``hostname``, as the client's run record labels them."""
    return labels.get("node") or labels.get("hostname") or None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if math.isfinite(value) and value >= 0 else None
