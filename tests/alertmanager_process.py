"""The real Debian ``prometheus-alertmanager`` on a free loopback port, routing to a webhook.

Example::

    with AlertmanagerProcess(tmp_path, webhook_url=receiver.url + "/am") as am:
        httpx.post(am.url + "/api/v2/alerts", json=[...])
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx

from tests.eventually import eventually
from tests.sidecar_process import free_port

BINARY = "prometheus-alertmanager"

CONFIG = """
route:
  receiver: hook
  group_by: [alertname, run_id]
  group_wait: {group_wait}
  group_interval: {group_interval}
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {webhook_url}
        send_resolved: true
"""


def available() -> bool:
    return shutil.which(BINARY) is not None


class AlertmanagerProcess:
    """One Alertmanager, clustering off, state in a temp dir."""

    def __init__(self, tmp: Path, webhook_url: str, group_wait: str = "0s",
                 group_interval: str = "1s") -> None:
        self.dir = Path(tmp) / f"am-{free_port()}"
        self.dir.mkdir(parents=True)
        self.config = self.dir / "alertmanager.yml"
        self.config.write_text(CONFIG.format(webhook_url=webhook_url, group_wait=group_wait,
                                             group_interval=group_interval))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> AlertmanagerProcess:
        log = (self.dir / "am.log").open("wb")
        self.proc = subprocess.Popen(
            [BINARY, f"--config.file={self.config}", f"--storage.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=log, stderr=subprocess.STDOUT,
        )
        proc = self.proc

        def ready() -> None:
            if proc.poll() is not None:
                raise RuntimeError((self.dir / "am.log").read_text())
            assert httpx.get(self.url + "/-/ready", timeout=1).status_code == 200

        eventually(ready, timeout=30, interval=0.05, what="alertmanager ready",
                   retry_on=(httpx.HTTPError,))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
