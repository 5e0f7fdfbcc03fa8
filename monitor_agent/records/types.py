"""Plain dataclasses that flow through the sidecar once a record passed the wire edge.

The wire models (``schemas.py``) validate; ``from_wire`` turns one into these, field by
field and by name, so a new wire field is declared twice (model and dataclass) and never
copied by hand. A field whose internal form differs (a column table, a tuple) says how it
is built with ``wire_field``. Detectors, alerting, the store and the exposition only ever
see these types.

A step built directly equals the one ``from_wire`` makes of a wire object (a namespace
stands in for the validated model here); ``record_key`` is what makes a retry idempotent,
and severities order so ``max()`` picks the worst::

    >>> from types import SimpleNamespace
    >>> rec = StepRecord(run_id="r1", step=10, time=1.7e9, loss=2.3)
    >>> from_wire(SimpleNamespace(kind="step", run_id="r1", step=10, time=1.7e9, loss=2.3)) == rec
    True
    >>> record_key(rec)
    ('r1', 0, 'step', 10)
    >>> max(Severity.WARNING, Severity.CRITICAL).label, Severity.parse("error").pages
    ('critical', True)
"""

from __future__ import annotations

import dataclasses
import enum
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

_CONVERT = "wire_convert"
_SOURCE = "wire_source"


def wire_field(
    convert: Callable[[Any], Any], source: str | None = None, default: Any = None
) -> Any:
    """A record field built by ``convert`` from the wire field ``source`` (default: the
    same name); a missing, null or empty wire value leaves ``default``."""
    return field(default=default, metadata={_CONVERT: convert, _SOURCE: source})


LAYER_STATS: tuple[str, ...] = (
    "grad_norm",
    "grad_mean",
    "grad_std",
    "grad_max_abs",
    "grad_zero_frac",
    "param_norm",
    "update_norm",
)
"""The per-parameter statistics of docs/format.md, in a fixed column order."""
_ROW = operator.itemgetter(*LAYER_STATS)  # a layer's statistics, in column order


