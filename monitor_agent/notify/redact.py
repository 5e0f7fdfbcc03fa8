"""Keep every configured secret out of every log line and every stored error.

Secrets leak in ways no call site foresees: httpx logs each request's full URL (a Slack or
webhook URL is itself the secret), a receiver echoes the request path in its error body
(``Cannot POST /services/T000/B000/SECRET``), an exception message quotes a URL. So the
redactor works on text, not on call sites: installed once when the app is built, as the
process's log-record factory, it rewrites any record (message, arguments and traceback),
whatever logger made it; the outbox runs its stored ``last_error`` through ``redact``.

A URL secret is masked whole, and so are its path (what servers echo) and its long path
segments and query values (tokens), since a receiver may quote any of them. A receiver may
also quote a secret cut short (``invalid routing key: ...0123456789abcdef0123``): every
run of text made of ``WINDOW``-character pieces of a secret value (a token, a key, a
URL's long segments, query values and password) is masked too, however it was cut.

A Slack URL's path echoed by a receiver, its token alone, and a log line through the
installed factory (the app installs it for good; here it is taken out again)::

    >>> import sys
    >>> url = "https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXX"
    >>> redactor = SecretRedactor([url])
    >>> redactor.redact("Cannot POST /services/T000/B000/XXXXXXXXXXXXXXXX")
    'Cannot POST **********'
    >>> redactor.redact("token XXXXXXXXXXXXXXXX refused")
    'token ********** refused'
    >>> SecretRedactor(["R0utingKey0123456789abcdefABCDEF"]).redact(
    ...     "invalid key: ...456789abcdefABCD (32 characters)")
    'invalid key: ...********** (32 characters)'
    >>> log = logging.Logger("example")
    >>> log.addHandler(logging.StreamHandler(sys.stdout))
    >>> redactor.install()   # every log record of this process from now on, whatever logger
    >>> log.error("POST %s failed", url)
    POST ********** failed
    >>> redactor.uninstall()
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

MASK = "**********"
MIN_PART = 12  # shorter path segments are names ("services", "hooks"), not tokens
# Fewest characters of a secret that are masked wherever they appear. Below this, a match
# is as likely chance (a word, a hex run) as a leak, and 8 characters of a random key are
# still ~48 bits an attacker no longer has to guess; from 8 on, any piece is masked.
WINDOW = 8


def secret_values(secret: str) -> set[str]:
    """The parts of a secret that are random (and so masked piecewise): a URL's long path
    segments, query values and password; any other secret whole."""
    parts = urlsplit(secret)
    if not (parts.scheme in ("http", "https") and parts.netloc):
        return {secret}
    values = {seg for seg in parts.path.split("/") if len(seg) >= MIN_PART}
    values.update(v for _, v in parse_qsl(parts.query) if len(v) >= MIN_PART)
    if parts.password:
        values.add(parts.password)
    return values


def secret_forms(secret: str) -> set[str]:
    """The secret and the parts of it a server or library may quote on their own."""
    forms = {secret}
    parts = urlsplit(secret)
    if parts.scheme in ("http", "https") and parts.netloc:
        if len(parts.path) > 1:
            forms.add(parts.path + (f"?{parts.query}" if parts.query else ""))
            forms.add(parts.path)
        forms.update(seg for seg in parts.path.split("/") if len(seg) >= MIN_PART)
        forms.update(v for _, v in parse_qsl(parts.query) if len(v) >= MIN_PART)
        if parts.password:
            forms.add(parts.password)
    return {f for f in forms if f}


class SecretRedactor:
    """Masks secrets in text; as the log-record factory, in every log record."""

    def __init__(self, secrets: Iterable[str | None]) -> None:
        forms: set[str] = set()
        self._windows: set[str] = set()
        for s in secrets:
            if s:
                forms |= secret_forms(s)
                for value in secret_values(s):
                    self._windows.update(value[i:i + WINDOW]
                                         for i in range(len(value) - WINDOW + 1))
        # Longest first, so a URL is masked whole before a key inside it.
        self.secrets = sorted(forms, key=len, reverse=True)
        self._previous: Callable[..., logging.LogRecord] | None = None
        self._active = False

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return self._mask_pieces(text)

    def _piece_starts(self, text: str) -> list[int]:
        windows = self._windows
        return [i for i in range(len(text) - WINDOW + 1) if text[i:i + WINDOW] in windows]

    def _mask_pieces(self, text: str) -> str:
        """Mask each run of overlapping secret windows as one."""
        starts = self._piece_starts(text) if self._windows else []
        if not starts:
            return text
        out, shown, end = [], 0, -1
        for i in starts:
            if i > end:  # a new run begins: close the previous one
                if end >= 0:
                    out.append(MASK)
                out.append(text[shown:i])
            end = i + WINDOW
            shown = end
        out.append(MASK)
        out.append(text[shown:])
        return "".join(out)

    def _contains(self, text: str) -> bool:
        return any(s in text for s in self.secrets) or bool(
            self._windows and self._piece_starts(text))

    def scrub_record(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string is the logging module's business
            return
        if self._contains(message):
            record.msg, record.args = self.redact(message), None
        if record.exc_info and record.exc_info[1] is not None:
            text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            if self._contains(text):
                record.exc_text = self.redact(text)  # formatters use it as it is

    # -- the process's record factory -------------------------------------------------------

    def install(self) -> None:
        """Become the log-record factory (chained to the previous one)."""
        if self._active or not self.secrets:
            return
        self._previous = logging.getLogRecordFactory()
        self._active = True
        logging.setLogRecordFactory(self._make)

    def uninstall(self) -> None:
        self._active = False
        if logging.getLogRecordFactory() == self._make and self._previous is not None:
            logging.setLogRecordFactory(self._previous)
        # Otherwise another factory was chained after ours: we stay, as a pass-through.

    def _make(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        assert self._previous is not None
        record = self._previous(*args, **kwargs)
        if self._active:
            self.scrub_record(record)
        return record
