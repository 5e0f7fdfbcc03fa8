"""Channel and outbox settings: Slack, PagerDuty, Alertmanager, webhook, console, outbox.

They live beside the channels they configure, so adding a channel touches ``notify/``
alone; ``alerting/settings.py`` composes them into ``AlertingSettings``
(``alerting.slack``, ``alerting.outbox``, ...). Secrets (webhook URLs, routing keys) are
``SecretStr``: never in repr, logs or API answers; each has a ``*_file`` twin that reads it
from a file (Docker/Kubernetes secrets)::

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     secret = Path(tmp, "slack")
    ...     _ = secret.write_text("https://hooks.slack.com/services/T0/B0/XYZ")
    ...     slack = SlackSettings(webhook_url_file=secret)
    >>> slack.webhook_url, slack.secret()
    (SecretStr('**********'), 'https://hooks.slack.com/services/T0/B0/XYZ')
    >>> AlertmanagerSettings(urls=["http://admin:hunter2@am-0:9093"]).model_dump()["urls"]
    ['http://admin:***@am-0:9093']
    >>> OutboxSettings(max_pending=500).max_attempts
    100
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_serializer, model_validator

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
ROUTING_KEY_LEN = 32


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _read_secret(value: SecretStr | None, path: Path | None, name: str) -> SecretStr | None:
    """The secret from ``name`` or ``name_file``; a clear error when both or an unreadable file."""
    if value is not None and path is not None:
        raise ValueError(f"set either {name} or {name}_file, not both")
    if path is None:
        return value
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"{name}_file: cannot read {path}: {exc.strerror}") from None
    if not text:
        raise ValueError(f"{name}_file: {path} is empty")
    return SecretStr(text)


class SlackSettings(_Section):
    """A Slack incoming webhook; ``min_interval_seconds`` honours Slack's ~1 message/s."""

    webhook_url: SecretStr | None = None
    webhook_url_file: Path | None = None
    min_interval_seconds: float = Field(default=1.0, ge=0)
    timeout_seconds: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _load(self) -> SlackSettings:
        self.webhook_url = _read_secret(self.webhook_url, self.webhook_url_file, "webhook_url")
        return self

    def secret(self) -> str | None:
        return self.webhook_url.get_secret_value() if self.webhook_url else None


class PagerDutySettings(_Section):
    """PagerDuty Events API v2: an integration's routing key and the enqueue URL."""

    routing_key: SecretStr | None = None
    routing_key_file: Path | None = None
    url: str = PAGERDUTY_EVENTS_URL
    timeout_seconds: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _load(self) -> PagerDutySettings:
        key = _read_secret(self.routing_key, self.routing_key_file, "routing_key")
        if key is not None:
            # A wrong key is answered 400 for every page, i.e. every page lost: fail at
            # load (check-config, startup) instead. Integration keys are 32 characters.
            text = key.get_secret_value().strip()
            if len(text) != ROUTING_KEY_LEN or any(c.isspace() for c in text):
                raise ValueError(
                    f"routing_key: a PagerDuty integration key is {ROUTING_KEY_LEN} characters "
                    f"without spaces; got {len(text)} characters"
                    + (" with whitespace inside" if any(c.isspace() for c in text) else ""))
            key = SecretStr(text)
        self.routing_key = key
        return self

    def secret(self) -> str | None:
        return self.routing_key.get_secret_value() if self.routing_key else None


class AlertmanagerSettings(_Section):
    """Alertmanager base URLs (every member of an HA cluster), e.g. http://am-0:9093."""

    urls: list[str] = Field(default_factory=list)
    resend_interval_seconds: float = Field(
        default=60.0, gt=0, description="Firing alerts are re-sent this often, as Prometheus does."
    )
    timeout_seconds: float = Field(default=5.0, gt=0)

    @field_serializer("urls")
    def _hide_passwords(self, urls: list[str]) -> list[str]:
        return [_redact_userinfo(u) for u in urls]


class WebhookSettings(_Section):
    """A generic JSON webhook (the URL may embed a token, so it is a secret)."""

    url: SecretStr | None = None
    url_file: Path | None = None
    timeout_seconds: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _load(self) -> WebhookSettings:
        self.url = _read_secret(self.url, self.url_file, "url")
        return self

    def secret(self) -> str | None:
        return self.url.get_secret_value() if self.url else None


class ConsoleSettings(_Section):
    """Alerts written to the log (stderr of ``monitor-agent serve``).

    ``enabled`` unset means "when nothing else is": a sidecar with no channel configured
    still shows its alerts instead of dropping them. ``false`` silences it for good.
    """

    enabled: bool | None = Field(
        default=None, description="None: on only when no other channel is configured."
    )


class OutboxSettings(_Section):
    """Limits of the durable delivery queue."""

    max_pending: int = Field(default=10_000, ge=1, description="Undelivered notifications kept.")
    max_attempts: int = Field(
        default=100, ge=1, description="Failed tries before giving up (Retry-After answers do not "
        "count); with the backoff cap about an hour of failures, so max_age usually decides."
    )
    max_age_seconds: float = Field(default=3600.0, gt=0, description="Give up on older ones.")
    attempt_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Whole time one delivery attempt may take (connect, "
        "send, the full answer); a receiver still answering then is cut off and the attempt "
        "counts as failed. Channel timeouts bound each read, this the sum."
    )
    backoff_base_seconds: float = Field(default=0.5, gt=0)
    backoff_cap_seconds: float = Field(default=60.0, gt=0)
    max_retry_after_seconds: float = Field(
        default=300.0, gt=0, description="Cap on a receiver's Retry-After."
    )
    # A flood of new runs cannot bury or crowd out a page (notify/fairness.py,
    # docs/alerting.md "What a flood cannot do").
    reserved_for_pages: float = Field(
        default=0.1, ge=0, lt=1, description="Share of max_pending only pages (error, "
        "critical) of established runs and summaries of new runs' pages may use: whatever "
        "else fills the outbox, a real page still finds room."
    )
    new_run_seconds: float = Field(
        default=300.0, ge=0, description="A run is new for this long after its first record "
        "reached the sidecar: its alerts' messages go after established runs' of the same "
        "severity, and its pages count against new_run_burst. 0: no run is new."
    )
    new_run_burst: int = Field(
        default=10, ge=0, description="Pages (error, critical) about new runs' alerts, per "
        "channel and source (the address that first sent the run), sent one by one per "
        "new_run_window_seconds; the rest go out as one summary per window."
    )
    new_run_window_seconds: float = Field(
        default=60.0, gt=0, description="The window of new_run_burst, and the least time "
        "between two summaries of one source on one channel."
    )


def _redact_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
