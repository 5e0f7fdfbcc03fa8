"""Alerting configuration: the rules file, Grafana links, grouping, the outbox and channels.

Embedded in the sidecar's Settings as ``alerting:`` (env ``MONITOR_AGENT_ALERTING__...``).
The channel and outbox sections are defined in ``notify/channel_settings.py`` (beside the
channels) and composed here under the same keys; secrets there are ``SecretStr``.

Sections are given as mappings (as in the YAML file); secrets stay out of repr, and a
rules file that cannot be loaded fails here, at config load::

    >>> s = AlertingSettings(slack={"webhook_url": "https://hooks.slack.com/services/T0/B0/XYZ"},
    ...                      pagerduty={"routing_key": "R0UT1NGKEY0123456789abcdef012345"})
    >>> s.slack.secret()
    'https://hooks.slack.com/services/T0/B0/XYZ'
    >>> s.pagerduty.routing_key
    SecretStr('**********')
    >>> AlertingSettings(rules_file="no-such-rules.yaml")
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for AlertingSettings
      Value error, cannot read alert rules no-such-rules.yaml: No such file or directory ...
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from monitor_agent.alerting.rules import load_rules
from monitor_agent.notify.channel_settings import (
    PAGERDUTY_EVENTS_URL,
    ROUTING_KEY_LEN,
    AlertmanagerSettings,
    ConsoleSettings,
    OutboxSettings,
    PagerDutySettings,
    SlackSettings,
    WebhookSettings,
)

# Re-exported: older code imports the channel sections from here.
__all__ = ["PAGERDUTY_EVENTS_URL", "ROUTING_KEY_LEN", "AlertingSettings", "AlertmanagerSettings",
           "ConsoleSettings", "OutboxSettings", "PagerDutySettings", "SlackSettings",
           "WebhookSettings"]


class AlertingSettings(BaseModel):
    """Everything alerting is told; see docs/alerting.md."""

    model_config = ConfigDict(extra="forbid")

    rules_file: Path | None = Field(
        default=None, description="None: the packaged default_rules.yaml.")
    grafana_url: str | None = Field(default=None, description="Base URL for dashboard links.")
    group_wait_seconds: float = Field(
        default=0.05, ge=0, le=60,
        description="Alerts of one run arriving this close are one message.")
    outbox: OutboxSettings = Field(default_factory=OutboxSettings)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    pagerduty: PagerDutySettings = Field(default_factory=PagerDutySettings)
    alertmanager: AlertmanagerSettings = Field(default_factory=AlertmanagerSettings)
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)

    @model_validator(mode="after")
    def _rules_load(self) -> AlertingSettings:
        # A broken rules file fails at config load (check-config, startup), naming the field.
        if self.rules_file is not None:
            load_rules(self.rules_file)
        return self
