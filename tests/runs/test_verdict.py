"""A run's verdict (runs/verdict.py) from its own findings: what counts, how a NaN is
said, and that it is stored so a run out of memory shows the same verdict."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.reads.queries import RunQueries
from monitor_agent.records import schemas
from monitor_agent.records.types import Finding, Severity, StepRecord
from monitor_agent.runs.verdict import LABELS, VerdictTracker
from monitor_agent.settings import load_settings
from monitor_agent.storage.store import Store


def _step(step: int, loss: float, rank: int = 0) -> StepRecord:
    return StepRecord(run_id="r", step=step, time=float(step), loss=loss, rank=rank)


def _finding(ftype: str, step: int, severity: Severity = Severity.ERROR, **evidence) -> Finding:
    return Finding(ftype, severity, "r", step, "m", evidence=evidence)


def test_warnings_and_job_problems_leave_a_run_healthy():
    tracker = VerdictTracker()
    tracker.observe(_step(10, 2.0), [_finding("loss_spike", 10, Severity.WARNING),
                                     _finding("stalled", 10), _finding("memory_pressure", 10)])
    assert tracker.verdict("completed").text == "completed, healthy"
    assert tracker.verdict("completed").label == "healthy"


def test_a_nan_the_run_recovered_from_is_said_so():
    tracker = VerdictTracker()
    tracker.observe(_step(300, float("nan")), [_finding("nan_inf", 300, Severity.CRITICAL)])
    tracker.observe(_step(301, 2.0), [])
    assert tracker.verdict("completed").words == "unhealthy: NaN at step 300"


def test_a_nan_stretch_is_dated_from_where_it_began_and_ranks_count_together():
    tracker = VerdictTracker()
    tracker.observe(_step(300, float("nan")), [_finding("nan_inf", 300, Severity.CRITICAL)])
    tracker.observe(_step(350, 2.0), [])
    tracker.observe(_step(400, float("nan"), rank=1), [])
    tracker.observe(_step(401, 2.0, rank=0), [])   # rank 1 is still NaN
    assert tracker.verdict("running").words == "unhealthy: NaN since step 400"


def test_the_first_cause_leads_and_a_nan_the_run_is_still_in_follows():
    tracker = VerdictTracker()
    cause = "LR x100 at step 200: 0.02 -> 2, outside the run's schedule"
    tracker.observe(_step(203, 5.0), [_finding("grad_explosion", 203, likely_cause=cause)])
    tracker.observe(_step(204, 9.0), [_finding("divergence", 204, likely_cause=cause)])
    tracker.observe(_step(219, float("nan")), [_finding("nan_inf", 219, Severity.CRITICAL)])
    v = tracker.verdict("completed")
    assert v.text == ("completed, unhealthy: gradient explosion at step 203 after LR x100 at "
                      "step 200; NaN since step 219")
    assert (v.cause, v.step, v.label) == ("grad_explosion", 203, "unhealthy_grad_explosion")
    assert v.label in LABELS


def test_the_verdict_is_stored_and_shown_once_the_run_left_memory(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path)
    engine = Engine(settings, Store(":memory:"), SelfMetrics(CollectorRegistry()))
    lines = [{"kind": "step", "run_id": "r", "step": s, "time": float(s),
              "loss": 2.0 if s < 30 else "NaN"} for s in range(1, 41)]
    lines.append({"kind": "end", "run_id": "r", "step": 40, "time": 41.0, "status": "completed"})
    engine.ingest([Incoming(i, *schemas.parse_for_store(o)) for i, o in enumerate(lines)],
                  now=50.0)
    queries = RunQueries(engine.store, engine.registry)
    (live,) = queries.run_listings()
    engine.registry.expire(now=50.0 + settings.ended_run_ttl_seconds + 1)
    (stored,) = queries.run_listings()
    assert (live.active, stored.active) == (True, False)
    assert stored.verdict == live.verdict
    assert stored.verdict is not None
    # Ended, it says what the run cost (runs/goodput.py): its last second, from step 40
    # to the end record, is time no step explains.
    assert stored.verdict.text == ("completed, unhealthy: NaN since step 30; goodput 97.5%: "
                                   "2.5% unaccounted")
    assert queries.run_detail("r").verdict == live.verdict


def test_rollbacks_count_the_resumes_since_the_last_restart_and_name_what_each_abandoned():
    from monitor_agent.runs.verdict import Rollback, rollbacks_of
    from monitor_agent.storage.store import StoredAttempt

    attempts = [StoredAttempt(1, "first", 1, 0.0, None, None),
                StoredAttempt(2, "restarted", 1, 1.0, 1, 900),   # a new run reusing the id
                StoredAttempt(3, "resumed", 1201, 2.0, 1201, 1500),
                StoredAttempt(4, "resumed", 1801, 3.0, None, None),  # a relaunch past the end
                StoredAttempt(5, "resumed", 1001, 4.0, 1001, 1900)]
    abandoned = [
        {"type": "divergence", "step": 800, "attempt": 1},        # the other run's
        {"type": "grad_explosion", "step": 1310, "attempt": 2},
        {"type": "divergence", "step": 1305, "attempt": 2},
        {"type": "nan_inf", "step": 1350, "attempt": 2, "log_only": True},
        {"type": "stalled", "step": 1400, "attempt": 2},          # not a cause
        {"type": "nan_inf", "step": 1850, "attempt": 4},          # replaced by attempt 5
        {"type": "nan_inf", "step": 1100, "attempt": 3},
    ]
    found = rollbacks_of(attempts, abandoned)
    assert found == [Rollback(1200, (("divergence", 1305), ("grad_explosion", 1310))),
                     Rollback(1000, (("nan_inf", 1100),))]
    tracker = VerdictTracker(rollbacks=found)
    assert tracker.verdict("completed").text == (
        "completed, healthy (rolled back twice: divergence at step 1305; NaN at step 1100 "
        "abandoned)")


def _resumed_run(ended: str | None) -> str:
    """A run that trains steps 1-50, ends ``ended`` (None: the process was killed and sent
    no end record), and is relaunched from its checkpoint at step 30 by hand: no rollback
    plan. Its verdict's words."""
    engine = Engine(load_settings(), Store(":memory:"), SelfMetrics(CollectorRegistry()))
    lines = [{"kind": "step", "run_id": "r", "step": s, "time": float(s), "loss": 2.0,
              "attempt": "a"} for s in range(1, 51)]
    if ended is not None:
        lines.append({"kind": "end", "run_id": "r", "step": 50, "time": 51.0, "status": ended,
                      "attempt": "a"})
    resumed = [{"kind": "step", "run_id": "r", "step": s, "time": 60.0 + s, "loss": 2.0,
                "attempt": "b"} for s in range(31, 41)]
    for now, batch in ((100.0, lines), (160.0, resumed)):  # relaunched a minute later
        engine.ingest([Incoming(i, *schemas.parse_for_store(o)) for i, o in enumerate(batch)],
                      now=now)
    return RunQueries(engine.store, engine.registry).run_detail("r").verdict.words


