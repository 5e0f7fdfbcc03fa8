"""A real uvicorn server running ``create_app(settings)`` in a thread on loopback.

Cheaper to start than a subprocess; use ``SidecarProcess`` when a test must kill -9.

Example::

    with LiveServer(settings) as srv:
        httpx.get(srv.url + "/healthz")
"""

from __future__ import annotations

import threading
import time

import uvicorn

from monitor_agent.app import create_app
from monitor_agent.settings import Settings
from sidecar_process import free_port


class LiveServer:
    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.settings = settings
        self.app = create_app(settings)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
