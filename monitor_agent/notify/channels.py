"""Build the configured notifiers from settings: a channel without its secret is skipped.

With no channel configured, the console is the fallback (unless ``console.enabled: false``),
so a fresh ``monitor-agent serve`` prints its alerts instead of silently keeping them.

Takes any settings object with the five channel sections (``ChannelSettings``), such as
``AlertingSettings``, so notify never imports alerting.

Nothing configured, then a webhook with the console turned off::

    >>> from monitor_agent.alerting import AlertingSettings
    >>> bare = AlertingSettings()
    >>> describe_channels(bare, build_notifiers(bare))
    'alert channels: console (fallback: no other channel is configured; see docs/alerting.md)'
    >>> hook = AlertingSettings(webhook={"url": "https://ops.example.com/hooks/t0k3n"},
    ...                         console={"enabled": False})
    >>> build_notifiers(hook), channel_secrets(hook)
    ({'webhook': WebhookNotifier(url=**********)}, ['https://ops.example.com/hooks/t0k3n'])
"""

from __future__ import annotations

from typing import Protocol

from monitor_agent.notify.alertmanager import AlertmanagerNotifier
from monitor_agent.notify.base import Notifier
from monitor_agent.notify.channel_settings import (
    AlertmanagerSettings,
    ConsoleSettings,
    PagerDutySettings,
    SlackSettings,
    WebhookSettings,
)
from monitor_agent.notify.console import ConsoleNotifier
from monitor_agent.notify.pagerduty import PagerDutyNotifier
from monitor_agent.notify.slack import SlackNotifier
from monitor_agent.notify.webhook import WebhookNotifier

ALL_CHANNELS: tuple[str, ...] = ("slack", "pagerduty", "alertmanager", "webhook", "console")


class ChannelSettings(Protocol):
    """The channel sections, as ``AlertingSettings`` holds them (read-only here)."""

    @property
    def slack(self) -> SlackSettings: ...
    @property
    def pagerduty(self) -> PagerDutySettings: ...
    @property
    def alertmanager(self) -> AlertmanagerSettings: ...
    @property
    def webhook(self) -> WebhookSettings: ...
    @property
    def console(self) -> ConsoleSettings: ...


def channel_secrets(s: ChannelSettings) -> list[str]:
    """Every secret of the channels (URLs and keys), for redaction."""
    found = [s.slack.secret(), s.webhook.secret(), s.pagerduty.secret(), *s.alertmanager.urls]
    # An Alertmanager URL is a secret only through its password (secret_forms finds it).
    return [x for x in found if x and (x not in s.alertmanager.urls or "@" in x)]


def build_notifiers(s: ChannelSettings) -> dict[str, Notifier]:
    out: dict[str, Notifier] = {}
    if (url := s.slack.secret()) is not None:
        out["slack"] = SlackNotifier(url, s.slack.min_interval_seconds, s.slack.timeout_seconds)
    if (key := s.pagerduty.secret()) is not None:
        out["pagerduty"] = PagerDutyNotifier(key, s.pagerduty.url, s.pagerduty.timeout_seconds)
    if s.alertmanager.urls:
        am = s.alertmanager
        out["alertmanager"] = AlertmanagerNotifier(
            am.urls, am.resend_interval_seconds, am.timeout_seconds
        )
    if (hook := s.webhook.secret()) is not None:
        out["webhook"] = WebhookNotifier(hook, s.webhook.timeout_seconds)
    if s.console.enabled or (s.console.enabled is None and not out):
        out["console"] = ConsoleNotifier()
    return out


def describe_channels(s: ChannelSettings, notifiers: dict[str, Notifier]) -> str:
    """The startup line naming where alerts go, so "no channel" is never a silent state."""
    if not notifiers:
        return "alert channels: none (console.enabled is false): alerts are stored, not sent"
    names = ", ".join(notifiers)
    if s.console.enabled is None and list(notifiers) == ["console"]:
        return (f"alert channels: {names} (fallback: no other channel is configured; "
                "see docs/alerting.md)")
    return f"alert channels: {names}"