class Severity(enum.IntEnum):
    """Finding and alert severity; ordered so ``max()`` picks the worst."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def pages(self) -> bool:
        """Error and critical page a human; info and warning go to chat."""
        return self >= Severity.ERROR

    @classmethod
    def parse(cls, value: str | int | Severity) -> Severity:
        if isinstance(value, Severity):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[value.strip().upper()]
        except KeyError:
            names = ", ".join(s.label for s in cls)
            raise ValueError(f"unknown severity {value!r}; use one of: {names}") from None


@dataclass(frozen=True, slots=True)
class LayerTable:
    """Per-parameter statistics of one step, column-wise so detectors can vectorise.

    ``stats[name]`` is a float64 array aligned with ``names``; a statistic that was not
    measured for a parameter is NaN there and ``measured[name]`` is False. ``grad_none``
    marks parameters that got no gradient at all.
    """

    names: tuple[str, ...]
    stats: dict[str, np.ndarray]
    measured: dict[str, np.ndarray]
    grad_none: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    @classmethod
    def from_mapping(cls, layers: dict[str, dict[str, Any]]) -> LayerTable:
        names = tuple(layers)
        rows = list(layers.values())
        # One flat list, a row at a time through one C call (a row that lacks a statistic
        # takes the slow path): ingest builds a table for every step of every batch.
        values: list[Any] = []
        for row in rows:
            try:
                values.extend(_ROW(row))
            except KeyError:
                values.extend([row.get(stat) for stat in LAYER_STATS])
        # numpy turns None into NaN for a float array; NaN is also data (a NaN gradient),
        # so only where NaN shows up do we look back at which ones were really missing.
        matrix = np.array(values, dtype=np.float64).reshape(len(rows), len(LAYER_STATS))
        measured = np.ones(matrix.shape, dtype=bool)
        for i in np.flatnonzero(np.isnan(matrix)):
            measured.flat[i] = values[i] is not None
        stats = {stat: matrix[:, k] for k, stat in enumerate(LAYER_STATS)}
        masks = {stat: measured[:, k] for k, stat in enumerate(LAYER_STATS)}
        grad_none = np.array([bool(row.get("grad_none")) for row in rows], dtype=bool)
        return cls(names=names, stats=stats, measured=masks, grad_none=grad_none)

    @classmethod
    def from_norms(cls, norms: dict[str, float | None]) -> LayerTable:
        """A table of grad norms only (a step's gated per-parameter norms)."""
        return cls.from_mapping({n: {"grad_norm": v} for n, v in norms.items()})

    def get(self, stat: str) -> np.ndarray:
        return self.stats[stat]

    def row(self, name: str) -> dict[str, float | None]:
        i = self.names.index(name)
        return {s: (float(self.stats[s][i]) if self.measured[s][i] else None) for s in LAYER_STATS}


QUANTILE_LEVELS: tuple[float, ...] = (0.0, 0.01, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)
"""The levels of a histogram's optional ``quantiles`` (min, p1, p25, p50, p75, p95, p99, max)."""


@dataclass(frozen=True, slots=True)
class QuantileTable:
    """Per-parameter distribution quantiles of one step, as one (P, 8) float64 array.

    Built from ``grad_hist`` / ``param_hist`` entries that carry ``quantiles``; parameters
    whose histogram has none are left out, so every row is complete (``b`` below)::

        >>> w = {"edges": [-1.0, 0.0, 1.0], "counts": [3.0, 5.0],
        ...      "quantiles": [-1, -0.9, -0.2, 0.1, 0.2, 0.6, 0.9, 1]}
        >>> q = QuantileTable.from_hists({"w": w, "b": {"edges": [0.0, 1.0], "counts": [2.0]}})
        >>> q.names, q.values[:, QUANTILE_LEVELS.index(0.5)]   # the medians
        (('w',), array([0.1]))
    """

    names: tuple[str, ...]
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    @classmethod
    def from_hists(cls, hists: dict[str, dict[str, Any]]) -> QuantileTable | None:
        width = len(QUANTILE_LEVELS)
        rows = [(n, h["quantiles"]) for n, h in hists.items()
                if len(h.get("quantiles") or ()) == width]
        if not rows:
            return None
        values = np.array([q for _, q in rows], dtype=np.float64).reshape(len(rows), width)
        return cls(names=tuple(n for n, _ in rows), values=values)


ACTIVATION_STATS: tuple[str, ...] = (
    "mean", "std", "max_abs", "zero_frac", "dead_frac", "nonfinite",
)
"""The per-module activation statistics of a step record, in a fixed column order."""


@dataclass(frozen=True, slots=True)
class ActivationTable:
    """Per-module activation statistics of one step, column-wise (NaN where not measured:
    ``dead_frac`` is null for modules that are not ReLU-family)::

        >>> table = ActivationTable.from_mapping({"mlp.act": {"mean": 0.1, "max_abs": 3.0}})
        >>> table.names, table.stats["max_abs"], table.stats["dead_frac"]
        (('mlp.act',), array([3.]), array([nan]))
    """

    names: tuple[str, ...]
    stats: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.names)

    @classmethod
    def from_mapping(cls, modules: dict[str, dict[str, Any]]) -> ActivationTable:
        rows = [[row.get(s) for s in ACTIVATION_STATS] for row in modules.values()]
        matrix = np.array(rows, dtype=np.float64).reshape(len(rows), len(ACTIVATION_STATS))
        return cls(names=tuple(modules),
                   stats={s: matrix[:, k] for k, s in enumerate(ACTIVATION_STATS)})


@dataclass(frozen=True, slots=True)
class Memory:
    device: str | None = None
    allocated_bytes: float | None = None
    reserved_bytes: float | None = None
    peak_allocated_bytes: float | None = None
    total_bytes: float | None = None


