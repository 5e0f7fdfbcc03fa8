"""Clients that send a read and never read the answer: what the sidecar then holds.

Each shape opens ``clients`` connections to a real sidecar, sends one GET on each (a few
dozen bytes) and never reads; while they stay connected it measures the sidecar's peak RSS
above what it had before (VmHWM after resetting it through /proc/PID/clear_refs) and the
RSS it still holds, and whether ``/healthz`` and a real ingest are answered meanwhile.
``seed_run`` stores the large records the reads ask for.

Example::

    stored = seed_run(sc.url, "big", records=8, layers=5000)
    row = attack(sc.url, sc.port, sc.proc.pid, Shape("records", records_path("big"), 60))
    print(row.line())
    close_all(row.sockets)
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.reliability.amplification import peak_mib, reset_peak
from tests.reliability.record_fuzz import rss_mib

MiB = 1024 * 1024


@dataclass(frozen=True)
class Shape:
    name: str
    target: str          # the request target, e.g. /v1/runs/big/records?limit=10000
    clients: int


@dataclass
class ReaderRow:
    shape: Shape
    sent: int            # bytes all clients sent
    peak_mib: float      # VmHWM above the RSS before the attack
    held_mib: float      # RSS above it once the requests are in, clients still connected
    healthz: int | str   # status of /healthz during the attack (or the error)
    ingest: int | str    # status of a one-record POST /v1/records during the attack
    sockets: list[socket.socket] = field(default_factory=list, repr=False)

    def line(self) -> str:
        return (f"{self.shape.name:<34} {self.shape.clients:>5} clients {self.sent:>8} B sent  "
                f"peak +{self.peak_mib:6.1f} MiB  held +{self.held_mib:6.1f} MiB  "
                f"/healthz {self.healthz}  ingest {self.ingest}")


def records_path(run_id: str, limit: int = 10_000) -> str:
    return f"/v1/runs/{run_id}/records?since_step=-1&limit={limit}"


def big_step(run_id: str, step: int, layers: int) -> dict:
    """A step record of ``layers`` layers: about 170 bytes a layer as stored."""
    return {"kind": "step", "run_id": run_id, "step": step, "time": float(step), "loss": 2.0,
            "layers": {f"model.blocks.{i}.attn.c_proj.weight": {
                "grad_norm": 0.123456789 + i, "param_norm": 12.3456789, "update_norm": 1e-3}
                for i in range(layers)}}


def seed_run(url: str, run_id: str, records: int, layers: int) -> int:
    """Store ``records`` large step records of one run; returns the bytes sent."""
    sent = 0
    with httpx.Client(timeout=120) as client:
        for step in range(1, records + 1):
            body = {"records": [big_step(run_id, step, layers)]}
            res = client.post(url + "/v1/records", json=body)
            assert res.status_code == 200 and res.json()["accepted"] == 1, res.text[:300]
            sent += len(res.request.content)
    return sent


def seed_runs(url: str, runs: int) -> None:
    """Store ``runs`` runs of one small step each (what the runs lists answer)."""
    with httpx.Client(timeout=120) as client:
        for first in range(0, runs, 5000):
            batch = [{"kind": "step", "run_id": f"crowd-{i}", "step": 1, "time": 1.0,
                      "loss": 1.0} for i in range(first, min(runs, first + 5000))]
            res = client.post(url + "/v1/records", json={"records": batch})
            assert res.status_code == 200, res.text[:300]


def _stalled(port: int, target: str) -> tuple[socket.socket, int]:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    request = f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    s.sendall(request)
    return s, len(request)


def _probe(url: str) -> tuple[int | str, int | str]:
    def status(call) -> int | str:
        try:
            return call().status_code
        except httpx.HTTPError as exc:
            return type(exc).__name__
    with httpx.Client(timeout=10) as client:
        healthz = status(lambda: client.get(url + "/healthz"))
        ingest = status(lambda: client.post(url + "/v1/records", json={"records": [
            {"kind": "step", "run_id": "bystander", "step": int(time.time() * 1000),
             "time": time.time(), "loss": 1.0}]}))
    return healthz, ingest


def attack(url: str, port: int, pid: int, shape: Shape, settle: float = 2.0) -> ReaderRow:
    """Open the shape's stalled readers, let the sidecar answer into them, then measure.
    The sockets stay open (``row.sockets``): close them with ``close_all``."""
    before = rss_mib(pid)
    reset_peak(pid)
    sockets, sent = [], 0
    for _ in range(shape.clients):
        s, n = _stalled(port, shape.target)
        sockets.append(s)
        sent += n
    time.sleep(settle)  # the answers are produced into connections nobody reads
    healthz, ingest = _probe(url)
    held = rss_mib(pid) - before
    peak = peak_mib(pid) - before
    return ReaderRow(shape, sent, peak, held, healthz, ingest, sockets)


def closed_by_sidecar(s: socket.socket, within: float) -> bool:
    """Read what the sidecar sent until it closed the connection (True), or ``within``
    seconds pass with the connection still open (False)."""
    deadline = time.monotonic() + within
    s.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if s.recv(1 << 20) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset: aborted by the sidecar
            return True
    return False


def close_all(sockets: list[socket.socket]) -> None:
    for s in sockets:
        s.close()


def stored_mib(data_dir: Path, run_id: str) -> float:
    import sqlite3

    db = sqlite3.connect(f"file:{data_dir / 'monitor.sqlite'}?mode=ro", uri=True)
    try:
        (size,) = db.execute("SELECT COALESCE(SUM(length(body)), 0) FROM records "
                             "WHERE run_id = ?", (run_id,)).fetchone()
    finally:
        db.close()
    return size / MiB
