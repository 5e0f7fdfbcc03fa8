"""Alerting: findings -> rules -> alerts (fingerprint, cooldown, silences) -> the outbox.

The app builds one ``Alerting`` on ``data_dir / "alerts.sqlite"`` and starts its threads;
here on ":memory:" and not started, a first NaN finding becomes a firing alert::

    >>> from prometheus_client import CollectorRegistry
    >>> from monitor_agent.records.types import Finding, Severity
    >>> alerting = Alerting(AlertingSettings(), ":memory:", CollectorRegistry())
    >>> nan = Finding("nan_inf", Severity.CRITICAL, "gpt-7", step=300, message="loss is NaN")
    >>> alerting.handle(RunContext("gpt-7"), [nan], now=1000.0)   # no rule acted
    []
    >>> alerting.flush(now=1001.0)   # the group wait is over: fired, the page queued
    >>> [(a.alertname, a.severity, a.state) for a in alerting.active_alerts()]
    [('TrainingNanInf', 'critical', 'firing')]
"""

from monitor_agent.alerting.alerts import AlertView, RunContext
from monitor_agent.alerting.rules import Rule, RuleError, load_rules
from monitor_agent.alerting.service import Alerting
from monitor_agent.alerting.settings import AlertingSettings

__all__ = ["Alerting", "AlertingSettings", "AlertView", "Rule", "RuleError", "RunContext",
           "load_rules"]
