"""What a web page on another origin can make a browser do to the sidecar: nothing.

The sidecar listens on loopback (or a pod's network) and usually runs without a token, so
any page its user opens can aim their browser at it. Four things close that door, checked
here for every request before any route runs, so no route can forget them:

- **Host allow-list** (DNS rebinding: a page on ``evil.example`` re-resolves its own name
  to 127.0.0.1 and reads the answers as same-origin). Such a request carries the attacker's
  name in ``Host``. Accepted without configuration: IP literals, ``localhost`` and
  ``*.localhost``, single-label names (``monitor-agent``: a compose or Kubernetes
  service), names under suffixes the public DNS never serves (``.local``, ``.internal``,
  ``.lan``, ``.home.arpa``, ``.localdomain``, ``.svc``: mDNS, private networks, a
  Kubernetes ``svc.cluster.local``), and this machine's own host name and FQDN; none of
  them can be pointed at the victim by an attacker who owns only public DNS.
  Any other name must be listed in ``allowed_hosts`` (``*.example.com`` matches its
  subdomains; ``*`` turns the check off). Refused: 421 with the reason.
- **Origin** on state-changing methods (anything but GET, HEAD, OPTIONS): a browser always
  sends ``Origin`` cross-origin, so one that is neither this very host nor a name listed in
  ``allowed_hosts`` (the UI behind a reverse proxy), or is ``null``, is refused, 403. Clients that send no ``Origin`` (the training client, curl, Prometheus)
  are not browsers and pass.
- **Content-Type** on POST, PUT and PATCH must be JSON or NDJSON, what the client and the
  web UI send: a form or a ``no-cors`` fetch cannot set those types without a CORS
  preflight, which the sidecar never grants. Refused: 415 naming the types.
- **Headers on every answer**: a Content-Security-Policy (scripts from this origin only,
  no framing), ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and
  ``Referrer-Policy: no-referrer``. Scripts and style sheets must be files served from
  here; only inline ``style`` attributes are allowed (``style-src-attr``), because the
  UI's scripts set them on the elements they build and hashes cannot name those.
  FastAPI's ``/docs`` and ``/redoc`` load their assets from a CDN and run one inline
  script, which their own policy allows by its hash.

A page on another site posting a form to the sidecar, and the training client::

    >>> guard = BrowserGuard(None, allowed_hosts=[])
    >>> guard.refusal("POST", {"host": "127.0.0.1:9400", "origin": "https://evil.example",
    ...                        "content-type": "text/plain"})
    (403, "cross-origin request refused: Origin 'https://evil.example' is not this sidecar")
    >>> guard.refusal("POST", {"host": "127.0.0.1:9400",
    ...                        "content-type": "application/x-ndjson"}) is None
    True
    >>> guard.refusal("GET", {"host": "rebound.evil.example:9400"})[0]
    421
"""

from __future__ import annotations

import base64
import functools
import hashlib
import ipaddress
import re
import socket
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from monitor_agent.api.body import NDJSON_TYPES
from monitor_agent.records import wire

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
BODY_TYPES = ("application/json", *NDJSON_TYPES)

_PAGE_POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "style-src-attr": "'unsafe-inline'",
    "img-src": "'self' data: blob:",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
_CDN = "https://cdn.jsdelivr.net"


def _policy(parts: Mapping[str, str]) -> bytes:
    return "; ".join(f"{k} {v}" for k, v in parts.items()).encode()


def inline_script_hashes(html: str) -> list[str]:
    """CSP source expressions (``'sha256-...'``) of a page's inline ``<script>`` blocks."""
    found = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    return [f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
            for s in found]


def docs_policy(docs_html: Iterable[str]) -> bytes:
    """The policy of FastAPI's docs pages: their CDN, and their own inline scripts."""
    hashes = [h for html in docs_html for h in inline_script_hashes(html)]
    return _policy({
        **_PAGE_POLICY,
        "script-src": " ".join(["'self'", _CDN, *hashes]),
        "style-src": f"'self' 'unsafe-inline' {_CDN} https://fonts.googleapis.com",
        "style-src-attr": "'unsafe-inline'",
        "font-src": "'self' https://fonts.gstatic.com",
        "img-src": "'self' data: blob: https://fastapi.tiangolo.com https://cdn.redoc.ly",
        "worker-src": "'self' blob:",
    })


