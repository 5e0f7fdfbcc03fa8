"""A tiny offline harness: a trace through ``DetectorSuite`` exactly as replay drives it.

Before each record the suite ticks at that record's ``time``; a trace that stops without
an ``end`` record gets a last tick ``stall_horizon_seconds`` after its last record.

Example::

    findings = replay_trace(path)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from monitor_agent.detectors import DetectorSettings, DetectorSuite
from monitor_agent.records import schemas, wire
from monitor_agent.records.types import EndRecord, Finding, Record

TRACES = Path(__file__).resolve().parents[1] / "traces" / "public"


def load_records(path: Path) -> list[Record]:
    return [schemas.parse_record(obj) for obj in wire.iter_trace(path)]


def replay_records(
    records: Iterable[Record], settings: DetectorSettings | None = None
) -> list[Finding]:
    settings = settings or DetectorSettings()
    suites: dict[str, DetectorSuite] = {}
    findings: list[Finding] = []
    last_time: float | None = None
    ended: set[str] = set()
    for rec in records:
        suite = suites.setdefault(rec.run_id, DetectorSuite(settings))
        if rec.time is not None:
            last_time = rec.time
            for s in suites.values():
                findings.extend(s.tick(rec.time))
        findings.extend(suite.update(rec))
        if isinstance(rec, EndRecord):
            ended.add(rec.run_id)
    if last_time is not None:
        for run_id, suite in suites.items():
            if run_id not in ended:
                findings.extend(suite.tick(last_time + settings.stall_horizon_seconds))
    return findings


def replay_trace(path: Path, settings: DetectorSettings | None = None) -> list[Finding]:
    return replay_records(load_records(path), settings)
