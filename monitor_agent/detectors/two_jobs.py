"""``two_jobs``: two live jobs write to one run id.

A run id is reused all the time, and a new process's records begin a new attempt of the run
(pipeline/attempts.py): the newest attempt owns the run's current history, and what it
replaced is kept as history. That is right for a relaunch, whose earlier process is gone.
It is wrong when the earlier job is still running: a second job started with the same run
id (a copy-pasted launch command, a scheduler that retried a job it thought lost), or a
single record from anyone who holds the write token. The earlier job's records then land
in history, which nothing analyses, and its NaN would page nobody.

So the engine (pipeline/engine.py, ``Detection.rival``), which alone sees attempts, tells a
live replaced job from a late one: a record of a replaced attempt whose ``time`` is after
the replacing attempt began (the sidecar's clock: the same host's as the client's, or one
NTP keeps close) comes from a job that is still running; a spool delivered late holds
records from before its process ended, before the relaunch began. The first such record
pages this finding, once per replaced attempt; the job's records go on being judged by a
detector suite of their own and paged (as a partial view: no rule acts on them, the run's
current history is another job's).

This detector judges nothing itself (``update`` returns nothing): it is listed in the
catalogue so that its type, severity, settings and suggestions are known to the rules, the
settings and the format, and ``finding`` builds what the engine pages.

Attempt 1 of ``gpt-7`` sends step 240 after attempt 2 began::

    >>> from monitor_agent.records.types import StepRecord
    >>> f = finding(StepRecord(run_id="gpt-7", step=240, time=1010.0, rank=0),
    ...             earlier=1, later=2, later_start=1, later_began=1000.0)
    >>> print(f.message)
    two live jobs on run id gpt-7: attempt 1 (rank 0) sent step 240 10 s after attempt 2 began
    at step 1 and replaced it; attempt 1's records are judged on their own and paged, attempt
    2's are the run's history
"""

from __future__ import annotations

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.records.types import Finding, Record, Severity

TWO_JOBS = (
    "Find the two jobs: the run page lists the run's attempts, and each record names its "
    "attempt (GET /v1/runs/{id}/records?attempt=N).",
    "Give each job its own run id (Monitor(run_id=...)); stop the one that should not run.",
    "Nobody should hold the sidecar's write token who is not one of your jobs: rotate it if "
    "neither job is yours.",
)


class TwoJobsDetector(DetectorBase[SharedSettings]):
    """Error when a replaced attempt of a run id is still sending (module docstring)."""

    type = "two_jobs"
    severity = Severity.ERROR
    settings_model = SharedSettings

    def update(self, record: Record) -> list[Finding]:
        return []  # the engine makes this finding: it alone sees attempts


def finding(record: Record, earlier: int, later: int, later_start: int | None,
            later_began: float) -> Finding:
    """The page: ``record`` of attempt ``earlier`` arrived from a live job after attempt
    ``later`` (first step ``later_start``, begun at ``later_began``) replaced it."""
    after = max((record.time or later_began) - later_began, 0.0)
    at = f" at step {later_start}" if later_start is not None else ""
    what = f"step {record.step}" if record.kind == "step" else f"a {record.kind} record"
    message = (f"two live jobs on run id {record.run_id}: attempt {earlier} (rank "
               f"{record.rank}) sent {what} {after:.0f} s after attempt {later} began{at} "
               f"and replaced it; attempt {earlier}'s records are judged on their own and "
               f"paged, attempt {later}'s are the run's history")
    return Finding(type=TwoJobsDetector.type, severity=TwoJobsDetector.severity,
                   run_id=record.run_id, step=max(record.step, 0), rank=record.rank,
                   message=message, value=float(earlier), time=record.time,
                   evidence={"earlier_attempt": earlier, "later_attempt": later,
                             "later_start_step": later_start,
                             "seconds_after": round(after, 3)},
                   suggestions=TWO_JOBS, attempt=later)


def held(record: Record, holder: int, waiting: int, waited: float) -> Finding:
    """The page: attempt ``waiting`` (a new process, ``record`` its latest try) has been
    refused for ``waited`` seconds while attempt ``holder`` of the run keeps sending: it is
    a second live job, not a relaunch (pipeline/attempts.py ``holds_history``).

        >>> from monitor_agent.records.types import StepRecord
        >>> print(held(StepRecord(run_id="gpt-7", step=1, time=1010.0, rank=0), holder=1,
        ...            waiting=2, waited=12.0).message)
        two live jobs on run id gpt-7: attempt 2 (rank 0) has tried for 12 s to begin while
        attempt 1 keeps sending; attempt 1 keeps the run's history, attempt 2's records are
        refused (409) until attempt 1 ends or stops sending
    """
    what = f"{record.run_id}: attempt {waiting} (rank {record.rank})"
    message = (f"two live jobs on run id {what} has tried for {waited:.0f} s to begin while "
               f"attempt {holder} keeps sending; attempt {holder} keeps the run's history, "
               f"attempt {waiting}'s records are refused (409) until attempt {holder} ends "
               "or stops sending")
    return Finding(type=TwoJobsDetector.type, severity=TwoJobsDetector.severity,
                   run_id=record.run_id, step=max(record.step, 0), rank=record.rank,
                   message=message, value=float(waiting), time=record.time,
                   evidence={"earlier_attempt": holder, "later_attempt": waiting,
                             "waited_seconds": round(waited, 3), "held": True},
                   suggestions=TWO_JOBS, attempt=holder)
