"""Alerting: findings -> rules -> alerts (fingerprint, cooldown, silences) -> the outbox.

Example::

    alerting = Alerting(settings.alerting, data_dir / "alerts.sqlite", registry)
    alerting.handle(RunContext("gpt-7"), findings, now=time.time())
"""

from monitor_agent.alerting.alerting_settings import AlertingSettings
from monitor_agent.alerting.model import AlertView, RunContext
from monitor_agent.alerting.rules import Rule, RuleError, load_rules
from monitor_agent.alerting.service import Alerting

__all__ = ["Alerting", "AlertingSettings", "AlertView", "Rule", "RuleError", "RunContext",
           "load_rules"]