@dataclass(frozen=True, slots=True)
class WatchdogDeclaration:
    """The client's hang watchdog as the run record declares it (docs/format.md)."""

    floor_seconds: float
    factor: float
    warmup_steps: int = 5


@dataclass(frozen=True, slots=True)
class ClusterPlacement:
    """Where a rank's node sits in a multi-node job, as its run record says
    (docs/format.md, ``cluster``): node 0's sidecar leads the run (monitor_agent/cluster)."""

    node_rank: int
    nodes: int
    local_world_size: int | None = None
    leader_url: str | None = None


@dataclass(frozen=True, slots=True)
class LauncherDeclaration:
    """What starts the sending process, as its run record says (docs/format.md,
    ``launcher``): whether it runs the process again when it exits with the restart status
    (75) and how far it may, which a ``restart`` action needs (alerting/restart.py)."""

    name: str = "none"
    restarts: bool = False
    restart_count: int | None = None
    max_restarts: int | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """Which process sent a run record (docs/format.md, ``process``): its pid, its start
    time in clock ticks after boot (``/proc/<pid>/stat`` field 22) and its machine's boot
    id, which the sidecar checks before it ends a stopped rank (cluster/stopped_rank.py)."""

    pid: int
    start: int
    boot: str


@dataclass(frozen=True, slots=True)
class RunRecord:
    """The first record of a run: hyper-parameters, model shape, hardware, labels."""

    run_id: str
    time: float | None = None
    rank: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    attempt: str | None = None  # the sending process's token (pipeline/attempts.py)
    watchdog: WatchdogDeclaration | None = wire_field(
        lambda w: from_fields(WatchdogDeclaration, w))
    cluster: ClusterPlacement | None = wire_field(lambda c: from_fields(ClusterPlacement, c))
    launcher: LauncherDeclaration | None = wire_field(
        lambda w: from_fields(LauncherDeclaration, w))
    process: ProcessIdentity | None = wire_field(lambda p: from_fields(ProcessIdentity, p))
    # How it leaves a rollback plan's windows out: "sampler" or "reading" (``data``).
    skips_by: str | None = wire_field(lambda d: d.skips_by, source="data")
    kind: str = "run"

    @property
    def step(self) -> int:
        # A run record has no step; it sorts before every step of the run.
        return -1

    @property
    def layer_order(self) -> list[str] | None:
        order = self.model.get("layer_order")
        return list(order) if isinstance(order, list) else None

    @property
    def model_prefixes(self) -> list[str]:
        """The parameter-name prefix of each model of a run that watches several
        (``model.models[*].prefix``, e.g. ``"G."``); [] for one model."""
        models = self.model.get("models")
        if not isinstance(models, list):
            return []
        return [m["prefix"] for m in models
                if isinstance(m, dict) and isinstance(m.get("prefix"), str) and m["prefix"]]


