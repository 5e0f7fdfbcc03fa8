"""The console channel: alerts written to the log, as plain text (the demo's channel).

Example::

    console = ConsoleNotifier()
    console.send(note, client)   # logs "[FIRING:1] run r1: TrainingNanInf ..." at WARNING
"""

from __future__ import annotations

import logging

import httpx

from monitor_agent.notify import format as fmt
from monitor_agent.notify.base import Notification, Outcome

LOGGER = "monitor_agent.alerts"


class ConsoleNotifier:
    """Logs each notification to the ``monitor_agent.alerts`` logger (and so to stderr)."""

    name = "console"
    grouped = True
    min_interval = 0.0
    statuses = frozenset({"firing", "resolved", "acknowledged"})
    refresh_interval = None

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger(LOGGER)

    def send(self, note: Notification, client: httpx.Client) -> Outcome:
        level = logging.WARNING if note.status == "firing" else logging.INFO
        self._log.log(level, "%s", fmt.plain(note))
        return Outcome.ok()
