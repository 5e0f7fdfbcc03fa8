"""``MonitorClientError``: the base of every error the client raises of its own, so a script
can catch the client's refusals in one clause.

Each keeps the builtin base a caller catches today (a nonsensical setting is still a
``ValueError``, a wrong type a ``TypeError``, an unsafe spool an ``OSError``)::

    >>> from monitor_client import MonitorClientError, WatchSettings
    >>> try:
    ...     WatchSettings(hist_every=-1)
    ... except MonitorClientError as exc:
    ...     isinstance(exc, ValueError), str(exc)
    (True, 'WatchSettings.hist_every must be a finite number >= 0, not -1')

``RollbackExit`` (``_resume.py``) is not one: it is the process exiting on purpose, a
``SystemExit``, and deriving it from an ``Exception`` would let every ``except Exception``
of a training script swallow the exit a launcher waits for.
"""

from __future__ import annotations

__all__ = ["MonitorClientError", "SettingsTypeError", "SettingsValueError"]


class MonitorClientError(Exception):
    """An error of monitor_client's own (the base of the client's exception classes)."""


class SettingsValueError(MonitorClientError, ValueError):
    """A setting or argument whose value makes no sense, refused before training starts."""


class SettingsTypeError(MonitorClientError, TypeError):
    """A setting or argument of the wrong type, or keywords that contradict the settings."""
