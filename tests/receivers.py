"""Local HTTP receivers that speak the Slack, PagerDuty and generic webhook protocols.

Each runs a real HTTP server on a free loopback port, records every request (with the time
it arrived), validates payloads the way the real service does (Slack answers 400
``invalid_payload``, PagerDuty 400 ``invalid event``), and can be scripted to answer with
429 + Retry-After, 500s, a 400 or a delay (for timeouts). Reusable by any test.

Each enforces its service's documented size limits, so a test that gets a page accepted
proves it would not be refused: PagerDuty's 512 KB an event and 1024 characters a summary
(``pagerduty_errors``), Block Kit's per-block limits (``slack_errors``: 50 blocks, a
header's 150 characters, a section's 3000, ...), and for the generic webhook the 1 MiB of
the proxy most often in front of one (nginx's ``client_max_body_size``, 413).

Example::

    with Receiver("pagerduty") as pd:
        pd.script(Reply(429, retry_after=1), Reply(500))   # then the protocol's success
        ... point the sidecar at pd.url ...
        events = pd.wait_for(1, timeout=5)
        assert events[0].json["event_action"] == "trigger"
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.eventually import eventually

PD_ACTIONS = ("trigger", "acknowledge", "resolve")
PD_SEVERITIES = ("critical", "error", "warning", "info")


@dataclass(frozen=True)
class Reply:
    """A scripted answer: status, body, Retry-After, a delay before answering, and
    ``trickle``: seconds between the bytes of the answer (headers included), one at a time,
    which keeps every read of a per-read timeout short and the answer unfinished for long."""

    status: int = 200
    body: Any = None
    retry_after: float | None = None
    delay: float = 0.0
    trickle: float = 0.0


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    status: int = 0
    json: Any = field(default=None)


class Receiver:
    """A threaded HTTP server playing one protocol: slack, pagerduty, webhook or alertmanager."""

    def __init__(self, protocol: str = "webhook", host: str = "127.0.0.1") -> None:
        assert protocol in ("slack", "pagerduty", "webhook", "alertmanager"), protocol
        self.protocol = protocol
        self.requests: list[Received] = []
        self._script: deque[Reply] = deque()
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self.block_errors: list[str] = []  # slack: why the last blocks were refused
        self._server = ThreadingHTTPServer((host, 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)
        self.url = f"http://{host}:{self._server.server_address[1]}"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()

    def script(self, *replies: Reply) -> None:
        """Answer the next requests with these, in order, then the protocol's success."""
        with self._cond:
            self._script.extend(replies)

    def wait_for(self, n: int, timeout: float = 10.0, accepted_only: bool = False) -> list[Received]:
        """Wait until ``n`` requests arrived (or were accepted); return them all."""
        def arrived() -> list[Received]:
            with self._cond:
                got = self._matching(accepted_only)
                assert len(got) >= n, [(r.status, r.json) for r in self.requests]
                return list(got)

        return eventually(arrived, timeout=timeout, what=f"{self.protocol}: {n} requests")

    def accepted(self) -> list[Received]:
        with self._cond:
            return self._matching(True)

    def _matching(self, accepted_only: bool) -> list[Received]:
        return [r for r in self.requests if not accepted_only or 200 <= r.status < 300]

    # -- what the server does with a request ----------------------------------------------

    def _answer(self, req: Received) -> Reply:
        with self._cond:
            scripted = self._script.popleft() if self._script else None
        if scripted is not None:
            return scripted
        try:
            req.json = json.loads(req.body)
        except ValueError:
            return self._invalid(["body is not JSON"])
        if self.protocol == "webhook" and len(req.body) > WEBHOOK_MAX_BODY_BYTES:
            return Reply(413, "<html>413 Request Entity Too Large</html>")
        errors = self._validate(req.json, len(req.body))
        if errors:
            return self._invalid(errors)
        return self._success(req.json)

    def _validate(self, body: Any, size: int) -> list[str]:
        if self.protocol == "slack":
            ok = isinstance(body, dict) and (body.get("text") or body.get("blocks"))
            if not ok:
                return ["missing text and blocks"]
            self.block_errors = slack_errors(body.get("blocks") or [])
            if self.block_errors:
                return ["invalid_blocks"]
            if slack_block_text(body.get("blocks") or []) > SLACK_MAX_BLOCK_TEXT:
                return ["msg_blocks_too_long"]
            return []
        if self.protocol == "pagerduty":
            return pagerduty_errors(body, size)
        if self.protocol == "alertmanager":
            ok = isinstance(body, list) and all(isinstance(a, dict) and a.get("labels") for a in body)
            return [] if ok else ["expected a list of alerts with labels"]
        return []

    def _invalid(self, errors: list[str]) -> Reply:
        if self.protocol == "slack":
            known = ("invalid_blocks", "msg_blocks_too_long")
            return Reply(400, errors[0] if errors[0] in known else "invalid_payload")
        if self.protocol == "pagerduty":
            return Reply(400, {"status": "invalid event", "message": "Event object is invalid",
                               "errors": errors})
        return Reply(400, {"errors": errors})

    def _success(self, body: Any) -> Reply:
        if self.protocol == "slack":
            return Reply(200, "ok")
        if self.protocol == "pagerduty":
            return Reply(202, {"status": "success", "message": "Event processed",
                               "dedup_key": body.get("dedup_key")})
        return Reply(200, {})

    def _record(self, req: Received) -> None:
        with self._cond:
            self.requests.append(req)
            self._cond.notify_all()