GUARD_SKIP_REASONS: tuple[str, ...] = ("nonfinite_grad", "grad_norm_outlier")
"""``skip_reason`` values of a step the client's step guard skipped (not the GradScaler's
``loss_scale``): the weights and optimizer state never saw its batch."""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One optimizer step as measured on one rank."""

    run_id: str
    step: int
    time: float
    rank: int = 0
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    clip_threshold: float | None = None
    param_norm: float | None = None
    update_norm: float | None = None
    tokens: float | None = None
    samples: float | None = None
    step_time: float | None = None
    data_time: float | None = None
    # The part of data_time the device spent idle (CUDA: the training stream, from two
    # events around the wait); absent on CPU, where the thread's wait is the device's.
    data_idle_time: float | None = None
    compute_time: float | None = None
    sync_wait_time: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    loss_scale: float | None = None
    skipped: bool = wire_field(bool, default=False)
    skip_reason: str | None = None  # schemas.StepModel's literal; None: not skipped/unknown
    # Batches (or samples) of the run's data stream consumed through this step.
    data_position: int | None = None
    memory: Memory | None = wire_field(lambda m: from_fields(Memory, m))
    gpu: dict[str, float | None] | None = wire_field(dict)
    layers: LayerTable | None = wire_field(LayerTable.from_mapping)
    grad_hist: dict[str, dict[str, list[float]]] | None = wire_field(dict)
    param_hist: dict[str, dict[str, list[float]]] | None = wire_field(dict)
    # The quantiles of grad_hist / param_hist, vectorised for detectors and exposition.
    grad_quantiles: QuantileTable | None = wire_field(QuantileTable.from_hists, "grad_hist")
    param_quantiles: QuantileTable | None = wire_field(QuantileTable.from_hists, "param_hist")
    activations: ActivationTable | None = wire_field(ActivationTable.from_mapping)
    # Per-parameter grad norms of a step that is not a monitored one (the client sends
    # them when the global norm is non-finite or far above its median); grad_norm only.
    grad_norms: LayerTable | None = wire_field(LayerTable.from_norms)
    # Modules whose forward output was non-finite, in forward order (the first is where
    # the forward pass broke), and how many there were in all.
    nonfinite_modules: tuple[str, ...] | None = wire_field(tuple)
    nonfinite_module_count: int | None = None
    nonfinite_check: str | None = None  # "full" (every element) or "sampled" (_finite.py)
    # The script's own numbers (log_step(..., metrics=...)): charted, never judged.
    metrics: dict[str, float | None] | None = None
    # A run watching several models: each one's own grad/param/update norm, LR, clipping
    # threshold and skip, by the model's name (its parameters are "<name>.<parameter>").
    models: dict[str, dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    attempt: str | None = None  # the sending process's token (pipeline/attempts.py)
    kind: str = "step"

    @property
    def input_wait(self) -> float | None:
        """Seconds the device waited for data this step: ``data_idle_time`` where the client
        measured it (a GPU: the loader's wait less what the device spent on work queued
        before it), else ``data_time`` (CPU, or a synchronous loop: the training thread's
        wait is the device's). None when neither is a finite number >= 0. The goodput
        ledger's ``input`` badput and ``input_bound`` both read it (docs/goodput.md)."""
        for value in (self.data_idle_time, self.data_time):
            if value is not None and math.isfinite(value) and value >= 0:
                return value
        return None

    @property
    def guard_skipped(self) -> bool:
        """The client's step guard skipped this step: its batch never reached the weights."""
        return self.skipped and self.skip_reason in GUARD_SKIP_REASONS

    @property
    def update_ratio(self) -> float | None:
        if self.update_norm is None or not self.param_norm:
            return None
        return self.update_norm / self.param_norm

    @property
    def layer_grads(self) -> LayerTable | None:
        """The per-parameter grad norms this step has: the full table or the gated ones."""
        return self.layers if self.layers is not None else self.grad_norms

    @property
    def clip_coef(self) -> float:
        """What clipping multiplied the gradient by (1.0 when it did not bite)."""
        g, c = self.grad_norm, self.clip_threshold
        if g is None or c is None or c <= 0 or not (g > c):
            return 1.0
        return c / (g + 1e-6)

    @property
    def effective_lr(self) -> float | None:
        """||update|| / ||clipped gradient||: the step size the optimizer really took per
        unit of gradient (SGD: the lr; Adam: lr over the gradient's RMS scale)."""
        g = self.grad_norm
        if self.update_norm is None or g is None or not g > 0 or g == float("inf"):
            return None
        return self.update_norm / (g * self.clip_coef)


@dataclass(frozen=True, slots=True)
class EvalRecord:
    """A validation pass."""

    run_id: str
    step: int
    time: float
    rank: int = 0
    val_loss: float | None = None
    train_loss: float | None = None
    epoch: float | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)
    seconds: float | None = None  # how long the evaluation took (runs/goodput.py)
    attempt: str | None = None  # the sending process's token (pipeline/attempts.py)
    kind: str = "eval"


