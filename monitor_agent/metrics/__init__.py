"""Metrics: every metric name (names), the sidecar's self-metrics (sidecar, delivery,
alerting), and the run metrics renderer behind /metrics (exposition).
"""
