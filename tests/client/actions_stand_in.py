"""A loopback stand-in for the sidecar's actions contract (ingest answers carrying actions,
``GET /v1/runs/{id}/actions``): the rollback tests of the client and its framework callbacks
publish a rule's action here and watch what the trainer does with it."""

from __future__ import annotations

import gzip
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PLAN = {"checkpoint_step": 20, "checkpoint_path": "/ckpt/step-20.pt", "skip_from": 21,
        "skip_to": 40, "lr_factor": 0.5, "lr_steps": 10, "number": 1, "budget": 2}


def rollback_action(action_id: int = 5, **plan: object) -> dict:
    """A ``rollback`` action as the contract has it (docs/alerting.md)."""
    return {"id": action_id, "run_id": "r", "action": "rollback", "rule": "RollBack",
            "type": "divergence", "step": 35, "created_at": 1.0, "honoured_step": None,
            "message": "rolled back to step 20 (/ckpt/step-20.pt), skipping batches 21-40",
            "plan": {**PLAN, **plan}}


class StandIn:
    """Speaks the sidecar's wire contract for actions: the ingest answer carries the actions
    to the ranks in ``answer_ranks`` once ``publish`` made them; the actions endpoint serves
    them to anyone. Keeps every record it is sent, undecoded otherwise."""

    def __init__(self, answer_ranks: tuple[int, ...] = (0,)) -> None:
        self.records: list[dict] = []
        self.actions: list[dict] = []
        self.gets = 0
        self.answer_ranks = answer_ranks
        self.lock = threading.Lock()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self, action: dict) -> None:
        with self.lock:
            self.actions.append(action)

    def of_kind(self, kind: str) -> list[dict]:
        with self.lock:
            return [r for r in self.records if r["kind"] == kind]

    def _handler(self):
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                objs = [json.loads(line) for line in body.split(b"\n") if line.strip()]
                with stand_in.lock:
                    stand_in.records.extend(objs)
                    ranks = {o.get("rank", 0) for o in objs}
                    actions = (list(stand_in.actions)
                               if ranks & set(stand_in.answer_ranks) else [])
                self._answer({"accepted": len(objs), "duplicates": 0, "rejected": [],
                              "actions": actions})

            def do_GET(self):  # noqa: N802
                url = urlparse(self.path)
                after = int(parse_qs(url.query).get("after", ["0"])[0])
                with stand_in.lock:
                    stand_in.gets += 1
                    actions = [a for a in stand_in.actions if a["id"] > after]
                self._answer({"run_id": url.path.split("/")[3], "actions": actions})

            def log_message(self, *args):
                pass

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