def fastapi_docs_pages(app: Any) -> dict[str, list[str]]:
    """The docs pages ``app`` serves and the HTML FastAPI renders for them."""
    pages: dict[str, list[str]] = {}
    title = app.title
    if app.openapi_url and app.docs_url:
        pages[app.docs_url] = [bytes(get_swagger_ui_html(
            openapi_url=app.openapi_url, title=f"{title} - Swagger UI",
            oauth2_redirect_url=app.swagger_ui_oauth2_redirect_url,
            init_oauth=app.swagger_ui_init_oauth,
            swagger_ui_parameters=app.swagger_ui_parameters).body).decode()]
    if app.openapi_url and app.redoc_url:
        pages[app.redoc_url] = [bytes(get_redoc_html(
            openapi_url=app.openapi_url, title=f"{title} - ReDoc").body).decode()]
    return pages


def host_allowed(host: str, allowed: Iterable[str]) -> bool:
    """Whether a request's ``Host`` (port ignored) may be answered: see the module's doc."""
    name = _host_name(host)
    if not name:
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    if "." not in name or name == "localhost" or name.endswith(PRIVATE_SUFFIXES):
        return True
    return name in _own_names() or _listed(name, allowed)


# Name suffixes no public DNS zone answers for (RFC 6761/6762/8375, ICANN's .internal, and
# Kubernetes' service domains): an attacker cannot rebind a name they cannot register.
PRIVATE_SUFFIXES = (".localhost", ".local", ".internal", ".lan", ".home.arpa",
                    ".localdomain", ".svc")


@functools.cache
def _own_names() -> frozenset[str]:
    """This machine's host name and FQDN: names its own admin gave it, not an attacker's."""
    names = {socket.gethostname(), socket.getfqdn()}
    return frozenset(n.lower().rstrip(".") for n in names if n)


def _listed(name: str, allowed: Iterable[str]) -> bool:
    for entry in allowed:
        entry = entry.lower().rstrip(".")
        if entry == "*" or entry == name or (
                entry.startswith("*.") and name.endswith(entry[1:])):
            return True
    return False


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:9400
        return host[1:host.find("]")] if "]" in host else ""
    return host.rsplit(":", 1)[0].rstrip(".") if host.count(":") == 1 else host.rstrip(".")


def _netloc(host: str, scheme: str) -> str:
    """``host[:port]`` with the scheme's default port made explicit, for comparison."""
    host = host.strip().lower()
    has_port = host.rsplit("]", 1)[-1].count(":") == 1
    return host if has_port else f"{host}:{443 if scheme == 'https' else 80}"


class BrowserGuard:
    """ASGI middleware: refuse what only a hostile page would send, and add the security
    headers to every answer (see the module's doc)."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str],
                 docs: Mapping[str, list[str]] | None = None) -> None:
        self.app = app
        self.allowed_hosts = list(allowed_hosts)
        self._page_policy = _policy(_PAGE_POLICY)
        self._docs_policy = docs_policy(h for page in (docs or {}).values() for h in page)
        self._docs_paths = frozenset(docs or ())

    def refusal(self, method: str, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """``(status, reason)`` for a request to refuse, or None."""
        host = headers.get("host")
        if host is not None and not host_allowed(host, self.allowed_hosts):
            return 421, (f"Host {host[:100]!r} is not served here (DNS rebinding guard): add "
                         "it to the sidecar's allowed_hosts setting if it is a name of yours")
        if method in SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and not self._origin_ok(origin, host):
            return 403, (f"cross-origin request refused: Origin {origin[:100]!r} is not "
                         "this sidecar")
        if method in BODY_METHODS:
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype not in BODY_TYPES:
                return 415, (f"Content-Type {ctype or '(none)'!r} refused: send "
                             f"{' or '.join(BODY_TYPES[:2])}")
        return None

    def _origin_ok(self, origin: str, host: str | None) -> bool:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (sandboxed frames, file: pages) is nobody's origin
        if host is not None and _netloc(parts.netloc, parts.scheme) == _netloc(host,
                                                                               parts.scheme):
            return True
        # The UI behind a reverse proxy that rewrites Host: its public name is listed.
        listed = [h for h in self.allowed_hosts if h != "*"]
        return _listed(_host_name(parts.netloc), listed)

    def _headers(self, path: str) -> list[tuple[bytes, bytes]]:
        policy = self._docs_policy if path in self._docs_paths else self._page_policy
        return [(b"content-security-policy", policy), (b"x-frame-options", b"DENY"),
                (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = self._headers(scope.get("path", ""))
        refused = self.refusal(scope["method"], Headers(scope=scope))
        if refused is not None:
            status, reason = refused
            body = wire.dumps({"detail": reason})
            await send({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()), *extra]})
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *[(k, v) for k, v in extra if k not in names]]
            await send(message)

        await self.app(scope, receive, send_with_headers)
