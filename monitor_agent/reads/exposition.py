"""Renders run state as Prometheus text (format 0.0.4), fast and without label churn.

A custom renderer rather than prometheus_client gauges: the series follow the runs the
engine holds (a run that expires simply stops being rendered, so no stale series linger),
and each run's lines are rendered once per change of that run and cached, so a scrape
costs a string join for every run that did not move since the last one.

Every label-cardinality cap (runs, ranks, layers, eval series) goes through one
``SeriesCaps``, which reports what it cut to the ``on_drop`` callback (the
``monitor_agent_dropped_series_total`` counter in the app).

The app passes ``engine.registry.states`` and its self-metrics registry; here two runs
in memory, one over a cap of one::

    >>> from monitor_agent.runs.run_state import RunState
    >>> runs = [RunState.new(run_id, now=now) for run_id, now in (("gpt-7", 0.0), ("gpt-8", 1.0))]
    >>> nan = StepRecord(run_id="gpt-7", step=300, time=5.0, loss=float("nan"))
    >>> runs[0].apply_step(nan, arrival=5.0, buckets=n.STEP_DURATION_BUCKETS)
    >>> exp = Exposition(lambda: runs, CollectorRegistry(), max_runs=1,
    ...                  on_drop=lambda reason, count: print("dropped", count, reason))
    >>> body = exp.render()   # bytes, Prometheus text format 0.0.4
    dropped 1 max_runs
    >>> [line for line in body.decode().splitlines() if line.startswith("training_loss{")]
    ['training_loss{project="",run_id="gpt-7",rank="0"} NaN']
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from prometheus_client import CollectorRegistry, generate_latest

from monitor_agent.detectors.category_divergence import PREFIX as CATEGORY_PREFIX
from monitor_agent.metrics import names as n
from monitor_agent.records.limits import scrub
from monitor_agent.records.types import QUANTILE_LEVELS, QuantileTable, StepRecord
from monitor_agent.runs.ettr import RECOVERY_BUCKETS, ettr_of
from monitor_agent.runs.goodput import GoodputReport
from monitor_agent.runs.node_verdict import MAX_NODES_EXPOSED
from monitor_agent.runs.progress import run_progress
from monitor_agent.runs.run_state import RankState, RunState

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def fmt(value: float) -> str:
    """Prometheus spelling of a float (NaN, +Inf, -Inf are samples like any other); a
    finite one as orjson writes it: the shortest text that reads back as the same float
    (as ``repr``, about ten times faster; ``1e-05`` is written ``0.00001``)."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    return orjson.dumps(float(value)).decode()


def escape(value: str) -> str:
    # scrub: values stored by older versions may hold what the edge now rejects (a lone
    # surrogate cannot even be encoded); one such row must not break /metrics for everyone.
    value = value.replace("\\", r"\\").replace('"', r"\"")
    if value.isprintable():  # the common case, cheap; else newlines and worse
        return value
    return scrub(value.replace("\n", r"\n"))


def fmts(values: np.ndarray) -> list[str]:
    """``fmt`` of each value of a float array: one orjson call for the lot when all are
    finite (the usual layer table; formatting floats one by one was most of a cold
    scrape), else value by value."""
    listed = values.tolist()
    if not listed:
        return []
    if np.isfinite(values).all():
        return orjson.dumps(listed)[1:-1].decode().split(",")
    return [fmt(v) for v in listed]


class EscapedNames:
    """Layer and module names escaped for a label value, kept across renders: a run's
    names stay the same from step to step, and escaping 320 of them per rank was a fifth
    of a cold scrape. At most ``limit`` sets are kept (then it starts over)."""

    def __init__(self, limit: int = 4096) -> None:
        self._known: dict[tuple[str, ...], list[str]] = {}
        self._limit = limit

    def of(self, names: Sequence[str]) -> list[str]:
        key = tuple(names)
        found = self._known.get(key)
        if found is None:
            if len(self._known) >= self._limit:
                self._known.clear()
            found = self._known[key] = [escape(name) for name in key]
        return found


def _step_attr(attr: str) -> Callable[[StepRecord], float | None]:
    return lambda rec: getattr(rec, attr)


