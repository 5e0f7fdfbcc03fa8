"""Quantile gauges of grad_hist / param_hist on /metrics: labels, latest hist step, cap."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.names import RUN_METRICS, STEP_DURATION_BUCKETS
from monitor_agent.reads.exposition import Exposition
from monitor_agent.records import schemas
from monitor_agent.runs.run_state import RunState

Q = [-3.0, -2.0, -0.5, 0.125, 0.5, 1.5, 2.0, 3.0]


def _hists(n: int, scale: float = 1.0) -> dict:
    return {f"l{i}": {"edges": [-3, 0, 3], "counts": [4, 4],
                      "quantiles": [v * scale for v in Q]} for i in range(n)}


def _apply(run: RunState, step: int, **fields) -> None:
    rec = schemas.parse_record({"kind": "step", "run_id": run.run_id, "step": step,
                                "time": float(step), **fields})
    run.apply_step(rec, arrival=float(step), buckets=STEP_DURATION_BUCKETS)


def _render(run: RunState, **kw) -> tuple[str, list]:
    drops: list = []
    exp = Exposition(lambda: [run], CollectorRegistry(),
                     on_drop=lambda r, c: drops.append((r, c)), **kw)
    return exp.render().decode(), drops


def test_quantile_gauges_per_layer_and_quantile():
    run = RunState.new("r", now=0.0)
    _apply(run, 1, grad_hist=_hists(2), param_hist=_hists(2, scale=10.0))
    text, drops = _render(run)
    base = 'project="",run_id="r",rank="0",layer="l1"'
    assert f'training_layer_grad_quantile{{{base},q="0.5"}} 0.125' in text
    assert f'training_layer_grad_quantile{{{base},q="0"}} -3.0' in text
    assert f'training_layer_grad_quantile{{{base},q="0.99"}} 2.0' in text
    assert f'training_layer_param_quantile{{{base},q="1"}} 30.0' in text
    assert text.count("training_layer_grad_quantile{") == 2 * 8
    assert "# TYPE training_layer_param_quantile gauge" in text and drops == []


def test_latest_hist_step_stays_until_the_next_one():
    run = RunState.new("r", now=0.0)
    _apply(run, 1, grad_hist=_hists(1))
    _apply(run, 2, loss=1.0)  # no histograms on this step
    text, _ = _render(run)
    assert 'layer="l0",q="0.25"} -0.5' in text
    _apply(run, 3, grad_hist=_hists(1, scale=2.0))
    text, _ = _render(run)
    assert 'layer="l0",q="0.25"} -1.0' in text


def test_layer_cap_holds_and_counts_drops():
    run = RunState.new("r", now=0.0)
    _apply(run, 1, grad_hist=_hists(7), param_hist=_hists(7))
    text, drops = _render(run, max_layers=3)
    assert text.count("training_layer_grad_quantile{") == 3 * 8
    assert text.count("training_layer_param_quantile{") == 3 * 8
    assert drops.count(("max_layers", 4)) == 2


def test_histograms_without_quantiles_expose_nothing():
    run = RunState.new("r", now=0.0)
    _apply(run, 1, grad_hist={"w": {"edges": [0, 1], "counts": [2]}})
    text, _ = _render(run)
    assert "training_layer_grad_quantile{" not in text


def test_names_are_declared_in_metric_names():
    names = {m.name for m in RUN_METRICS}
    assert {"training_layer_grad_quantile", "training_layer_param_quantile"} <= names
