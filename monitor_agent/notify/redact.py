"""Keep secrets out of logs written by libraries: httpx logs every request's full URL, and
a Slack or webhook URL is itself the secret.

Example::

    redactor = SecretRedactor([slack_url, routing_key])
    redactor.attach()      # on the "httpx" and "httpcore" loggers
    ...
    redactor.detach()
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

MASK = "**********"
LOGGERS = ("httpx", "httpcore")


class SecretRedactor(logging.Filter):
    """A filter that rewrites any record whose message contains one of the secrets."""

    def __init__(self, secrets: Iterable[str | None]) -> None:
        super().__init__()
        # Longest first, so a URL is masked whole before a key inside it.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        if any(s in message for s in self.secrets):
            for secret in self.secrets:
                message = message.replace(secret, MASK)
            record.msg, record.args = message, None
        return True

    def attach(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).addFilter(self)

    def detach(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeFilter(self)