def _mem_attr(attr: str) -> Callable[[StepRecord], float | None]:
    return lambda rec: getattr(rec.memory, attr) if rec.memory is not None else None


def _gpu_attr(key: str) -> Callable[[StepRecord], float | None]:
    return lambda rec: rec.gpu.get(key) if rec.gpu else None


def _remap_pending(rec: StepRecord) -> float | None:
    # A remapped row (Ampere and later) or a retired page (earlier) waiting for a reset.
    if not rec.gpu:
        return None
    found = [v for v in (rec.gpu.get("remapped_rows_pending"),
                         rec.gpu.get("retired_pages_pending")) if v is not None]
    return max(found) if found else None


# Gauges read off the latest step record of each rank.
STEP_GAUGES: tuple[tuple[n.MetricName, Callable[[StepRecord], float | None]], ...] = (
    (n.LOSS, _step_attr("loss")),
    (n.LEARNING_RATE, _step_attr("lr")),
    (n.GRAD_NORM, _step_attr("grad_norm")),
    (n.CLIP_THRESHOLD, _step_attr("clip_threshold")),
    (n.PARAM_NORM, _step_attr("param_norm")),
    (n.UPDATE_NORM, _step_attr("update_norm")),
    (n.UPDATE_RATIO, _step_attr("update_ratio")),
    (n.TOKENS_PER_SECOND, _step_attr("tokens_per_second")),
    (n.MFU, _step_attr("mfu")),
    (n.LOSS_SCALE, _step_attr("loss_scale")),
    (n.DATA_WAIT, _step_attr("data_time")),
    (n.COMPUTE_TIME, _step_attr("compute_time")),
    (n.SYNC_WAIT, _step_attr("sync_wait_time")),
    (n.MEM_ALLOCATED, _mem_attr("allocated_bytes")),
    (n.MEM_RESERVED, _mem_attr("reserved_bytes")),
    (n.MEM_PEAK, _mem_attr("peak_allocated_bytes")),
    (n.MEM_TOTAL, _mem_attr("total_bytes")),
    (n.GPU_UTIL, _gpu_attr("utilization")),
    (n.GPU_TEMP, _gpu_attr("temperature_c")),
    (n.GPU_POWER, _gpu_attr("power_w")),
    (n.GPU_POWER_LIMIT, _gpu_attr("power_limit_w")),
    (n.GPU_SM_CLOCK, _gpu_attr("sm_clock_mhz")),
    (n.GPU_SM_CLOCK_MAX, _gpu_attr("sm_clock_max_mhz")),
    (n.GPU_REMAP_PENDING, _remap_pending),
    (n.GPU_REMAP_FAILURE, _gpu_attr("remapped_rows_failure")),
    (n.GPU_PCIE_WIDTH, _gpu_attr("pcie_link_width")),
    (n.GPU_PCIE_WIDTH_MAX, _gpu_attr("pcie_link_width_max")),
    (n.GPU_PCIE_GEN, _gpu_attr("pcie_link_gen")),
    (n.GPU_PCIE_GEN_MAX, _gpu_attr("pcie_link_gen_max")),
    (n.GPU_XID_EVENTS, _gpu_attr("xid_count")),
    (n.GPU_LAST_XID, _gpu_attr("xid_last")),
    (n.GPU_LOST, _gpu_attr("gpu_lost")),
    (n.LAST_STEP_TS, _step_attr("time")),
)
# GPU gauges with a label of their own: (family, label values, the gpu key), per rank.
GPU_LABELLED: tuple[tuple[n.MetricName, str, str], ...] = (
    (n.GPU_THROTTLE, 'reason="thermal"', "throttle_thermal"),
    (n.GPU_THROTTLE, 'reason="power"', "throttle_power"),
    (n.GPU_THROTTLE, 'reason="hw_slowdown"', "throttle_hw_slowdown"),
    (n.GPU_ECC_ERRORS, 'error="corrected",counter="volatile"', "ecc_corrected_volatile"),
    (n.GPU_ECC_ERRORS, 'error="corrected",counter="aggregate"', "ecc_corrected_aggregate"),
    (n.GPU_ECC_ERRORS, 'error="uncorrected",counter="volatile"', "ecc_uncorrected_volatile"),
    (n.GPU_ECC_ERRORS, 'error="uncorrected",counter="aggregate"', "ecc_uncorrected_aggregate"),
    (n.GPU_REMAPPED_ROWS, 'kind="correctable"', "remapped_rows_correctable"),
    (n.GPU_REMAPPED_ROWS, 'kind="uncorrectable"', "remapped_rows_uncorrectable"),
)
LAYER_GAUGES: tuple[tuple[n.MetricName, str], ...] = (
    (n.LAYER_GRAD_NORM, "grad_norm"),
    (n.LAYER_UPDATE_RATIO, "update_ratio"),
    (n.LAYER_GRAD_ZERO, "grad_zero_frac"),
)
# Per-module activation gauges (label ``module``), from the latest monitored step.
ACTIVATION_GAUGES: tuple[tuple[n.MetricName, str], ...] = (
    (n.ACT_MEAN, "mean"),
    (n.ACT_STD, "std"),
    (n.ACT_MAX_ABS, "max_abs"),
    (n.ACT_ZERO, "zero_frac"),
    (n.ACT_DEAD, "dead_frac"),
    (n.ACT_NONFINITE, "nonfinite"),
)
_QUANTILE_LABELS = tuple(f"{q:g}" for q in QUANTILE_LEVELS)  # "0", "0.01", ..., "1"
RANK_COUNTERS: tuple[tuple[n.MetricName, str], ...] = (
    (n.STEPS, "steps_total"),
    (n.TOKENS, "tokens_total"),
    (n.SAMPLES, "samples_total"),
    (n.SKIPPED_STEPS, "skipped_total"),
)


