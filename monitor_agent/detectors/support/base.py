"""The one protocol every detector follows.

A detector is a small stateful object with no I/O, no clock and no logging: feed it records
in order, it returns findings. ``tick(now)`` lets clock-driven detectors (``stalled``) judge
silence with a clock the caller injects (wall time live, record time offline).
``snapshot()`` returns JSON-serialisable state and ``restore()`` takes it back, so a sidecar
restart changes nothing. ``DetectorSuite`` holds its detectors as ``Detector``s;
``DetectorBase`` (common.py) is the usual way to write one.

One detector on its own, fed a NaN step, and a fresh one given its snapshot, which knows
the NaN was just reported (repeats come at most every ``repeat_every_steps``)::

    >>> from monitor_agent.detectors import DetectorSettings
    >>> from monitor_agent.detectors.nan_inf import NanInfDetector
    >>> from monitor_agent.detectors.support.context import DetectorContext
    >>> from monitor_agent.records.schemas import parse_record
    >>> settings = DetectorSettings()
    >>> det: Detector = NanInfDetector(settings, DetectorContext(settings))
    >>> rec = parse_record({"kind": "step", "run_id": "r", "step": 5, "time": 5, "loss": "NaN"})
    >>> [(f.type, f.step, f.severity.label) for f in det.update(rec)], det.tick(now=1e9)
    ([('nan_inf', 5, 'critical')], [])
    >>> again = NanInfDetector(settings, DetectorContext(settings))
    >>> again.restore(det.snapshot())
    >>> again.update(rec)
    []
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

from monitor_agent.records.types import Finding, Record


@runtime_checkable
class Detector(Protocol):
    #: The finding type it raises (docs/format.md's catalogue).
    type: ClassVar[str]

    def update(self, record: Record) -> list[Finding]: ...

    def tick(self, now: float) -> list[Finding]: ...

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Explainer(Protocol):
    """A detector whose finding may be the cause of others (``lr_jump``): asked of each
    finding of the same run, it answers the cause in force at its step, or None."""

    def explain(self, finding: Finding) -> str | None: ...