SLACK_MAX_BLOCK_TEXT = 12_000  # what users report Slack refusing (msg_blocks_too_long)
SLACK_MAX_BLOCKS = 50
# Block Kit's documented limits (api.slack.com/reference/block-kit): characters of text.
SLACK_TEXT_LIMITS = {"header": 150, "section": 3000, "field": 2000, "context": 3000,
                     "button": 75, "url": 3000, "block_id": 255}
PD_MAX_EVENT_BYTES = 512_000  # "Events API payloads are limited to 512 KB" (its overview)
PD_MAX_SUMMARY = 1024
WEBHOOK_MAX_BODY_BYTES = 1 << 20


def slack_errors(blocks: Any) -> list[str]:
    """What Slack refuses (``invalid_blocks``) in these blocks, by Block Kit's documented
    limits, naming the block and the limit."""
    if not isinstance(blocks, list):
        return ["blocks must be a list"]
    if len(blocks) > SLACK_MAX_BLOCKS:
        return [f"{len(blocks)} blocks: at most {SLACK_MAX_BLOCKS}"]
    lim, errors = SLACK_TEXT_LIMITS, []

    def check(where: str, text: Any, limit: int) -> None:
        if not isinstance(text, str) or not text:
            errors.append(f"{where}: no text")
        elif len(text) > limit:
            errors.append(f"{where}: {len(text)} characters, at most {limit}")

    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        where = f"blocks[{i}] ({kind})"
        if not isinstance(block, dict):
            errors.append(f"{where}: not an object")
            continue
        if "block_id" in block:
            check(f"{where}.block_id", block["block_id"], lim["block_id"])
        if kind == "header":
            check(where, (block.get("text") or {}).get("text"), lim["header"])
        elif kind == "section":
            if "text" in block:
                check(where, (block.get("text") or {}).get("text"), lim["section"])
            fields = block.get("fields") or []
            if len(fields) > 10:
                errors.append(f"{where}: {len(fields)} fields, at most 10")
            for j, field_ in enumerate(fields):
                check(f"{where}.fields[{j}]", field_.get("text"), lim["field"])
        elif kind == "context":
            elements = block.get("elements") or []
            if not 1 <= len(elements) <= 10:
                errors.append(f"{where}: {len(elements)} elements, 1 to 10")
            for j, element in enumerate(elements):
                if element.get("type") in ("mrkdwn", "plain_text"):
                    check(f"{where}.elements[{j}]", element.get("text"), lim["context"])
        elif kind == "actions":
            elements = block.get("elements") or []
            if not 1 <= len(elements) <= 25:
                errors.append(f"{where}: {len(elements)} elements, 1 to 25")
            for j, element in enumerate(elements):
                if element.get("type") == "button":
                    check(f"{where}.elements[{j}].text", (element.get("text") or {}).get("text"),
                          lim["button"])
                    if "url" in element:
                        check(f"{where}.elements[{j}].url", element["url"], lim["url"])
        elif kind != "divider":
            errors.append(f"{where}: a block type these messages do not use")
    return errors


