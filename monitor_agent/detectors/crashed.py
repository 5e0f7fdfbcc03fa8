"""``crashed``: the training process died of an exception.

The client ends a run ``failed`` when an uncaught exception ends the script (its
``sys.excepthook``, or ``with Monitor(...)``) and sends the exception as the end record's
``error``, ``"RuntimeError: all elements of input should be between 0 and 1"``; the end
record's ``step`` is the last step it logged. That is the whole evidence, and it is certain:
a crash pages (error) with the exception, the step and the latest findings before it (a
NaN page before a loss's range check raised says why), and the run's verdict is unhealthy.

A stop is told apart. A run the user stopped ends ``stopped`` (Ctrl-C, or a trainer that
honoured the sidecar's stop request, by raising or not: the client says so), and a
``SystemExit`` with code 0 or none is the script leaving on its own, not a crash; an older
client (or framework callback) sent either as ``failed``, so a ``failed`` whose error is a
``KeyboardInterrupt`` or such a ``SystemExit`` is the user's stop here too.

A rank whose collective lost the process at its other end (gloo's "Connection closed by
peer", ``PEER_LOST``) crashed too, but as a victim: its page says so (``peer_lost`` in its
evidence) and names it not as the cause; the rank that died is the one that sent no end
record, which the launcher's relaunch names (runs/attempt_end.py). Every other
``failed`` end is a crash, a non-zero ``sys.exit`` included: the script itself said it
failed. A process killed without a word (SIGKILL, an OOM kill) sends
no end record at all: ``stalled`` and ``hang`` say that.

Each failed rank's end record is a finding of its own (rank scope); the shipped rule
(``TrainingCrashed``) makes one page of them per run.

A run that went NaN at step 57 and died of its loss's range check two steps later::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> for s in range(1, 60):
    ...     _ = suite.update(parse_record({"kind": "step", "run_id": "r", "step": s,
    ...                                    "time": s, "loss": "NaN" if s == 57 else 0.5 + s % 3 / 100}))
    >>> (f,) = suite.update(parse_record({"kind": "end", "run_id": "r", "step": 59,
    ...     "time": 60, "status": "failed",
    ...     "error": "RuntimeError: all elements of input should be between 0 and 1"}))
    >>> f.type, f.step, f.severity.label, f.evidence["exception"]
    ('crashed', 59, 'error', 'RuntimeError')
    >>> print(f.message)
    the run crashed after step 59 (rank 0): RuntimeError: all elements of input should be
    between 0 and 1; before it: nan_inf at step 57 (critical)
    >>> suite.update(parse_record({"kind": "end", "run_id": "r", "step": 59, "time": 60,
    ...                            "status": "stopped", "error": "KeyboardInterrupt: "}))
    []
"""

from __future__ import annotations

import re

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.records.types import EndRecord, Finding, Record, Severity

CRASHED = (
    "Read the exception and the step: the findings listed before it are the likely cause "
    "(a NaN makes a loss's range check raise; memory pressure ends in an out-of-memory).",
    "Resume from the last clean checkpoint once fixed (the page names it).",
)

# Ctrl-C, or ``SystemExit: 0`` / ``None`` / an empty code: the script left on its own
_USER_STOP = re.compile(r"KeyboardInterrupt\b|SystemExit:\s*(0|None)?\s*$")


PEER_LOST = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|ECONNRESET|remote process exited|"
    r"NCCL (error|Error).{0,80}remote|DistNetworkError|peer (disconnected|closed)|"
    r"Timed out waiting|timed out.{0,40}(collective|recv|send)|Watchdog caught collective",
    re.IGNORECASE)
"""A collective that lost the process at its other end, as gloo, NCCL and c10d word it: the
rank that raised it is a victim of that process, not the cause of the attempt's end."""


def peer_lost(error: str | None) -> bool:
    """Whether a failed end's exception is a collective that lost its peer.

        >>> peer_lost("RuntimeError: [../pair.cc:537] Read error [10.1.0.3]:20693: "
        ...           "Connection reset by peer")
        True
        >>> peer_lost("ValueError: loss is NaN")
        False
    """
    return error is not None and PEER_LOST.search(error) is not None


def user_stop(error: str | None) -> bool:
    """Whether a ``failed`` end's error is the user's own stop: Ctrl-C or a clean
    ``sys.exit`` (what an older client or a framework's callback sent as ``failed``)."""
    return error is not None and _USER_STOP.match(error) is not None


SAID_CHARS = 300


def said_short(error: str, limit: int = SAID_CHARS) -> str:
    r"""The exception as a page says it: whole when short; else its first line (the type
    and the wrapper's words) and its last (where a wrapped or chained exception, such as a
    DataLoader worker's re-raised error, states its cause), each cut to fit::

        >>> text = ("OSError: Caught OSError in DataLoader worker process 1.\n"
        ...         + "  a frame of the worker's traceback\n" * 20
        ...         + "OSError: corrupt sample 555: truncated file")
        >>> print(said_short(text))
        OSError: Caught OSError in DataLoader worker process 1. ... OSError: corrupt sample
        555: truncated file
    """
    if len(error) <= limit:
        return error
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    first, last = lines[0], lines[-1]
    if len(lines) < 2 or first == last:
        return error[:limit]
    half = (limit - 5) // 2
    return f"{first[:half]} ... {last[-half:] if len(last) > half else last}"


class CrashedDetector(DetectorBase[SharedSettings]):
    """Error when a rank's end record says its process died of an exception."""

    type = "crashed"
    severity = Severity.ERROR
    settings_model = SharedSettings

    def update(self, record: Record) -> list[Finding]:
        if not isinstance(record, EndRecord) or record.status != "failed" \
                or user_stop(record.error):
            return []
        error = (record.error or "").strip() or "no exception reported"
        exception = error.split(":", 1)[0].strip() if ":" in error else error
        before = [(t, r) for t, r in self.ctx.state.recent.items() if r["step"] <= record.step]
        said = "; ".join(f"{t} at step {r['step']} ({r['severity']})" for t, r in before[::-1])
        lost = peer_lost(error)
        told = said_short(error)
        head = (f"the run crashed after step {record.step}: rank {record.rank} lost a peer in "
                f"a collective (a victim, not the cause: the process at the other end went "
                f"away; the relaunch names the rank that died without a word): {told}"
                if lost else
                f"the run crashed after step {record.step} (rank {record.rank}): {told}")
        msg = head + (f"; before it: {said}" if said else "; no finding before it")
        return [Finding(
            type=self.type, severity=self.severity, run_id=record.run_id,
            step=max(record.step, 0), rank=record.rank, message=msg,
            evidence={"exception": exception[:100], "error": error[:1000], "peer_lost": lost,
                      "last_step": record.step,
                      "findings_before": [{"type": t, **r} for t, r in before]},
            suggestions=CRASHED, time=record.time,
        )]