@dataclass(frozen=True, slots=True)
class EndRecord:
    """The last record of a run (of one rank's process: how it ended; ``launcher_stopped``)."""

    run_id: str
    step: int
    time: float
    rank: int = 0
    status: str = "completed"
    error: str | None = None
    attempt: str | None = None  # the sending process's token (pipeline/attempts.py)
    kind: str = "end"


LAUNCHER_STOPPED = "SIGTERM: stopped by its launcher"
"""How a rank's end error begins when its launcher stopped it (client/_sigterm.py)."""


def launcher_stopped(status: str, error: str | None) -> bool:
    """Whether an end (``status``, ``error``) is a launcher stopping its worker: torchrun's
    agent stops every worker once one of them died, or the whole job. It does not say how
    the attempt ended (runs/attempt_end.py judges that from every rank's end)."""
    return status == "stopped" and (error or "").startswith(LAUNCHER_STOPPED)


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """A checkpoint the trainer saved: ``step`` is the optimizer step whose state it holds
    (loading it, the loop's next step is ``step + 1``); the sidecar's ledger judges it
    clean or suspect (runs/checkpoint_ledger.py)."""

    run_id: str
    step: int
    time: float
    path: str
    rank: int = 0
    bytes: int | None = None
    tag: str | None = None
    data_position: int | None = None  # where its state resumes the data stream
    seconds: float | None = None  # how long the save took (runs/goodput.py)
    attempt: str | None = None  # the sending process's token (pipeline/attempts.py)
    kind: str = "checkpoint"


@dataclass(frozen=True, slots=True)
class HangRecord:
    """A rank's watchdog saw no step complete for longer than its limit: where each of the
    process's threads is (``threads``: dicts of name, training, frames; frames outermost
    first, each a dict of file, line, function, user), what it was last doing."""

    run_id: str
    step: int  # the last step the rank completed
    time: float
    stuck_seconds: float
    rank: int = 0
    limit_seconds: float | None = None
    phase: str = "unknown"
    phase_seconds: float | None = None
    threads: tuple[dict[str, Any], ...] = wire_field(tuple, default=())
    threads_omitted: int = 0
    nccl_trace: str | None = None
    attempt: str | None = None  # the sending process's token (pipeline/attempts.py)
    kind: str = "hang"

    def training_frames(self) -> list[dict[str, Any]]:
        """The frames of the thread that runs the training loop (else the first thread)."""
        for thread in self.threads:
            if thread.get("training"):
                return list(thread.get("frames") or ())
        return list(self.threads[0].get("frames") or ()) if self.threads else []


@dataclass(frozen=True, slots=True)
class AgreementRecord:
    """A rank held the job's action back at an agreed call (docs/format.md): it lacked the
    action (``missing``) or held another content under its id (``mismatch``), so no rank
    acted (client/monitor_client/_agreement.py)."""

    run_id: str
    step: int  # the rank's last step
    time: float
    action_id: int
    action: str
    outcome: str
    rank: int = 0
    rounds: int = 1
    check_every: int | None = None
    detail: str | None = None
    attempt: str | None = None  # the sending process's token (pipeline/attempts.py)
    kind: str = "agreement"


Record = (RunRecord | StepRecord | EvalRecord | EndRecord | CheckpointRecord | HangRecord
          | AgreementRecord)
RECORD_TYPES: dict[str, type[Record]] = {
    "run": RunRecord, "step": StepRecord, "eval": EvalRecord, "end": EndRecord,
    "checkpoint": CheckpointRecord, "hang": HangRecord, "agreement": AgreementRecord,
}
_T = TypeVar("_T")
# How each dataclass is filled from a wire object, worked out once per class rather than per
# record (ingest converts every record of every batch): the names copied as they are, and
# (name, source, convert) for the fields built from a wire value.
_Plan = tuple[tuple[str, ...], tuple[tuple[str, str, Callable[[Any], Any]], ...]]


