"""Per-module activation gauges on /metrics: values, nulls, latest monitored step, cap."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.names import STEP_DURATION_BUCKETS
from monitor_agent.reads.exposition import Exposition
from monitor_agent.records.types import ActivationTable, RunRecord, StepRecord
from monitor_agent.runs.run_state import RunState

LAB = 'project="p",run_id="r",rank="0"'


def _acts(n: int, max_abs: float = 3.0) -> ActivationTable:
    return ActivationTable.from_mapping({
        f"m{i}": {"mean": 0.25, "std": 0.5, "max_abs": max_abs, "zero_frac": 0.5,
                  "dead_frac": 0.125 if i == 0 else None, "nonfinite": 0.0}
        for i in range(n)})


def _run(*steps: ActivationTable | None) -> RunState:
    run = RunState.new("r", now=0.0)
    run.apply_run(RunRecord(run_id="r", labels={"project": "p"}))
    for i, acts in enumerate(steps, 1):
        run.apply_step(StepRecord(run_id="r", step=i, time=float(i), loss=1.0, activations=acts),
                       arrival=float(i), buckets=STEP_DURATION_BUCKETS)
    return run


def _render(run: RunState, **kw) -> tuple[str, list]:
    drops: list = []
    exp = Exposition(lambda: [run], CollectorRegistry(), on_drop=lambda r, c: drops.append((r, c)),
                     **kw)
    return exp.render().decode(), drops


def test_gauges_per_module_and_null_dead_ratio_is_no_sample():
    text, _ = _render(_run(_acts(2)))
    assert f'training_activation_mean{{{LAB},module="m0"}} 0.25' in text
    assert f'training_activation_std{{{LAB},module="m1"}} 0.5' in text
    assert f'training_activation_max_abs{{{LAB},module="m0"}} 3.0' in text
    assert f'training_activation_zero_ratio{{{LAB},module="m0"}} 0.5' in text
    assert f'training_activation_dead_ratio{{{LAB},module="m0"}} 0.125' in text
    assert f'training_activation_dead_ratio{{{LAB},module="m1"}}' not in text
    assert f'training_activation_nonfinite{{{LAB},module="m1"}} 0.0' in text
    assert text.count("# TYPE training_activation_dead_ratio gauge") == 1


def test_latest_monitored_step_stays_and_non_finite_shows():
    text, _ = _render(_run(_acts(1, max_abs=math.inf), None))
    assert f'training_activation_max_abs{{{LAB},module="m0"}} +Inf' in text


def test_modules_are_capped_by_max_layers():
    text, drops = _render(_run(_acts(5)), max_layers=3)
    assert text.count("training_activation_mean{") == 3 and ("max_layers", 2) in drops
