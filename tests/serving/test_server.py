"""The write deadline of serving/server.py over a real socket: an answer the client stops
reading is dropped once its writes waited ``write_timeout_seconds``, not kept for ever."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer

WRITE_TIMEOUT = 1.0


def _seed(url: str, records: int, layers: int) -> None:
    """A run of ``records`` steps of ``layers`` layers (about 0.6 MiB each, stored)."""
    for step in range(1, records + 1):
        record = {"kind": "step", "run_id": "big", "step": step, "time": float(step),
                  "loss": 2.0, "layers": {f"model.blocks.{i}.attn.c_proj.weight": {
                      "grad_norm": 0.123456789 + i, "param_norm": 12.3456789,
                      "update_norm": 1e-3} for i in range(layers)}}
        res = httpx.post(url + "/v1/records", json={"records": [record]}, timeout=60)
        assert res.status_code == 200 and res.json()["accepted"] == 1


def test_an_answer_the_client_does_not_read_is_dropped_after_the_write_deadline(
        tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, write_timeout_seconds=WRITE_TIMEOUT)
    with LiveServer(settings) as srv:
        _seed(srv.url, records=20, layers=6000)  # a 12 MiB answer
        s = socket.socket()
        # The attacker's side keeps no buffer to speak of: what the sidecar cannot hand
        # to the kernel (4 MiB at most) waits in its own buffer.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", srv.port))
        s.sendall(b"GET /v1/runs/big/records?limit=10000 HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(WRITE_TIMEOUT + 3.0)  # not reading: the deadline passes
        got, closed = 0, False
        s.settimeout(2.0)
        try:
            while chunk := s.recv(1 << 20):
                got += len(chunk)
            closed = True  # EOF
        except TimeoutError:  # still open: what was left is still coming
            pass
        except OSError:  # reset: aborted, its buffer dropped
            closed = True
        s.close()
        assert closed and got < 8 << 20, got  # closed, far from the whole answer