def _plan(cls: type) -> _Plan:
    fields = dataclasses.fields(cls)
    return (tuple(f.name for f in fields if _CONVERT not in f.metadata),
            tuple((f.name, f.metadata[_SOURCE] or f.name, f.metadata[_CONVERT])
                  for f in fields if _CONVERT in f.metadata))


_PLANS: dict[type, _Plan] = {cls: _plan(cls)
                             for cls in (Memory, WatchdogDeclaration, ClusterPlacement,
                                         LauncherDeclaration, ProcessIdentity,
                                         *RECORD_TYPES.values())}


def from_fields(cls: type[_T], source: Any) -> _T:
    """An instance of the dataclass ``cls`` from the same-named attributes of ``source``
    (a validated wire model); attributes ``source`` lacks keep their defaults."""
    # The instance dict, not getattr: a pydantic model raises (slowly) for a missing
    # attribute, and every step lacks ``extra``.
    attrs = vars(source)
    copied, built = _PLANS[cls]
    values = {name: attrs[name] for name in copied if name in attrs}
    for name, attr, convert in built:
        value = attrs.get(attr)
        if value:  # null, empty or false: the default
            values[name] = convert(value)
    return cls(**values)


def from_wire(source: Any) -> Record:
    """The record a validated wire object (its ``kind`` picks the dataclass) stands for."""
    return from_fields(RECORD_TYPES[source.kind], source)


def record_key(record: Record) -> tuple[str, int, str, int]:
    """Idempotency key: a retry of the same record never counts twice."""
    return (record.run_id, record.rank, record.kind, record.step)


@dataclass(frozen=True, slots=True)
class Finding:
    """What a detector concluded about one record (or about silence, for ``stalled``).

    ``value`` is what was observed, ``threshold`` what it was judged against (a limit or a
    baseline); ``evidence`` holds the numbers behind the decision and ``suggestions`` what
    to try next, most likely fix first.
    """

    type: str
    severity: Severity
    run_id: str
    step: int
    message: str
    rank: int = 0
    layer: str | None = None
    value: float | None = None
    threshold: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    suggestions: tuple[str, ...] = ()
    time: float | None = None
    log_only: bool = False
    attempt: int = 1  # the run's attempt whose record it judged (pipeline/attempts.py)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "type": self.type,
            "severity": self.severity.label,
            "step": self.step,
            "rank": self.rank,
            "layer": self.layer,
            "value": self.value,
            "threshold": self.threshold,
            "message": self.message,
            "evidence": self.evidence,
            "suggestions": list(self.suggestions),
            "time": self.time,
            "log_only": self.log_only,
            "attempt": self.attempt,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        """``to_dict``'s inverse (a snapshot's held finding, a node sidecar's forwarded
        one); KeyError, ValueError or TypeError for a dict that is not one."""
        return cls(type=str(d["type"]), severity=Severity.parse(d["severity"]),
                   run_id=str(d["run_id"]), step=int(d["step"]), message=str(d["message"]),
                   rank=int(d.get("rank") or 0), layer=d.get("layer"), value=d.get("value"),
                   threshold=d.get("threshold"), evidence=dict(d.get("evidence") or {}),
                   suggestions=tuple(str(s) for s in d.get("suggestions") or ()),
                   time=d.get("time"), log_only=bool(d.get("log_only")),
                   attempt=int(d.get("attempt") or 1))

    @property
    def partial_view(self) -> bool:
        """Made without the whole run in view (a node sidecar whose run leader is away,
        or a leader that does not hear every node: monitor_agent/cluster): it is paged,
        saying so, but no rule acts on it."""
        return self.evidence.get("view") == "partial"

    def seen_partially(self, why: str) -> Finding:
        """This finding, marked as made from a partial view of the run, and why."""
        if self.partial_view:
            return self
        return dataclasses.replace(
            self, message=f"{self.message} [partial view: {why}]",
            evidence={"view": "partial", "view_reason": why, **self.evidence})
