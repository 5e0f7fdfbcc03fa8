"""The trace judge: trace files judged offline by the very same engine, on the records' clock.

``monitor-agent replay`` is its command. (Elsewhere "replay" means other things: the
client sending its spool again, and the engine feeding a restored run its stored tail.)

Before each record the engine ticks at that record's ``time``; a trace that stops without
an ``end`` record gets one last tick ``detectors.stall_horizon_seconds`` past its last
record, so a hung run is caught offline exactly as it would be live.

A trace of eight steps ten seconds apart that stops without an ``end`` record: the last
tick finds the hang (``monitor-agent replay`` calls this and prints a summary per file)::

    >>> import json, tempfile
    >>> steps = [{"kind": "step", "run_id": "r1", "step": s, "time": 10.0 * s, "loss": 2.0}
    ...          for s in range(1, 9)]
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     trace = Path(tmp, "hung.jsonl")
    ...     _ = trace.write_text("".join(json.dumps(step) + "\\n" for step in steps))
    ...     [run] = judge_traces([trace], Settings())
    >>> run.records, run.ended, [(f.step, f.type) for f in run.findings]
    (8, False, [(8, 'stalled')])
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.records import schemas, wire
from monitor_agent.records.types import EndRecord, Finding
from monitor_agent.settings import Settings, load_settings
from monitor_agent.storage.store import Store

log = logging.getLogger(__name__)


@dataclass(slots=True)
class JudgedTrace:
    """What judging one trace file found."""

    path: Path
    run_ids: set[str] = field(default_factory=set)
    records: int = 0
    rejected: int = 0
    rejected_at: set[int] = field(default_factory=set)  # their positions in the trace
    last_step: int = -1
    ended: bool = False
    findings: list[Finding] = field(default_factory=list)


def judge_traces(
    paths: Iterable[str | Path],
    settings: Settings | None = None,
    on_record: Callable[[], None] | None = None,
) -> list[JudgedTrace]:
    """Judge each trace in its own in-memory engine; return what each file produced."""
    settings = settings or load_settings()
    return [judge_trace(Path(p), settings, on_record) for p in paths]


def judge_trace(
    path: Path, settings: Settings, on_record: Callable[[], None] | None = None
) -> JudgedTrace:
    store = Store(":memory:")
    engine = Engine(settings, store, SelfMetrics(CollectorRegistry()))
    out = JudgedTrace(path=path)
    last_time: float | None = None
    try:
        for index, obj in enumerate(wire.iter_trace(path)):
            try:
                record, body = schemas.parse_for_store(obj)
            except Exception as exc:  # RecordError, or a value validation missed: ours
                out.rejected += 1
                out.rejected_at.add(index)
                log.warning("%s: record %d rejected: %s", path, index, exc)
                continue
            now = record.time if record.time is not None else last_time or 0.0
            last_time = now
            out.findings.extend(engine.tick(now))
            result = engine.ingest([Incoming(index, record, body)], now)
            out.findings.extend(result.findings)
            out.records += 1
            out.run_ids.add(record.run_id)
            out.last_step = max(out.last_step, record.step)
            out.ended |= isinstance(record, EndRecord)
            if on_record is not None:
                on_record()
        if last_time is not None and not out.ended:
            horizon = settings.detectors.stall_horizon_seconds
            out.findings.extend(engine.tick(last_time + horizon))
    finally:
        store.close()
    return out
