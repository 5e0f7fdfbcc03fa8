"""A local stand-in for Slack's and PagerDuty's HTTP endpoints, for end-to-end tests."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Webhook:
    """Slack's and PagerDuty's ends of the wire: records every JSON body by path.

    Example::

        hook = Webhook()
        ...  # point Alertmanager's receivers at hook.url + "/slack", hook.url + "/pagerduty"
        pages = hook.bodies("/pagerduty")
        hook.close()
    """

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with hook.lock:
                    hook.received.append((self.path, body))
                pd = self.path == "/pagerduty"
                self.send_response(202 if pd else 200)
                self.end_headers()
                self.wfile.write(b'{"status":"success"}' if pd else b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for p, body in self.received if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
