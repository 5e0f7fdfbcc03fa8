"""What happened to the records handed to the client: ``mon.counters()``.

Example::

    c = mon.counters()
    print(f"{c.sent} sent, {c.pending} pending, {c.dropped} dropped")
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Counters:
    """What happened to the records handed to the client so far.

    Example::

        c = mon.counters(); assert c.dropped == 0
    """

    submitted: int
    sent: int          # stored or already stored (duplicates) by the sidecar
    spooled: int       # written to the disk spool at least once
    pending: int       # in the queue or in the spool, not yet acknowledged
    rejected: int      # refused by the sidecar (bad record); reasons were logged
    dropped: int       # lost: spool bounds, encoding failure, a record too large to
                       # send, or anything after a misconfiguration (wrong URL or token)
