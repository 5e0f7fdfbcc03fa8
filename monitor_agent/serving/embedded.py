"""The sidecar in a background thread of this process: the demo and the tests use it.

``with EmbeddedServer(load_settings(port=free_port(), data_dir=...)) as srv:`` serves the
app on loopback until the block ends (the lifespan's threads included), ``srv.url`` being
its base address. tools/demo.py trains its model against one; the tests' ``LiveServer``
(tests/live_server.py) is one on a free port, and tests/api/test_health.py asks it over
real HTTP.
"""

from __future__ import annotations

import socket
import threading
import time

from monitor_agent.settings import Settings


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedServer:
    """uvicorn serving ``create_app(settings)`` on loopback; stopped on exit."""

    def __init__(self, settings: Settings) -> None:
        import uvicorn

        from monitor_agent.serving.app import create_app
        from monitor_agent.serving.server import uvicorn_config

        self.settings = settings
        self.port = settings.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings)
        config = uvicorn_config(self.app, settings, "127.0.0.1", self.port,
                                log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> EmbeddedServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the sidecar failed to start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
