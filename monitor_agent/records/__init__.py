"""The record and its wire form: JSON with NaN (wire), the internal dataclasses (types),
the pydantic edge models (schemas), the budgets every string and map obeys (limits), the
format's JSON Schema, and the one helper that points at a bad line of YAML; and
``RecordError``, the package's error.
"""

from monitor_agent.errors import MonitorAgentError


class RecordError(MonitorAgentError, ValueError):
    """A record that does not follow docs/format.md; the message names the field (a trace
    file that cannot be read: ``wire.TraceError``)."""
