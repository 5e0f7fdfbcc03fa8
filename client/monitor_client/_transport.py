"""One HTTP POST of a batch of records to the sidecar, and what its answer means.

The body is JSON Lines (``application/x-ndjson``), gzip-compressed; the token, when set,
goes in ``Authorization: Bearer``. The answer is classified once, here, so the sender only
decides what to do:

- OK: stored, perhaps with per-record rejections.
- RETRY (transient, the sidecar may answer later): connection refused or reset, timeouts,
  429, 5xx (503 "cannot store now"), and anything unexpected.
- TOO_LARGE (413): split the batch; a single record still too large is BAD.
- BAD (400, 415, 422: this batch is malformed; re-sending it cannot help): drop the batch.
- MISCONFIGURED (401/403 wrong or missing token, 404/405 wrong path, 421 a host name the
  sidecar does not answer to, a URL without a scheme
  or that does not parse, ``https://`` to a sidecar that speaks plain HTTP): no later attempt can succeed until a person changes the
  script's settings, so ``fix`` says what to change and the sender stops trying.

Answers as ``classify`` reads them (``HttpTransport.post`` returns the same for the
sidecar's answer, or RETRY / MISCONFIGURED when no answer came)::

    >>> classify(200, b'{"accepted": 1, "rejected": [{"index": 1, "reason": "bad step"}]}')
    PostResult(outcome=<PostOutcome.OK: 'ok'>, detail='', rejected=[(1, 'bad step')],
               actions=[], attempts=[], fix='', unknown_run=[])
    >>> classify(503, b"cannot store now").outcome, classify(413, b"").outcome
    (<PostOutcome.RETRY: 'retry'>, <PostOutcome.TOO_LARGE: 'too_large'>)
    >>> print(classify(401, b'{"detail": "bad token"}').fix)
    the token is wrong or missing: pass token= (or set MONITOR_AGENT_TOKEN) to the
    sidecar's token
"""

from __future__ import annotations

import enum
import gzip
import json
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

import requests


class PostOutcome(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    TOO_LARGE = "too_large"
    BAD = "bad"
    MISCONFIGURED = "misconfigured"


@dataclass(frozen=True)
class PostResult:
    """What one POST achieved; ``rejected`` holds (index, reason) of refused records,
    ``actions`` what alert rules ask the trainer to do (stop, checkpoint)."""

    outcome: PostOutcome
    detail: str = ""
    rejected: list[tuple[int, str]] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)
    attempts: list[dict] = field(default_factory=list)  # the run id's attempt (_attempt.py)
    fix: str = ""  # MISCONFIGURED: what the user should change
    # A preview's answer: indexes of the steps whose run the sidecar has not stored yet (its
    # run record waits in the same backlog); they are sent again once records got through.
    unknown_run: list[int] = field(default_factory=list)


class HttpTransport:
    """Posts batches to ``{url}/v1/records`` (previews to ``/v1/records/preview``); never
    raises, always answers a PostResult.

    Its repr never shows the token; a URL that cannot work is answered before any
    request::

        >>> transport = HttpTransport("http://127.0.0.1:9400", token="s3cret", timeout=(2, 10))
        >>> transport
        HttpTransport('http://127.0.0.1:9400/v1/records')
        >>> transport.close()
        >>> no_scheme = HttpTransport("127.0.0.1:9400")
        >>> result = no_scheme.post([b'{"kind":"run","run_id":"r"}'])
        >>> result.outcome
        <PostOutcome.MISCONFIGURED: 'misconfigured'>
        >>> print(result.detail)
        url '127.0.0.1:9400' has no http:// or https:// scheme
        >>> no_scheme.close()
    """

    def __init__(self, url: str, token: str | None = None,
                 timeout: float | tuple[float, float] = (2.0, 10.0), gzip_level: int = 1) -> None:
        self.base = str(url).rstrip("/")
        self.endpoint = self.base + "/v1/records"
        self.url_problem = url_problem(self.base)
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
        return self._post(self.endpoint, lines)

    def preview(self, lines: list[bytes]) -> PostResult:
        """Post copies of alarming records to ``/v1/records/preview`` (see _alarming.py).

        Same body and token; a sidecar older than the route answers 404 (MISCONFIGURED)."""
        return self._post(self.endpoint + "/preview", lines)

    def _post(self, endpoint: str, lines: list[bytes]) -> PostResult:
        if self.url_problem:
            return PostResult(PostOutcome.MISCONFIGURED, self.url_problem, fix=_URL_FIX)
        body = gzip.compress(b"\n".join(lines) + b"\n", compresslevel=self.gzip_level)
        try:
            resp = self._session.post(endpoint, data=body, headers=self._headers,
                                      timeout=self.timeout)
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
                requests.exceptions.InvalidSchema) as exc:
            return PostResult(PostOutcome.MISCONFIGURED, f"{type(exc).__name__}: {exc}",
                              fix=_URL_FIX)
        except requests.exceptions.SSLError as exc:
            if _plain_http_answered(exc):
                return PostResult(PostOutcome.MISCONFIGURED,
                                  f"{self.base} answered TLS with plain HTTP", fix=_SCHEME_FIX)
            return PostResult(PostOutcome.RETRY, f"{type(exc).__name__}: {exc}")
        except requests.RequestException as exc:
            return PostResult(PostOutcome.RETRY, f"{type(exc).__name__}: {exc}")
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


