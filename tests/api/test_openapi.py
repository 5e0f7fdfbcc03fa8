"""The OpenAPI document describes every answer: each route declares a 2xx schema, and the
real answers of a real sidecar validate against it (strictly: no undocumented keys)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from monitor_agent.serving.app import create_app
from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer

METHODS = ("get", "post", "put", "patch", "delete")


def _document(tmp_path: Path) -> dict[str, Any]:
    return create_app(load_settings(data_dir=tmp_path)).openapi()


def test_every_route_declares_a_success_schema(tmp_path: Path):
    doc = _document(tmp_path)
    missing = []
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method not in item:
                continue
            answers = {c: r for c, r in item[method]["responses"].items() if c.startswith("2")}
            if not answers:
                missing.append(f"{method.upper()} {path}: no 2xx response")
            for code, answer in answers.items():
                if code == "204":  # No Content: nothing to describe
                    assert not answer.get("content"), f"{method} {path} 204 with a body"
                    continue
                schemas = [c.get("schema") for c in answer.get("content", {}).values()]
                if not schemas or not all(schemas):
                    missing.append(f"{method.upper()} {path} {code}: no schema")
    assert missing == []
    assert len(doc["paths"]) >= 14  # every JSON route of the sidecar, not a subset


def _strict(schema: Any) -> Any:
    """Object schemas that list their properties allow no others: an answer key that the
    document does not name is a drift between the two."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


class Checker:
    def __init__(self, url: str, doc: dict[str, Any]) -> None:
        self.url, self.doc = url, doc
        self.components = _strict(doc["components"])
        self.checked: set[tuple[str, str]] = set()

    def call(self, method: str, template: str, status: int = 200, path: str | None = None,
             **kwargs: Any) -> Any:
        r = httpx.request(method, self.url + (path or template), timeout=30, **kwargs)
        assert r.status_code == status, r.text
        answer = self.doc["paths"][template][method.lower()]["responses"][str(status)]
        if status == 204:
            return None
        schema = answer["content"]["application/json"]["schema"]
        root = {**_strict(copy.deepcopy(schema)), "components": self.components}
        jsonschema.Draft202012Validator(root).validate(r.json())
        self.checked.add((method.lower(), template))
        return r.json()


def _records() -> list[dict[str, Any]]:
    run = {"kind": "run", "run_id": "doc", "config": {"total_steps": 100},
           "labels": {"project": "p"},  # node 0 of two: this sidecar leads it
           "cluster": {"node_rank": 0, "nodes": 2, "local_world_size": 1}}
    steps = [{"kind": "step", "run_id": "doc", "step": s, "time": 100.0 + s,
              "loss": 2.0 if s < 8 else "NaN", "grad_norm": 1.0, "lr": 1e-3,
              "tokens": 512, "step_time": 0.1} for s in range(1, 10)]
    ev = {"kind": "eval", "run_id": "doc", "step": 5, "time": 106.0, "val_loss": 2.1}
    ckpts = [{"kind": "checkpoint", "run_id": "doc", "step": s, "time": 110.0,
              "path": f"/ckpt/{s}.pt", "bytes": 1 << 20, "tag": "periodic"} for s in (4, 9)]
    return [run, *steps, ev, *ckpts]


@pytest.mark.timeout(120)
def test_real_answers_match_the_document(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        doc = httpx.get(srv.url + "/openapi.json").json()
        c = Checker(srv.url, doc)
        c.call("GET", "/healthz")
        c.call("GET", "/readyz")
        assert c.call("POST", "/v1/records", json={"records": _records()})["accepted"] == 13
        c.call("POST", "/v1/records/preview", json={"records": [
            {"kind": "step", "run_id": "doc", "step": 20, "time": 130.0, "loss": "NaN"}]})
        peer = c.call("POST", "/v1/peer/digests", json={
            "sidecar": "node-1-sidecar",
            "runs": [{"run_id": "doc", "node": 1, "ranks": [1], "known_action": 0}],
            "records": [{"kind": "step", "run_id": "doc", "rank": 1, "step": 5,
                         "time": 106.0, "loss": 2.0}], "findings": []})
        assert peer["accepted"] == 1 and "doc" in peer["runs"]
        [listed] = c.call("GET", "/v1/runs")["runs"]
        assert listed["active"] is True
        detail = c.call("GET", "/v1/runs/{run_id}", path="/v1/runs/doc")
        assert detail["ranks"]["0"]["latest"]["loss"] == "NaN"  # the string spelling
        assert detail["alerts"], "a NaN step pages: the run's alerts are listed"
        c.call("GET", "/v1/runs/{run_id}/records", path="/v1/runs/doc/records",
               params={"since_step": -1})
        assert c.call("GET", "/v1/runs/{run_id}/findings",
                      path="/v1/runs/doc/findings")["findings"]
        c.call("GET", "/v1/runs/{run_id}/actions", path="/v1/runs/doc/actions")
        ledger = c.call("GET", "/v1/runs/{run_id}/checkpoints", path="/v1/runs/doc/checkpoints")
        assert [c["status"] for c in ledger["checkpoints"]] == ["clean", "suspect"]
        goodput = c.call("GET", "/v1/runs/{run_id}/goodput", path="/v1/runs/doc/goodput")
        assert goodput["wall_seconds"] >= 0 and goodput["run_id"] == "doc"
        nodes = c.call("GET", "/v1/runs/{run_id}/nodes", path="/v1/runs/doc/nodes")
        assert nodes == {"run_id": "doc", "nodes": []}  # one node: never told apart
        alerts = c.call("GET", "/v1/alerts")["alerts"]
        fp = alerts[0]["fingerprint"]
        c.call("POST", "/v1/alerts/{fingerprint}/ack", path=f"/v1/alerts/{fp}/ack",
               json={"by": "ana"})
        silence = c.call("POST", "/v1/silences", 201,
                         json={"run_id": "doc", "duration_seconds": 60})
        assert c.call("GET", "/v1/silences")["silences"]
        c.call("DELETE", "/v1/silences/{id}", 204, path=f"/v1/silences/{silence['id']}")
        assert c.call("GET", "/v1/ui/runs")["runs"][0]["worst_finding"] == "critical"
        _wait_for_history(srv.url)
        c.call("GET", "/v1/runs/{run_id}/series", path="/v1/runs/doc/series")
        c.call("GET", "/v1/runs/{run_id}/matrix/{stat}", path="/v1/runs/doc/matrix/grad_norm")
        assert c.call("GET", "/v1/node")["drained"] is False
        assert c.call("DELETE", "/v1/node/drain")["drained"] is False
        assert httpx.get(srv.url + "/metrics").headers["content-type"].startswith("text/plain")
    json_routes = {(m, p) for p, item in doc["paths"].items() for m in item
                   if m in METHODS and p != "/metrics"}
    assert json_routes - c.checked == {("delete", "/v1/silences/{id}")}  # 204: no body


def _wait_for_history(url: str) -> None:
    """The charts' history is indexed from a thread of its own: wait until it has the run."""
    def caught_up() -> None:
        r = httpx.get(url + "/v1/runs/doc/series", timeout=10)
        assert r.status_code == 200 and r.json()["count"] >= 9, f"{r.status_code} {r.text[:200]}"

    eventually(caught_up, timeout=60, interval=0.2, what="the chart history has the run")
