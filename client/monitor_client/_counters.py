"""What happened to the records handed to the client: ``mon.counters()``.

Every record submitted is, at any moment, sent, rejected, dropped or pending:
``submitted == sent + rejected + dropped + pending``; ``spooled`` counts those that went
through the disk spool on the way, whatever became of them. Records an earlier process left
in the spool count as submitted. The counters come from a running sender: the examples of
``_sender.py`` and ``_monitor.py`` read them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Counters:
    """What happened to the records handed to the client so far (a snapshot)."""

    submitted: int
    sent: int          # stored or already stored (duplicates) by the sidecar
    spooled: int       # written to the disk spool at least once
    pending: int       # in the queue or in the spool, not yet acknowledged
    rejected: int      # refused by the sidecar (bad record); reasons were logged
    dropped: int       # lost: spool bounds, encoding failure, a record too large to
                       # send, or anything after a misconfiguration (wrong URL or token)