_URL_FIX = ("pass url= (or set MONITOR_AGENT_URL) to the sidecar's base address with its "
            "scheme, e.g. http://127.0.0.1:9400")
_SCHEME_FIX = ("the sidecar speaks plain HTTP (it has no TLS of its own): use http:// in url= "
               "(or MONITOR_AGENT_URL), or put a TLS proxy in front of it")
# What OpenSSL says when the first bytes back from the server are not a TLS record (an
# HTTP/1.1 answer to our ClientHello): "wrong version number" up to OpenSSL 3.1, "record
# layer failure" from 3.2; "http request" when it recognises the HTTP text itself.
_PLAIN_HTTP_SSL_ERRORS = ("wrong_version_number", "wrong version number",
                          "record layer failure", "http request")


def _plain_http_answered(exc: Exception) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in _PLAIN_HTTP_SSL_ERRORS)


_FIXES = {
    401: "the token is wrong or missing: pass token= (or set MONITOR_AGENT_TOKEN) to the "
         "sidecar's token",
    403: "the token is not allowed to write: pass token= (or set MONITOR_AGENT_TOKEN) to "
         "the sidecar's token",
    404: "nothing answers at this path: url= must be the sidecar's base address without a "
         "path, e.g. http://127.0.0.1:9400 (the client adds /v1/records)",
    405: "this address does not take records: url= must be the sidecar's base address, e.g. "
         "http://127.0.0.1:9400",
    421: "the sidecar does not answer to this host name (its DNS rebinding guard): add the "
         "name to the sidecar's allowed_hosts setting, or use its IP address in url=",
}


def url_problem(url: str) -> str:
    """Why ``url`` cannot be a sidecar address ('' when it can), before any request."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        return f"url {url!r} does not parse: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"url {url!r} has no http:// or https:// scheme"
    if not parts.hostname:
        return f"url {url!r} names no host"
    return ""


def classify(status: int, content: bytes) -> PostResult:
    """Map an HTTP answer to a PostResult and its PostOutcome (see the module docstring)."""
    text = content[:300].decode("utf-8", "replace")
    if status == 200:
        body = _body(content)
        return PostResult(PostOutcome.OK, rejected=_rejected(body), actions=_actions(body),
                          attempts=_dicts(body, "attempts"), unknown_run=_indexes(body))
    if status == 413:
        return PostResult(PostOutcome.TOO_LARGE, f"413: {text}")
    if status in (400, 415, 422):
        return PostResult(PostOutcome.BAD, f"{status}: {text}")
    if status in _FIXES:
        return PostResult(PostOutcome.MISCONFIGURED, f"{status}: {text}", fix=_FIXES[status])
    return PostResult(PostOutcome.RETRY, f"{status}: {text}")


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


def _indexes(body: dict) -> list[int]:
    """A preview's ``unknown_run`` (format.md); [] from a sidecar that does not say."""
    found = body.get("unknown_run")
    if not isinstance(found, list):
        return []
    return [i for i in found if isinstance(i, int) and not isinstance(i, bool)]


def _actions(body: dict) -> list[dict]:
    return _dicts(body, "actions")


def _dicts(body: dict, key: str) -> list[dict]:
    found = body.get(key)
    return [a for a in found if isinstance(a, dict)] if isinstance(found, list) else []
