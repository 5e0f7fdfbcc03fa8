"""``MonitorAgentError``: the one base of the sidecar's own errors.

Each package has one error of its own, derived from it: ``records.RecordError`` (a record or
trace that does not follow the format), ``storage.database.StorageError`` (the stores, the
data directory's lock, export), ``alerting.rules.RuleError`` (the rules file),
``settings.ConfigError`` (the configuration and the bearer token), ``api.body.BadRequest``
(a request refused as a whole) and ``tools.ToolError`` (the spool pusher, the demo trainer);
more specific ones derive from their package's. The command line catches this one type, once
(cli.py): each message is already worded for the person who must act on it.

    >>> from monitor_agent.records import RecordError
    >>> from monitor_agent.storage.database import StorageError
    >>> issubclass(RecordError, MonitorAgentError), issubclass(StorageError, MonitorAgentError)
    (True, True)
"""

from __future__ import annotations


class MonitorAgentError(Exception):
    """A failure of the sidecar's own, worded for the person who must act on it."""
