"""A real sidecar in a subprocess, on a free loopback port, for end-to-end tests.

It can be killed with SIGKILL and started again on the same data directory, which is how
the restart and crash tests exercise durability.

Example::

    with SidecarProcess(tmp_path) as sc:
        httpx.post(sc.url + "/v1/records", json={"records": [...]})
        sc.kill()
        sc.start()
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from monitor_agent.serving.embedded import free_port
from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[1]


class SidecarProcess:
    """``python -m monitor_agent serve`` with its own data dir, port, config and env.

    ``host`` is the address it binds and ``url_host`` the one tests reach it on (its
    ``host`` by default); ``wrap`` turns the command into the one started (netcluster runs
    it inside a node's network namespace with it)."""

    def __init__(
        self,
        data_dir: Path,
        config: Path | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        url_host: str | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.config = config
        self.env = env or {}
        self.port = port or free_port()
        self.host = host
        self.wrap = wrap
        self.url = f"http://{url_host or host}:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / "sidecar.log"

    def start(self, timeout: float = 30.0) -> SidecarProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "monitor_agent", "serve", "--host", self.host,
               "--port", str(self.port), "--data-dir", str(self.data_dir)]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), str(REPO / "client"), env.get("PYTHONPATH", "")]
        )
        if self.wrap is not None:
            cmd = self.wrap(cmd)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log)
        try:
            self.wait_ready(timeout)
        except BaseException:
            # A sidecar that was not ready in time is not left running: the fixture that
            # started it never reaches its own cleanup, and a loaded box is where it starts.
            self.kill()
            raise
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> None:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited with {self.proc.returncode}:\n{self.log()}")
            res = httpx.get(self.url + "/readyz", timeout=1.0)
            assert res.status_code == 200, res.text

        try:
            eventually(ready, timeout=timeout, interval=0.05, what="the sidecar ready",
                       retry_on=(httpx.HTTPError,))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log()}") from None

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks run, exactly like an OOM kill or a node loss."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM and wait: a graceful shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def post(self, records: list[dict[str, Any]], **kw: Any) -> httpx.Response:
        return httpx.post(self.url + "/v1/records", json={"records": records}, timeout=10, **kw)

    def records(self, run_id: str, since_step: int = -1, limit: int = 10_000) -> list[dict]:
        r = httpx.get(f"{self.url}/v1/runs/{run_id}/records",
                      params={"since_step": since_step, "limit": limit}, timeout=10)
        r.raise_for_status()
        return r.json()["records"]

    def __enter__(self) -> SidecarProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
