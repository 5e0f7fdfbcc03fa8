"""Metrics: every metric name (names) and the sidecar's self-metrics (sidecar, delivery,
alerting). The run metrics behind /metrics are rendered by reads/exposition.py.
"""
