"""monitor_agent: the sidecar of the training-run health monitor."""

__version__ = "0.1.0"
