"""A real HTTP receiver on loopback that speaks the sidecar's ingest contract.

It is the sidecar's wire protocol, not our code: POST /v1/records with gzip'd JSON Lines,
validated by the sidecar's own ``monitor_agent.records.schemas``, idempotent on
(run_id, rank, kind, step), answering 200 {"accepted", "duplicates", "rejected"}. It can
be stopped and restarted on the same port, answer 503, or refuse bodies over a size (413).
POST /v1/records/preview (copies of NaN steps sent ahead of a backlog) is kept apart in
``previews``, in arrival order, and stores nothing; ``preview_route = False`` plays a
sidecar older than that route (404); ``unknown_runs = True`` answers, as the sidecar does,
which previews are of a run no run record arrived for yet (``unknown_run``).
End-to-end tests against the real sidecar process use the project's fixture instead.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from client_shapes import step_shape

from monitor_agent.records.schemas import RecordError, validate


class Receiver:
    """Loopback ingest endpoint; ``records`` keeps first arrivals in arrival order."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.records: list[dict] = []
        self.previews: list[dict] = []
        self.preview_route = True
        self.unknown_runs = False
        self.arrivals: list[tuple[str, int]] = []  # ("record" | "preview", step), in order
        self.keys: set[tuple] = set()
        self.duplicates = 0
        self.posts = 0
        self.fail_status: int | None = None
        self.max_body: int | None = None
        self.token: str | None = None
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def handle(self, headers, body: bytes, path: str = "/v1/records") -> tuple[int, dict]:
        self.posts += 1
        preview = path == "/v1/records/preview"
        if path not in ("/v1/records", "/v1/records/preview") or (
                preview and not self.preview_route):
            return 404, {"detail": "Not Found"}
        if self.fail_status:
            return self.fail_status, {"detail": "injected"}
        if self.token and headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"detail": "bad token"}
        if self.max_body is not None and len(body) > self.max_body:
            return 413, {"detail": "too large"}
        if headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        lines = [ln for ln in body.split(b"\n") if ln.strip()]
        objs = [json.loads(ln) for ln in lines]
        if preview:
            with self.lock:
                self.previews.extend(objs)
                self.arrivals.extend(("preview", o.get("step", 0)) for o in objs)
                known = {r["run_id"] for r in self.records if r["kind"] == "run"}
            unknown = [i for i, o in enumerate(objs)
                       if self.unknown_runs and o.get("run_id") not in known]
            return 200, {"received": len(objs), "alerts": 0, "rejected": [],
                         "unknown_run": unknown}
        return 200, self._ingest(objs)

    def _ingest(self, objs: list[dict]) -> dict:
        accepted, dups, rejected = 0, 0, []
        with self.lock:
            for i, obj in enumerate(objs):
                try:
                    validate(obj)
                except RecordError as exc:
                    rejected.append({"index": i, "reason": str(exc)})
                    continue
                key = (obj["run_id"], obj.get("rank", 0), obj["kind"], obj.get("step", 0))
                if key in self.keys:
                    dups += 1
                    self.duplicates += 1
                    continue
                self.keys.add(key)
                self.records.append(obj)
                self.arrivals.append(("record", obj.get("step", 0)))
                accepted += 1
        return {"accepted": accepted, "duplicates": dups, "rejected": rejected, "actions": []}

    def of_kind(self, kind: str) -> list[dict]:
        with self.lock:
            return [r for r in self.records if r["kind"] == kind]


def _handler(receiver: Receiver):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, payload = receiver.handle(self.headers, body, self.path)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return Handler


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def receiver():
    rec = Receiver().start()
    yield rec
    rec.stop()


@pytest.fixture
def stopped_receiver():
    """A receiver whose port is reserved but which is not listening yet."""
    rec = Receiver()
    yield rec
    rec.stop()


@pytest.fixture
def plain_loop_shape(tmp_path):
    """The step shape a plain training loop produces (the reference for the adapters), its
    data counted by a DataStream as docs/actions.md's loop does."""
    import torch

    from monitor_client import DataStream, Monitor, MonitorSettings, WatchSettings

    rec = Receiver().start()
    try:
        mon = Monitor(url=rec.url, run_id="plain-shape",
                      settings=MonitorSettings(spool_dir=tmp_path / "plain", install_hooks=False,
                                               linger=0.02, watch=WatchSettings(layer_stats_every=4)))
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon.watch(model, opt, grad_clip=1.0)
        data = DataStream(torch.utils.data.DataLoader(torch.randn(24, 4), batch_size=8))
        for step, x in enumerate(data, 1):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            mon.log_step(step, loss=loss.detach(), tokens=32, samples=8,
                         data_position=data.position)
        mon.close(timeout=10)
        return step_shape(rec.records)
    finally:
        rec.stop()