def _ignore_drop(reason: str, count: int) -> None:
    pass


@dataclass(frozen=True, slots=True)
class SeriesCaps:
    """The label-cardinality caps of /metrics, and where a cut is reported::

        >>> caps = SeriesCaps(max_layers=2, on_drop=lambda reason, count: print(reason, count))
        >>> caps.keep("max_layers", 5, caps.max_layers)   # 2 of 5 layers kept
        max_layers 3
        2
        >>> caps.keep("max_layers", 2, caps.max_layers)   # all fit: nothing reported
        2
    """

    max_runs: int = 1000
    max_layers: int = 2000
    max_ranks: int = 256
    max_eval_series: int = 64
    on_drop: Callable[[str, int], None] = _ignore_drop

    def keep(self, reason: str, count: int, limit: int) -> int:
        """How many of ``count`` series fit under ``limit``; the rest are reported dropped
        under ``reason`` (the ``reason`` label of the dropped-series counter)."""
        if count <= limit:
            return count
        self.on_drop(reason, count - limit)
        return limit


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    type: str
    help: str

    def header(self) -> str:
        return f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.type}\n"


def _family(m: n.MetricName) -> Family:
    if m.type == "counter":
        return Family(m.name + "_total", "counter", m.help)
    if m.type == "info":
        return Family(m.name, "gauge", m.help)
    return Family(m.name, m.type, m.help)


FAMILIES: tuple[Family, ...] = tuple(
    _family(m)
    for m in (
        *(g for g, _ in STEP_GAUGES),
        *dict.fromkeys(g for g, _, _ in GPU_LABELLED),
        n.LOSS_EMA, n.VAL_LOSS, n.EVAL_TRAIN_LOSS, n.EVAL_METRIC, n.CATEGORY_LOSS, n.LAST_STEP,
        n.LAST_CLEAN_CHECKPOINT, n.PROGRESS, n.ETA, n.STEP_DURATION,
        *(c for c, _ in RANK_COUNTERS),
        n.SKIPPED_STEPS_BY_REASON,
        n.EFFECTIVE_LR,
        *(g for g, _ in LAYER_GAUGES),
        n.LAYER_EFFECTIVE_LR,
        *(g for g, _ in ACTIVATION_GAUGES),
        n.LAYER_GRAD_QUANTILE, n.LAYER_PARAM_QUANTILE,
        n.GOODPUT_RATIO, n.PRODUCTIVE_SECONDS, n.BADPUT_SECONDS, n.RUN_WALL_SECONDS,
        n.RUN_GPUS, n.STRAGGLER_SECONDS, n.TIME_TO_START, n.FAILURES, n.TIME_TO_RECOVER,
        n.FINDINGS, n.HUNG_RANKS, n.NODE_VERDICT, n.ACTIONS, n.RUN_INFO, n.ALERTS_FIRING,
        n.ALERT_ACTIVE,
    )
)


