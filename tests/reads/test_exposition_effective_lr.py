"""The effective learning rate (||update|| / ||clipped gradient||) as gauges: per run from
the latest step that had an update norm, per layer from the latest layer-statistics step."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.names import STEP_DURATION_BUCKETS
from monitor_agent.reads.exposition import Exposition
from monitor_agent.records.types import LayerTable, RunRecord, StepRecord
from monitor_agent.runs.run_state import RunState

LABELS = 'project="p",run_id="r",rank="0"'


def _state() -> RunState:
    run = RunState.new("r", now=0.0)
    run.apply_run(RunRecord(run_id="r", labels={"project": "p"}))
    table = LayerTable.from_mapping({
        "a": {"grad_norm": 4.0, "param_norm": 2.0, "update_norm": 0.002},
        "b": {"grad_norm": 3.0, "param_norm": 2.0},             # no update measured
        "c": {"grad_norm": 0.0, "param_norm": 2.0, "update_norm": 0.001}})  # no gradient
    # Monitored step: global grad norm 5 clipped to 1 -> coefficient ~0.2.
    run.apply_step(StepRecord(run_id="r", step=1, time=1.0, grad_norm=5.0, clip_threshold=1.0,
                              update_norm=0.01, lr=1e-3, layers=table),
                   arrival=1.0, buckets=STEP_DURATION_BUCKETS)
    # A later step without update norm must not erase the run-level value.
    run.apply_step(StepRecord(run_id="r", step=2, time=2.0, grad_norm=0.5, lr=1e-3),
                   arrival=2.0, buckets=STEP_DURATION_BUCKETS)
    return run


def _value(text: str, series: str) -> float:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(series + " ")]
    return float(line.split()[-1])


def test_run_and_layer_effective_lr_use_the_clipped_gradient():
    text = Exposition(lambda: [_state()], CollectorRegistry()).render().decode()
    clip = 1.0 / (5.0 + 1e-6)
    run = _value(text, f"training_effective_learning_rate{{{LABELS}}}")
    assert abs(run - 0.01 / (5.0 * clip)) < 1e-9  # = 0.01: the clipped gradient had norm 1
    layer = _value(text, f'training_layer_effective_learning_rate{{{LABELS},layer="a"}}')
    assert abs(layer - 0.002 / (4.0 * clip)) < 1e-9
    named = [ln for ln in text.splitlines()
             if ln.startswith("training_layer_effective_learning_rate{")]
    assert len(named) == 1  # b has no update norm, c no gradient: no sample, not NaN
    assert "# TYPE training_effective_learning_rate gauge" in text


def test_record_property_without_clipping():
    rec = StepRecord(run_id="r", step=1, time=0.0, grad_norm=2.0, update_norm=0.02)
    assert rec.effective_lr == 0.01 and rec.clip_coef == 1.0
    assert StepRecord(run_id="r", step=1, time=0.0, grad_norm=float("nan"),
                      update_norm=0.02).effective_lr is None