def slack_block_text(blocks: Any) -> int:
    """Characters of "text" strings anywhere in the blocks."""
    if isinstance(blocks, dict):
        own = len(blocks["text"]) if isinstance(blocks.get("text"), str) else 0
        return own + sum(slack_block_text(v) for v in blocks.values() if not isinstance(v, str))
    if isinstance(blocks, list):
        return sum(slack_block_text(v) for v in blocks)
    return 0


def pagerduty_errors(body: Any, size: int = 0) -> list[str]:
    """What PagerDuty's Events API v2 would reject in this event (``size``: its bytes)."""
    if not isinstance(body, dict):
        return ["event must be an object"]
    errors = []
    if size > PD_MAX_EVENT_BYTES:
        errors.append(f"event is {size} bytes: larger than 512 KB")
    if not body.get("routing_key"):
        errors.append("'routing_key' is missing or blank")
    if body.get("event_action") not in PD_ACTIONS:
        errors.append("'event_action' is invalid")
    if len(str(body.get("dedup_key") or "")) > 255:
        errors.append("'dedup_key' is too long")
    if body.get("event_action") == "trigger":
        p = body.get("payload") or {}
        for key in ("summary", "source"):
            if not p.get(key):
                errors.append(f"'payload.{key}' is missing or blank")
        if p.get("severity") not in PD_SEVERITIES:
            errors.append("'payload.severity' is invalid")
        if len(str(p.get("summary") or "")) > PD_MAX_SUMMARY:
            errors.append("'payload.summary' is too long")
    elif not body.get("dedup_key"):
        errors.append("'dedup_key' is required to acknowledge or resolve")
    return errors


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("content-length") or 0)
            req = Received("POST", self.path, dict(self.headers), self.rfile.read(length),
                           time.time())
            reply = receiver._answer(req)
            if req.json is None:
                with contextlib.suppress(ValueError):
                    req.json = json.loads(req.body)
            if reply.delay and receiver._closing.wait(reply.delay):
                return
            req.status = reply.status
            receiver._record(req)
            if reply.trickle:
                self._trickle(reply)
            else:
                self._send(reply)

        def _trickle(self, reply: Reply) -> None:
            body = reply.body if isinstance(reply.body, str) else json.dumps(reply.body or {})
            raw = (f"HTTP/1.1 {reply.status} X\r\ncontent-type: application/json\r\n"
                   f"content-length: {len(body)}\r\n\r\n{body}").encode()
            for i in range(len(raw)):
                if receiver._closing.wait(reply.trickle if i else 0.0):
                    return
                try:
                    self.wfile.write(raw[i:i + 1])
                    self.wfile.flush()
                except OSError:
                    return  # the client gave up on it

        def _send(self, reply: Reply) -> None:
            body = reply.body if isinstance(reply.body, str) else json.dumps(reply.body or {})
            data = body.encode()
            try:
                self.send_response(reply.status)
                self.send_header("content-type", "text/plain" if isinstance(reply.body, str)
                                 else "application/json")
                self.send_header("content-length", str(len(data)))
                if reply.retry_after is not None:
                    self.send_header("retry-after", f"{reply.retry_after:g}")
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out first, which is what a delay test wants

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