class Exposition:
    """Renders every exposed run plus the self-metrics registry."""

    def __init__(
        self,
        runs: Callable[[], Iterable[RunState]],
        registry: CollectorRegistry,
        *,
        max_runs: int = 1000,
        max_layers: int = 2000,
        max_ranks: int = 256,
        max_eval_series: int = 64,
        alerts: Callable[[], Sequence[Any]] | None = None,
        actions: Callable[[], dict[tuple[str, str, str], int]] | None = None,
        on_drop: Callable[[str, int], None] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._runs = runs
        self._on_error = on_error
        self._registry = registry
        self._alerts = alerts
        self._actions = actions
        self.caps = SeriesCaps(max_runs, max_layers, max_ranks, max_eval_series,
                               on_drop or _ignore_drop)
        self._cache: dict[str, tuple[int, dict[str, str]]] = {}
        self._names = EscapedNames()

    def render(self) -> bytes:
        runs = sorted(self._runs(), key=lambda r: r.first_seen)
        runs = runs[: self.caps.keep("max_runs", len(runs), self.caps.max_runs)]
        chunks = []
        for run in runs:
            try:
                chunks.append(self._chunks(run))
            except Exception:  # one run's odd value costs its series, not every scrape
                log.exception("/metrics: run %s left out of this scrape", run.run_id)
                if self._on_error is not None:
                    self._on_error()
        live = {run.run_id for run in runs}
        for run_id in [k for k in self._cache if k not in live]:
            del self._cache[run_id]
        by_id = {r.run_id: r for r in runs}
        alert_lines = {**self._alert_lines(by_id), **self._action_lines(by_id)}
        parts: list[str] = []
        for fam in FAMILIES:
            parts.append(fam.header())
            parts.extend(c.get(fam.name, "") for c in chunks)
            parts.append(alert_lines.get(fam.name, ""))
        return "".join(parts).encode() + generate_latest(self._registry)

    def _chunks(self, run: RunState) -> dict[str, str]:
        cached = self._cache.get(run.run_id)
        version = run.version
        if cached is not None and cached[0] == version:
            return cached[1]
        chunks = RunRenderer(run, self.caps, self._names).render()
        self._cache[run.run_id] = (version, chunks)
        return chunks

    def _alert_lines(self, runs: dict[str, RunState]) -> dict[str, str]:
        if self._alerts is None:
            return {}
        firing: dict[tuple[str, str, str], int] = {}
        active: list[str] = []
        for alert in self._alerts():
            run = runs.get(alert.run_id)
            if run is None:
                continue
            base = f'project="{escape(run.project)}",run_id="{escape(run.run_id)}"'
            key = (base, alert.alertname, alert.severity)
            firing[key] = firing.get(key, 0) + 1
            active.append(
                f'{n.ALERT_ACTIVE.name}{{{base},alertname="{escape(alert.alertname)}",'
                f'severity="{escape(alert.severity)}",layer="{escape(alert.layer or "")}",'
                f'summary="{escape(_clip(alert.summary))}",'
                f'suggestion="{escape(_clip(alert.suggestion or ""))}"}} 1\n'
            )
        lines = [
            f'{n.ALERTS_FIRING.name}{{{base},alertname="{escape(name)}",'
            f'severity="{escape(sev)}"}} {count}\n'
            for (base, name, sev), count in firing.items()
        ]
        return {n.ALERTS_FIRING.name: "".join(lines), n.ALERT_ACTIVE.name: "".join(active)}


    def _action_lines(self, runs: dict[str, RunState]) -> dict[str, str]:
        if self._actions is None:
            return {}
        fam = n.ACTIONS.name + "_total"
        lines = [
            f'{fam}{{project="{escape(run.project)}",run_id="{escape(run_id)}",'
            f'action="{escape(action)}",rule="{escape(rule)}"}} {count}\n'
            for (run_id, action, rule), count in sorted(self._actions().items())
            if (run := runs.get(run_id)) is not None
        ]
        return {fam: "".join(lines)}


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class RunRenderer:
    """Renders the lines of one run, family by family, within ``caps``::

        >>> from monitor_agent.runs.run_state import RunState
        >>> run = RunState.new("gpt-7", now=0.0)
        >>> step = StepRecord(run_id="gpt-7", step=10, time=5.0, loss=2.5, lr=3e-4)
        >>> run.apply_step(step, arrival=5.0, buckets=n.STEP_DURATION_BUCKETS)
        >>> chunks = RunRenderer(run, SeriesCaps()).render()   # {family name: its lines}
        >>> print(chunks["training_loss"] + chunks["training_learning_rate"], end="")
        training_loss{project="",run_id="gpt-7",rank="0"} 2.5
        training_learning_rate{project="",run_id="gpt-7",rank="0"} 0.0003
    """

    def __init__(self, run: RunState, caps: SeriesCaps,
                 names: EscapedNames | None = None) -> None:
        self.run, self.caps = run, caps
        self.names = names if names is not None else EscapedNames()
        self.out: dict[str, list[str]] = {}
        self.run_labels = f'project="{escape(run.project)}",run_id="{escape(run.run_id)}"'

    def add(self, family: str, labels: str, value: float | None) -> None:
        if value is None:
            return
        self.out.setdefault(family, []).append(f"{family}{{{labels}}} {fmt(value)}\n")

    def render(self) -> dict[str, str]:
        # A run leader's digests of other nodes' ranks are not exposed here: each node's
        # sidecar exposes its own ranks, and Prometheus would count them twice.
        ranks = sorted((r, s) for r, s in self.run.ranks.items() if not s.remote)
        ranks = ranks[: self.caps.keep("max_ranks", len(ranks), self.caps.max_ranks)]
        for rank, state in ranks:
            self._rank(f'{self.run_labels},rank="{rank}"', rank, state)
        self._run_level()
        return {family: "".join(lines) for family, lines in self.out.items()}

    def _rank(self, labels: str, rank: int, state: RankState) -> None:
        rec = state.last
        if rec is not None:
            for metric, getter in STEP_GAUGES:
                self.add(metric.name, labels, getter(rec))
            if rec.gpu:  # a closed set of label values: no cardinality from the record
                for metric, extra, key in GPU_LABELLED:
                    self.add(metric.name, f"{labels},{extra}", rec.gpu.get(key))
        self.add(n.LOSS_EMA.name, labels, state.loss_ema)
        self.add(n.EFFECTIVE_LR.name, labels, state.last_effective_lr)
        self.add(n.LAST_STEP.name, labels, state.last_step if state.last_step >= 0 else None)
        for metric, attr in RANK_COUNTERS:
            self.add(metric.name + "_total", labels, getattr(state, attr))
        for reason, count in sorted(state.skipped_by_reason.items()):  # schema-bounded
            self.add(n.SKIPPED_STEPS_BY_REASON.name + "_total", f'{labels},reason="{reason}"',
                     count)
        self._eval(labels, state)
        self._histogram(labels, state)
        self._progress(labels, state)
        self._layers(labels, state)
        self._activations(labels, state)
        self._quantiles(n.LAYER_GRAD_QUANTILE.name, labels, state.last_grad_quantiles)
        self._quantiles(n.LAYER_PARAM_QUANTILE.name, labels, state.last_param_quantiles)

    def _eval(self, labels: str, state: RankState) -> None:
        ev = state.last_eval
        if ev is None:
            return
        self.add(n.VAL_LOSS.name, labels, ev.val_loss)
        self.add(n.EVAL_TRAIN_LOSS.name, labels, ev.train_loss)
        metrics = list(ev.metrics.items())
        categories = [(k, v) for k, v in metrics if k.startswith(CATEGORY_PREFIX)]
        others = [(k, v) for k, v in metrics if not k.startswith(CATEGORY_PREFIX)]
        cap = self.caps.max_eval_series  # the first ones, in the eval's order, are kept
        for name, value in categories[: self.caps.keep("max_categories", len(categories), cap)]:
            label = escape(name[len(CATEGORY_PREFIX):])
            self.add(n.CATEGORY_LOSS.name, f'{labels},category="{label}"', value)
        for name, value in others[: self.caps.keep("max_eval_metrics", len(others), cap)]:
            self.add(n.EVAL_METRIC.name, f'{labels},name="{escape(name)}"', value)

    def _histogram(self, labels: str, state: RankState) -> None:
        if not state.step_time_counts:
            return
        fam = n.STEP_DURATION.name
        lines = self.out.setdefault(fam, [])
        cumulative = 0
        for le, count in zip(n.STEP_DURATION_BUCKETS, state.step_time_counts, strict=False):
            cumulative += count
            lines.append(f'{fam}_bucket{{{labels},le="{le}"}} {cumulative}\n')
        total = sum(state.step_time_counts)
        lines.append(f'{fam}_bucket{{{labels},le="+Inf"}} {total}\n')
        lines.append(f"{fam}_sum{{{labels}}} {fmt(state.step_time_sum)}\n")
        lines.append(f"{fam}_count{{{labels}}} {total}\n")

    def _progress(self, labels: str, state: RankState) -> None:
        found = run_progress(self.run, state)
        if found is not None:
            self.add(n.PROGRESS.name, labels, found.ratio)
            self.add(n.ETA.name, labels, found.eta_seconds)

    def _layers(self, labels: str, state: RankState) -> None:
        table = state.last_layers
        if table is None:
            return
        limit = self.caps.keep("max_layers", len(table.names), self.caps.max_layers)
        names = self.names.of(table.names[:limit])
        with np.errstate(all="ignore"):  # inf / inf is a NaN sample, as it always was
            self._layer_lines(labels, names, table, state.last_layers_clip, limit)

    def _layer_lines(self, labels: str, names: list[str], table: Any, clip: float,
                     limit: int) -> None:
        stats, measured = table.stats, table.measured
        grad, zero = stats["grad_norm"][:limit], stats["grad_zero_frac"][:limit]
        upd, par = stats["update_norm"][:limit], stats["param_norm"][:limit]
        with_ratio = measured["update_norm"][:limit] & measured["param_norm"][:limit] \
            & (par != 0)
        fam_g, fam_u, fam_z = (m.name for m, _ in LAYER_GAUGES)
        for fam, where, values in (
                (fam_g, measured["grad_norm"][:limit], grad),
                (fam_u, with_ratio, None),
                (fam_z, measured["grad_zero_frac"][:limit], zero)):
            at = np.flatnonzero(where)
            picked = upd[at] / par[at] if values is None else values[at]
            self._per_layer(fam, labels, names, at, picked)
        # ||update|| / ||clipped grad|| per parameter, where both were measured.
        ok = (measured["update_norm"][:limit] & measured["grad_norm"][:limit]
              & np.isfinite(grad) & (grad > 0))
        at = np.flatnonzero(ok)
        self._per_layer(n.LAYER_EFFECTIVE_LR.name, labels, names, at,
                        upd[at] / (grad[at] * clip))

    def _per_layer(self, fam: str, labels: str, names: list[str], at: np.ndarray,
                   values: np.ndarray) -> None:
        """One line of family ``fam`` per index in ``at``: its layer label, its value."""
        head = f'{fam}{{{labels},layer="'
        self.out.setdefault(fam, []).extend(
            [f'{head}{names[i]}"}} {v}\n' for i, v in zip(at.tolist(), fmts(values), strict=True)])

    def _quantiles(self, fam: str, labels: str, table: QuantileTable | None) -> None:
        # One series per (layer, quantile); capped by max_layers like the other layer gauges.
        if table is None:
            return
        limit = self.caps.keep("max_layers", len(table), self.caps.max_layers)
        names = self.names.of(table.names[:limit])
        spelled = iter(fmts(table.values[:limit].ravel()))  # row by row: a layer's levels
        self.out.setdefault(fam, []).extend(
            [f'{fam}{{{labels},layer="{name}",q="{q}"}} {next(spelled)}\n'
             for name in names for q in _QUANTILE_LABELS])

    def _activations(self, labels: str, state: RankState) -> None:
        # Capped by max_layers like the per-parameter gauges; a null (dead_frac of a
        # non-ReLU module) is no sample at all, not NaN.
        table = state.last_activations
        if table is None:
            return
        limit = self.caps.keep("max_layers", len(table), self.caps.max_layers)
        labs = [f'{labels},module="{name}"' for name in self.names.of(table.names[:limit])]
        for metric, stat in ACTIVATION_GAUGES:
            out = self.out.setdefault(metric.name, [])
            for lab, v in zip(labs, table.stats[stat][:limit].tolist(), strict=True):
                if v == v or stat in ("mean", "std", "max_abs"):  # NaN stats are data
                    out.append(f"{metric.name}{{{lab}}} {fmt(v)}\n")

    def _goodput(self) -> None:
        """The run's goodput ledger as the engine thread last reported it (an immutable
        ``GoodputReport``); a node sidecar following a leader leaves it to the leader, so a
        fleet sum counts each run once."""
        report = self.run.goodput_view
        if report is None or self.run.leader is not None or report.wall <= 0:
            return
        labels = self.run_labels
        self.add(n.GOODPUT_RATIO.name, labels, report.ratio)
        self.add(n.PRODUCTIVE_SECONDS.name, labels, report.productive)
        self.add(n.RUN_WALL_SECONDS.name, labels, report.wall)
        self.add(n.RUN_GPUS.name, labels, report.gpus)
        for cause, seconds in report.badput.items():
            self.add(n.BADPUT_SECONDS.name + "_total", f'{labels},cause="{cause}"',
                     max(seconds, 0.0))
        tax = report.straggler
        if tax is not None:  # who the straggler is: one rank and node, at most, per run
            who = f'rank="{tax.rank}",node="{escape(tax.node or "")}"'
            for part, seconds in tax.parts.items():
                self.add(n.STRAGGLER_SECONDS.name, f'{labels},cause="straggler_{part}",{who}',
                         seconds)
        self._ettr(labels, report)

    def _ettr(self, labels: str, report: GoodputReport) -> None:
        """Time to start, failures and each recovery's time (runs/ettr.py)."""
        figures = ettr_of({"attempts": report.attempts, "incidents": report.incidents},
                          report.ratio)
        if figures.time_to_start is not None:
            self.add(n.TIME_TO_START.name, labels, figures.time_to_start)
        self.add(n.FAILURES.name + "_total", labels, figures.failures)
        done = [r.seconds for r in figures.recoveries if not r.open]
        fam = n.TIME_TO_RECOVER.name
        lines = self.out.setdefault(fam, [])
        for le in RECOVERY_BUCKETS:
            lines.append(f'{fam}_bucket{{{labels},le="{le}"}} {sum(s <= le for s in done)}\n')
        lines.append(f'{fam}_bucket{{{labels},le="+Inf"}} {len(done)}\n')
        lines.append(f"{fam}_sum{{{labels}}} {fmt(sum(done))}\n")
        lines.append(f"{fam}_count{{{labels}}} {len(done)}\n")

    def _run_level(self) -> None:
        run = self.run
        for (ftype, severity), count in sorted(run.findings.items()):
            self.add(
                n.FINDINGS.name + "_total",
                f'{self.run_labels},type="{escape(ftype)}",severity="{severity}"',
                count,
            )
        extra = "".join(
            f',{k}="{escape(v)}"'
            for k, v in sorted(run.labels.items())
            if k not in ("project", "run_id", "rank", "status", "verdict")
        )
        # A plain int the engine thread keeps up; the ledger itself is not read from here.
        self.add(n.LAST_CLEAN_CHECKPOINT.name, self.run_labels, run.ledger.last_clean_step)
        self.add(n.HUNG_RANKS.name, self.run_labels, len(run.hung_ranks))
        # Nodes not healthy only, sick first, capped: a 1,000-node fleet is not 1,000 series.
        for v in run.node_view[:MAX_NODES_EXPOSED]:
            self.add(n.NODE_VERDICT.name, f'{self.run_labels},node="{escape(v.node)}",'
                     f'cause="{v.cause}"', 2 if v.state == "sick" else 1)
        self._goodput()
        # A closed set of values (verdict.LABELS): the cause's step stays out of the label.
        self.add(n.RUN_INFO.name, f'{self.run_labels}{extra},status="{run.status}",'
                 f'verdict="{run.verdict_label}"', 1)
