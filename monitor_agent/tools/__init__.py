"""Command-line tools beside the server: the demo, its packaged GPT trainer, the HTML report;
and ``ToolError``, the package's error.
"""

from monitor_agent.errors import MonitorAgentError


class ToolError(MonitorAgentError):
    """A tool cannot do what it was asked; the message says why."""
