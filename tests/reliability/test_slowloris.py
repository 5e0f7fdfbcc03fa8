"""1000 half-sent requests (slowloris) must not take the sidecar down (issue 12).

A real sidecar process; the attacker opens 1000 connections that each send part of a
request's headers and then nothing. The sidecar keeps its connections (and so its file
descriptors) under ``max_connections`` by closing the oldest slow ones, answers a real
client meanwhile, and closes every half-sent request after ``header_timeout_seconds``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx

from tests.eventually import eventually
from tests.sidecar_process import SidecarProcess

ATTACK = 1000
MAX_CONNECTIONS = 200


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _half_sent(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"POST /v1/records HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applic")
    return s


def _closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(0.01)
    try:
        return s.recv(1024) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_half_sent_requests_are_shed_and_timed_out(tmp_path: Path):
    config = tmp_path / "c.yaml"
    config.write_text(f"header_timeout_seconds: 1.5\nmax_connections: {MAX_CONNECTIONS}\n"
                      "log_level: warning\n")
    with SidecarProcess(tmp_path / "data", config=config) as sc:
        pid = sc.proc.pid
        baseline = _open_fds(pid)
        attackers = []
        try:
            for _ in range(ATTACK):
                attackers.append(_half_sent(sc.port))
            # Under attack: bounded descriptors, and a real client still gets through.
            assert _open_fds(pid) <= baseline + MAX_CONNECTIONS + 5
            r = httpx.get(sc.url + "/healthz", timeout=5)
            assert r.status_code == 200
            ok = httpx.post(sc.url + "/v1/records", timeout=5, json={"records": [
                {"kind": "step", "run_id": "real", "step": 1, "time": 1.0, "loss": 1.0}]})
            assert ok.status_code == 200 and ok.json()["accepted"] == 1
            # After the header timeout every half-sent request is closed by the sidecar.
            eventually(lambda: all(_closed_by_peer(s) for s in attackers), timeout=10,
                       interval=0.2, what="every half-sent request closed by the sidecar")
            assert _open_fds(pid) <= baseline + 5
            assert sc.proc.poll() is None
            assert httpx.get(sc.url + "/readyz", timeout=5).status_code == 200
        finally:
            for s in attackers:
                s.close()
