"""One HTTP POST of a batch of records to the sidecar, and what its answer means.

The body is JSON Lines (``application/x-ndjson``), gzip-compressed; the token, when set,
goes in ``Authorization: Bearer``. The answer is classified once, here, so the sender only
decides what to do: OK (stored, perhaps with per-record rejections), RETRY (connection
error, timeout, 429, 5xx, 503 "cannot store now", 401 because a restarted sidecar may take
the token again), TOO_LARGE (413: split the batch) or BAD (400: the body itself is
malformed and re-sending cannot help).

Example::

    result = HttpTransport("http://127.0.0.1:9400").post([b'{"kind":"run","run_id":"r"}'])
    if result.outcome is Outcome.RETRY: ...
"""

from __future__ import annotations

import enum
import gzip
import json
from dataclasses import dataclass, field
from urllib.parse import quote

import requests


class Outcome(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    TOO_LARGE = "too_large"
    BAD = "bad"


@dataclass(frozen=True)
class PostResult:
    """What one POST achieved; ``rejected`` holds (index, reason) of refused records,
    ``actions`` what alert rules ask the trainer to do (stop, checkpoint)."""

    outcome: Outcome
    detail: str = ""
    rejected: list[tuple[int, str]] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)


class HttpTransport:
    """Posts batches to ``{url}/v1/records``; never raises, always answers a PostResult.

    Example::

        HttpTransport("http://127.0.0.1:9400", token="s3cret", timeout=(2, 10))
    """

    def __init__(self, url: str, token: str | None = None,
                 timeout: tuple[float, float] = (2.0, 10.0), gzip_level: int = 1) -> None:
        self.base = url.rstrip("/")
        self.endpoint = self.base + "/v1/records"
        self.timeout = timeout
        self.gzip_level = gzip_level
        self._session = requests.Session()
        self._headers = {
            "Content-Type": "application/x-ndjson",
            "Content-Encoding": "gzip",
            "User-Agent": "monitor-client/0.1",
        }
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def __repr__(self) -> str:  # never show the token
        return f"HttpTransport({self.endpoint!r})"

    def post(self, lines: list[bytes]) -> PostResult:
        body = gzip.compress(b"\n".join(lines) + b"\n", compresslevel=self.gzip_level)
        try:
            resp = self._session.post(self.endpoint, data=body, headers=self._headers,
                                      timeout=self.timeout)
        except requests.RequestException as exc:
            return PostResult(Outcome.RETRY, f"{type(exc).__name__}: {exc}")
        return classify(resp.status_code, resp.content)

    def actions(self, run_id: str, after: int = 0) -> list[dict] | None:
        """Actions taken for ``run_id`` with id > ``after``; None if the sidecar is unreachable."""
        url = f"{self.base}/v1/runs/{quote(run_id, safe='')}/actions"
        try:
            resp = self._session.get(url, params={"after": after}, headers=self._headers,
                                     timeout=self.timeout)
            return list(resp.json().get("actions", [])) if resp.status_code == 200 else None
        except (requests.RequestException, ValueError, AttributeError):
            return None

    def close(self) -> None:
        self._session.close()


def classify(status: int, content: bytes) -> PostResult:
    """Map an HTTP answer to an Outcome (see the module docstring)."""
    text = content[:300].decode("utf-8", "replace")
    if status == 200:
        body = _body(content)
        return PostResult(Outcome.OK, rejected=_rejected(body), actions=_actions(body))
    if status == 413:
        return PostResult(Outcome.TOO_LARGE, f"413: {text}")
    if status == 400:
        return PostResult(Outcome.BAD, f"400: {text}")
    return PostResult(Outcome.RETRY, f"{status}: {text}")


def _body(content: bytes) -> dict:
    try:
        body = json.loads(content or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _rejected(body: dict) -> list[tuple[int, str]]:
    try:
        return [(int(r["index"]), str(r.get("reason", ""))) for r in body.get("rejected", [])]
    except (ValueError, TypeError, KeyError, AttributeError):
        return []


def _actions(body: dict) -> list[dict]:
    found = body.get("actions")
    return [a for a in found if isinstance(a, dict)] if isinstance(found, list) else []
