"""crashed: a run whose process died of an exception pages with the exception, the step and
the findings before it; a stop is told apart (issue 45: a crashed run ended "failed,
healthy" with no alert)."""

from __future__ import annotations

from synth_records import T0, feed, only, step

from monitor_agent.detectors import DetectorSettings, DetectorSuite
from monitor_agent.detectors.crashed import user_stop
from monitor_agent.records import wire
from monitor_agent.records.types import EndRecord

BCE = "RuntimeError: all elements of input should be between 0 and 1"


def _end(status: str, error: str | None = None, step_: int = 59, rank: int = 0) -> EndRecord:
    return EndRecord(run_id="r", step=step_, time=T0 + 100.0, rank=rank, status=status,
                     error=error)


def test_a_failed_end_pages_with_its_exception_and_step():
    found = feed(only("crashed"), [*(step(i) for i in range(1, 60)), _end("failed", BCE)])
    (f,) = found
    assert (f.type, f.step, f.severity.label) == ("crashed", 59, "error")
    assert f.evidence["exception"] == "RuntimeError" and f.evidence["error"] == BCE
    assert f.message == (f"the run crashed after step 59 (rank 0): {BCE}; "
                         "no finding before it")


def test_a_wrapped_exception_is_paged_with_the_line_that_names_its_cause():
    """A DataLoader worker's exception, re-raised in the main process: the first line says
    which worker, the last what went wrong; a page cut to its first 300 characters ended
    mid-traceback and never said the cause."""
    error = ("OSError: Caught OSError in DataLoader worker process 1.\n"
             "Original Traceback (most recent call last):\n"
             + '  File "torch/utils/data/_utils/worker.py", line 349, in _worker_loop\n' * 6
             + "OSError: corrupt sample 555: truncated file")
    (f,) = feed(only("crashed"), [*(step(i) for i in range(1, 70)), _end("failed", error, 69)])
    assert f.message.startswith("the run crashed after step 69 (rank 0): OSError: Caught "
                                "OSError in DataLoader worker process 1. ... OSError: corrupt "
                                "sample 555: truncated file;"), f.message
    assert f.evidence["error"] == error  # whole in the evidence, as before


def test_stops_and_clean_exits_are_told_apart():
    for end in (_end("stopped", "KeyboardInterrupt: "), _end("completed"),
                _end("stopped", "stopped at step 59: stop requested by rule StopOnNaN; it "
                                "left by RuntimeError: stop"),
                _end("failed", "SystemExit: 0"), _end("failed", "SystemExit: None"),
                _end("failed", "SystemExit: "), _end("failed", "KeyboardInterrupt: ")):
        assert feed(only("crashed"), [step(1), end]) == [], end
    # a script that exits with an error code said it failed
    assert [f.evidence["exception"] for f in feed(only("crashed"), [
        step(1), _end("failed", "SystemExit: 2")])] == ["SystemExit"]
    assert user_stop("SystemExit: 0") and not user_stop("SystemExit: 1")
    assert not user_stop(None) and not user_stop("ValueError: SystemExit: 0")


def test_the_findings_before_it_are_listed_latest_first():
    """Every detector runs: the NaN at 57 and the spike at 40 are what came before."""
    suite = DetectorSuite(DetectorSettings())
    losses = {40: 40.0, 57: float("nan")}
    recs = [step(i, loss=losses.get(i, 2.0 + 0.01 * (i % 5))) for i in range(1, 60)]
    found = feed(suite, [*recs, _end("failed", BCE)])
    (crash,) = [f for f in found if f.type == "crashed"]
    before = [(b["type"], b["step"]) for b in crash.evidence["findings_before"]]
    assert ("nan_inf", 57) in before and ("loss_spike", 40) in before, before
    assert before == sorted(before, key=lambda b: b[1]), before  # kept oldest first
    assert "; before it: nan_inf at step 57 (critical)" in crash.message, crash.message


def test_each_failed_rank_is_its_own_finding():
    found = feed(only("crashed"), [step(5, rank=0), step(5, rank=1),
                                   _end("failed", BCE, 5, rank=1),
                                   _end("failed", "RuntimeError: Connection closed by peer",
                                        5, rank=0)])
    assert [(f.rank, f.evidence["exception"]) for f in found] == [(1, "RuntimeError"),
                                                                  (0, "RuntimeError")]


def test_what_came_before_survives_a_restart():
    suite = DetectorSuite(DetectorSettings())
    feed(suite, [step(i, loss=40.0 if i == 40 else 2.0 + 0.01 * (i % 5)) for i in range(1, 59)])
    restored = DetectorSuite(DetectorSettings())
    restored.restore(wire.loads(wire.dumps(suite.snapshot())))
    (crash,) = [f for f in restored.update(_end("failed", BCE)) if f.type == "crashed"]
    assert [b["type"] for b in crash.evidence["findings_before"]] == ["loss_spike"]
