"""The console channel: alerts written to the log, as plain text (the demo's channel).

It logs to ``monitor_agent.alerts`` unless given a logger; here one that prints::

    >>> import sys
    >>> from monitor_agent.notify.base import AlertEvent
    >>> log = logging.Logger("alerts")
    >>> log.addHandler(logging.StreamHandler(sys.stdout))
    >>> event = AlertEvent("ab12", "gpt-7", "TrainingNanInf", "nan_inf", "critical", "firing",
    ...                    "loss is NaN", started_at=1000.0, step=300)
    >>> note = Notification("gpt-7", (event,), created_at=1001.0)
    >>> with httpx.Client() as client:   # unused: the console sends nothing over HTTP
    ...     ConsoleNotifier(log).send(note, client).kind
    [FIRING:1] run gpt-7: TrainingNanInf
    - CRITICAL TrainingNanInf (run gpt-7, step 300): loss is NaN
    <OutcomeKind.OK: 'ok'>
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
