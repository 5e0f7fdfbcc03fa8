"""The one protocol every detector follows.

A detector is a small stateful object with no I/O, no clock and no logging: feed it records
in order, it returns findings. ``tick(now)`` lets clock-driven detectors (``stalled``) judge
silence with a clock the caller injects (wall time live, record time in replay).
``snapshot()`` returns JSON-serialisable state and ``restore()`` takes it back, so a sidecar
restart changes nothing. ``DetectorSuite`` holds its detectors as ``Detector``s;
``DetectorBase`` (common.py) is the usual way to write one.

Example::

    det: Detector = NanInfDetector(DetectorSettings(), DetectorContext(DetectorSettings()))
    for rec in records:
        for f in det.update(rec):
            print(f.type, f.step, f.message)
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
