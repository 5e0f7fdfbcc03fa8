"""Named commit boundaries where a crash test may kill the sidecar.

The record store (``monitor.sqlite``) and the alert database (``alerts.sqlite``) commit
apart, so a kill -9 can fall between them. Recovery must make them agree again, whichever
boundary the crash hit (``Consequences.reconcile``). To prove it, a test starts a real sidecar
with ``failpoint: <name>`` (``MONITOR_AGENT_FAILPOINT``) and drives it past that point: the
process SIGKILLs itself exactly there, and the test restarts it without the setting.

``BOUNDARIES`` lists every such point of a resume (tests/e2e/test_crash_boundaries.py kills
at each one):

- ``attempt_settled``: the new attempt is settled in the record store; alerting has not
  heard of it (a pending rollback it applies is still pending there).
- ``rollback_applied``: alerting applied the rollback; the batch that settled the attempt
  is not stored yet (the client retries it).
- ``records_stored``: the batch is stored; its findings and their alerts are not.

    >>> Failpoints(None).reached("attempt_settled")   # unset: nothing happens
    >>> Failpoints("nowhere")
    Traceback (most recent call last):
    ...
    ValueError: unknown failpoint 'nowhere'; the boundaries are attempt_settled, rollback_applied, records_stored
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

BOUNDARIES: tuple[str, ...] = ("attempt_settled", "rollback_applied", "records_stored")


class Failpoints:
    """``reached(name)`` kills this process when ``name`` is the configured failpoint."""

    def __init__(self, name: str | None) -> None:
        if name is not None and name not in BOUNDARIES:
            raise ValueError(f"unknown failpoint {name!r}; the boundaries are "
                             f"{', '.join(BOUNDARIES)}")
        self.name = name

    def reached(self, name: str) -> None:
        if self.name == name:
            log.warning("failpoint %s reached: SIGKILL", name)
            os.kill(os.getpid(), signal.SIGKILL)
