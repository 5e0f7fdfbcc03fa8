"""Progress and ETA from total_steps or total_tokens, as /metrics and /v1/runs show them."""

from __future__ import annotations

import pytest

from monitor_agent.metrics.names import STEP_DURATION_BUCKETS
from monitor_agent.records.types import RunRecord, StepRecord
from monitor_agent.runs.progress import run_progress
from monitor_agent.runs.run_state import RunState


def _run(config: dict, steps: int, ranks: int = 1, step_time: float = 2.0) -> RunState:
    run = RunState.new("r", now=0.0)
    run.apply_run(RunRecord(run_id="r", config=config))
    for rank in range(ranks):
        for s in range(1, steps + 1):
            rec = StepRecord(run_id="r", step=s, time=float(s), rank=rank, tokens=100.0,
                             step_time=step_time)
            run.apply_step(rec, arrival=float(s), buckets=STEP_DURATION_BUCKETS)
    return run


def test_steps_plan_gives_ratio_and_eta_from_the_mean_step_time():
    run = _run({"total_steps": 100}, steps=25)
    p = run_progress(run, run.ranks[0])
    assert (p.basis, p.ratio, p.eta_seconds) == ("steps", 0.25, pytest.approx(75 * 2.0))


def test_tokens_plan_counts_every_rank_and_the_pace_of_the_slowest():
    run = _run({"total_tokens": 10_000}, steps=10, ranks=2)  # 2000 tokens in 20 s each
    p = run_progress(run, run.ranks[1])
    assert (p.basis, p.ratio) == ("tokens", 0.2)
    assert p.eta_seconds == pytest.approx(8000 / (2000 / 20.0))


def test_no_plan_no_progress_and_an_ended_run_has_no_eta():
    assert run_progress(_run({}, steps=5), RunState.new("x", 0.0).rank(0)) is None
    assert run_progress(_run({"total_steps": "lots"}, steps=5), RunState.new("x", 0.0).rank(0)) is None
    run = _run({"total_steps": 10}, steps=20)
    run.apply_end("completed", 30.0)
    p = run_progress(run, run.ranks[0])
    assert (p.ratio, p.eta_seconds) == (1.0, None)


def test_progress_reaches_metrics_and_the_run_api(sidecar):
    import httpx

    recs = [{"kind": "run", "run_id": "tok", "config": {"total_tokens": 4000}}]
    recs += [{"kind": "step", "run_id": "tok", "step": s, "time": float(s), "tokens": 100,
              "step_time": 0.5} for s in range(1, 11)]
    assert sidecar.post(recs).json()["accepted"] == 11
    metrics = httpx.get(sidecar.url + "/metrics").text
    assert 'training_progress_ratio{project="",run_id="tok",rank="0"} 0.25' in metrics
    assert 'training_eta_seconds{project="",run_id="tok",rank="0"} 15.0' in metrics
    rank = httpx.get(sidecar.url + "/v1/runs/tok").json()["ranks"]["0"]
    assert (rank["progress_ratio"], rank["progress_basis"], rank["eta_seconds"]) == (
        0.25, "tokens", 15.0)
