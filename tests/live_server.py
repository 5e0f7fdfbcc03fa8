"""A real uvicorn server running ``create_app(settings)`` in a thread on loopback.

Cheaper to start than a subprocess; use ``SidecarProcess`` when a test must kill -9.

Example::

    with LiveServer(settings) as srv:
        httpx.get(srv.url + "/healthz")
"""

from __future__ import annotations

from monitor_agent.serving.embedded import EmbeddedServer, free_port
from monitor_agent.settings import Settings


class LiveServer(EmbeddedServer):
    """An EmbeddedServer on a free port (the settings' own port is ignored)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings.model_copy(update={"port": free_port()}))
