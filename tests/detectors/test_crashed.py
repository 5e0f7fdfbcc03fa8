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


def test_a_peer_lost_rank_is_paged_as_a_victim_not_the_cause():
    """gloo's and NCCL's words for a peer that went away, in any case: the rank that raised
    is named as the victim, and its evidence says so."""
    for error in ("RuntimeError: [../pair.cc:537] Read error: Connection reset by peer",
                  "RuntimeError: connection closed BY PEER",
                  "torch.distributed.DistBackendError: NCCL error in: remote process exited",
                  "RuntimeError: Timed out waiting 1800000ms for recv operation"):
        (f,) = feed(only("crashed"), [step(1, rank=2), _end("failed", error, 1, rank=2)])
        assert f.evidence["peer_lost"] is True, error
        assert f.message == (
            "the run crashed after step 1: rank 2 lost a peer in a collective (a victim, not "
            "the cause: the process at the other end went away; the relaunch names the rank "
            f"that died without a word): {error}; no finding before it"), f.message
    (f,) = feed(only("crashed"), [step(1), _end("failed", BCE, 1)])
    assert f.evidence["peer_lost"] is False


def test_the_page_carries_the_run_the_end_time_the_last_step_and_what_to_do():
    (f,) = feed(only("crashed"), [step(1), _end("failed", BCE, 1)])
    assert (f.run_id, f.time, f.evidence["last_step"]) == ("r", T0 + 100.0, 1)
    assert f.suggestions and f.suggestions[0].startswith("Read the exception and the step")


def test_a_crash_before_the_first_step_is_paged_at_step_0():
    (f,) = feed(only("crashed"), [_end("failed", BCE, 0)])
    assert (f.step, f.evidence["last_step"]) == (0, 0)
    assert f.message.startswith("the run crashed after step 0 (rank 0): ")


def test_a_failed_end_without_an_exception_says_none_was_reported():
    for error in (None, "", "  \n"):
        (f,) = feed(only("crashed"), [step(1), _end("failed", error, 1)])
        assert f.evidence["exception"] == f.evidence["error"] == "no exception reported"
        assert f.message == ("the run crashed after step 1 (rank 0): no exception reported; "
                             "no finding before it")


def test_the_exception_is_the_words_before_the_first_colon_or_the_whole_error():
    (f,) = feed(only("crashed"), [step(1), _end("failed", "ValueError: bad: key: x", 1)])
    assert f.evidence["exception"] == "ValueError"
    (f,) = feed(only("crashed"), [step(1), _end("failed", "Killed", 1)])
    assert f.evidence["exception"] == "Killed"


def test_the_evidence_keeps_100_characters_of_the_exception_and_1000_of_the_error():
    error = "E" * 150 + ": " + "x" * 2000
    (f,) = feed(only("crashed"), [step(1), _end("failed", error, 1)])
    assert f.evidence["exception"] == "E" * 100
    assert f.evidence["error"] == error[:1000]


def test_a_finding_at_the_crash_step_is_before_it_and_the_latest_comes_first():
    suite = DetectorSuite(DetectorSettings())
    losses = {40: 40.0, 59: float("nan")}
    recs = [step(i, loss=losses.get(i, 2.0 + 0.01 * (i % 5))) for i in range(1, 60)]
    (crash,) = [f for f in feed(suite, [*recs, _end("failed", BCE, 59)]) if f.type == "crashed"]
    assert crash.message.endswith(
        f"{BCE}; before it: nan_inf at step 59 (critical); loss_spike at step 40 (warning)"), \
        crash.message


def test_an_error_of_300_characters_is_paged_whole():
    error = "RuntimeError: first line\n" + "y" * (300 - 25)
    assert len(error) == 300
    (f,) = feed(only("crashed"), [step(1), _end("failed", error, 1)])
    assert f.message == f"the run crashed after step 1 (rank 0): {error}; no finding before it"


def test_a_long_two_line_error_is_paged_as_its_first_and_last_lines_cut_to_fit():
    first, last = "RuntimeError: " + "a" * 200, "b" * 199 + "Z"
    (f,) = feed(only("crashed"), [step(1), _end("failed", f"{first}\n{last}", 1)])
    said = f"{first[:147]} ... {last[-147:]}"
    assert len(said) == 299
    assert f.message == f"the run crashed after step 1 (rank 0): {said}; no finding before it"


def test_a_long_error_whose_first_and_last_lines_are_alike_is_cut_to_300_characters():
    line = "RuntimeError: CUDA error: an illegal memory access " + "c" * 100
    error = "\n".join([line] * 3)
    (f,) = feed(only("crashed"), [step(1), _end("failed", error, 1)])
    assert f.message == (f"the run crashed after step 1 (rank 0): {error[:300]}; "
                         "no finding before it")
