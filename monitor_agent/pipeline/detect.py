"""The detect stage: a record through its run's detector suite (and the detectors' time
spent, their failures counted: a detector bug never costs a stored record), or through the
suite of a replaced attempt still sending, a second job (``rival``)."""

from __future__ import annotations

import dataclasses
import logging
import time

from monitor_agent.detectors import DetectorSuite, two_jobs
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.registry import LiveRun
from monitor_agent.records.types import EndRecord, Finding, Record, StepRecord
from monitor_agent.settings import Settings

log = logging.getLogger(__name__)

MAX_RIVALS = 64  # replaced attempts still sending, judged at once (``Detection.rival``)


class Detection:
    """Runs records through detectors; owns the suites of rival jobs (memory only)."""

    def __init__(self, settings: Settings, metrics: SelfMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        # (run id, attempt) -> the detectors of a replaced attempt still sending (``rival``)
        self._rivals: dict[tuple[str, int], DetectorSuite] = {}

    def detect(self, live: LiveRun, record: Record, remote: bool = False) -> list[Finding]:
        """What the run's detectors find in ``record`` (``remote``: a digest a node
        sidecar forwarded, judged by the cross-rank detectors only)."""
        t0 = time.perf_counter()
        findings = self._update(live.suite, record, remote)
        self.metrics.detector_duration.observe(time.perf_counter() - t0)
        if isinstance(record, StepRecord):
            live.state.rank(record.rank).loss_ema = live.suite.ema_loss(record.rank)
        return findings

    def rival(self, live: LiveRun, record: Record, attempt: int,
              remote: bool) -> list[Finding] | None:
        """Judge a record of a replaced attempt that comes from a job still running, and
        return what that found (None: not such a record; detectors/two_jobs.py states the
        rule): its ``time`` is after the attempt that replaced it began (a spool delivered
        late holds records from before its process ended). The first finds ``two_jobs``;
        each is judged by a suite of the attempt's own and its findings are a partial view
        (no rule acts on another job's history). The suites live in memory only,
        ``MAX_RIVALS`` at most."""
        later = live.attempts.superseded_by(attempt, record.kind, record.step)
        if later is None or record.time is None:
            return None
        began = live.attempts.get(later)
        if record.time <= began.started_at:
            return None
        key, found = (record.run_id, attempt), []
        suite = self._rivals.pop(key, None)
        if suite is None:
            if len(self._rivals) >= MAX_RIVALS:
                self._rivals.pop(next(iter(self._rivals)))
            suite = DetectorSuite(self.settings.detectors)
            if two_jobs.TwoJobsDetector.type not in self.settings.detectors.disabled:
                found.append(two_jobs.finding(record, attempt, later, began.start_step,
                                              began.started_at))
        if not isinstance(record, EndRecord):
            self._rivals[key] = suite  # an ended job's suite goes
        why = (f"attempt {attempt}, a job still running that attempt {later} replaced: "
               "not the run's history")
        judged = self._update(suite, record, remote)
        return found + [dataclasses.replace(f, attempt=attempt).seen_partially(why)
                        for f in judged]

    def _update(self, suite: DetectorSuite, record: Record, remote: bool) -> list[Finding]:
        try:
            return suite.update(record, remote)
        except Exception:  # a detector bug must never cost a stored record
            self.metrics.detector_errors.inc()
            log.exception("detector failed on %s step %s", record.run_id, record.step)
            return []