def test_a_resume_that_applied_no_rollback_is_said_as_what_it_was():
    """Issue 31: a crash-resume is not "rolled back once"."""
    assert _resumed_run(None) == "healthy so far (resumed after a crash once)"
    assert _resumed_run("failed") == "healthy so far (resumed after a crash once)"
    assert _resumed_run("completed") == "healthy so far (resumed from a checkpoint once)"


def test_a_run_that_stopped_learning_is_unhealthy_from_where_it_stopped():
    """Issue 45: a dead GAN and a one-class cross-entropy ended "completed, healthy"."""
    tracker = VerdictTracker()
    tracker.observe(_step(209, 0.0), [_finding("not_learning", 209, since_step=190)])
    v = tracker.verdict("completed")
    assert (v.text, v.cause, v.step, v.label) == (
        "completed, unhealthy: stopped learning at step 190", "not_learning", 190,
        "unhealthy_not_learning")
    assert v.label in LABELS


def test_a_crash_is_unhealthy_until_a_resume_goes_past_it():
    from monitor_agent.runs.verdict import Rollback

    tracker = VerdictTracker()
    tracker.observe(None, [_finding("crashed", 59, exception="RuntimeError")])
    v = tracker.verdict("failed")
    assert (v.text, v.label) == ("failed, unhealthy: crashed after step 59 (RuntimeError)",
                                 "unhealthy_crashed")
    assert v.label in LABELS
    tracker.rollbacks = [Rollback(to_step=59, kind="crash")]  # resumed from its last save
    assert tracker.verdict("completed").text == "completed, healthy (resumed after a crash once)"
    # a weights cause is never overcome by a resume that kept it
    tracker.observe(None, [_finding("divergence", 40)])
    assert tracker.verdict("completed").words.startswith("unhealthy: divergence at step 40")
