"""A page on another origin cannot act on the sidecar through its user's browser, over real
HTTP on a real server with no token configured (the default): it cannot end a run or
acknowledge its firing NaN alert (Origin, Content-Type), cannot read answers through DNS
rebinding (Host), and cannot frame the run page (the headers every answer carries)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from monitor_agent.serving.browser_guard import inline_script_hashes
from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer

EVIL = "https://evil.example"
END = {"kind": "end", "run_id": "r1", "step": 7, "time": 1007.0, "status": "completed"}


@pytest.fixture
def server(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path,
                             alerting={"console": {"enabled": True}, "group_wait_seconds": 0})
    with LiveServer(settings) as srv:
        yield srv


def _firing_nan_alert(url: str) -> dict:
    records = [{"kind": "step", "run_id": "r1", "step": s, "time": 1000.0 + s,
                "loss": "NaN" if s == 6 else 2.0} for s in range(1, 7)]
    assert httpx.post(url + "/v1/records", json={"records": records}).status_code == 200
    return eventually(
        lambda: httpx.get(url + "/v1/alerts", params={"state": "firing"}).json()["alerts"],
        what="an alert fired")[0]


def test_a_cross_origin_page_cannot_end_a_run_or_ack_its_alert(server):
    alert = _firing_nan_alert(server.url)
    ack = f"{server.url}/v1/alerts/{alert['fingerprint']}/ack"
    end = httpx.Request("POST", server.url + "/v1/records",
                        json={"records": [END]}).content
    attempts = [
        # what a <form> or fetch(..., {mode: "no-cors"}) can send: no preflight needed
        ("POST", server.url + "/v1/records", end, {"content-type": "text/plain",
                                                   "origin": EVIL}, 403),
        ("POST", server.url + "/v1/records", end, {"content-type": "text/plain"}, 415),
        ("POST", server.url + "/v1/records", end, {}, 415),
        ("POST", ack, b"", {"origin": EVIL}, 403),
        ("POST", ack, b"", {}, 415),
        ("POST", ack, b"{}", {"content-type": "application/x-www-form-urlencoded"}, 415),
        # a sandboxed frame or a file: page says "null"
        ("POST", ack, b"{}", {"content-type": "application/json", "origin": "null"}, 403),
        ("POST", ack, b"{}", {"content-type": "application/json",
                              "origin": server.url.replace("127.0.0.1", "localhost")}, 403),
        ("DELETE", server.url + "/v1/silences/1", b"", {"origin": EVIL}, 403),
    ]
    for method, url, body, headers, status in attempts:
        r = httpx.request(method, url, content=body, headers=headers)
        assert r.status_code == status, (method, url, headers, r.status_code, r.text)
        assert r.json()["detail"], r.text
    [still] = httpx.get(server.url + "/v1/alerts", params={"state": "firing"}).json()["alerts"]
    assert still["fingerprint"] == alert["fingerprint"] and not still.get("acked_by")
    assert httpx.get(server.url + "/v1/runs/r1").json()["status"] != "completed"
    # The web UI itself (same origin, JSON) still acts.
    r = httpx.post(ack, json={"by": "web UI"}, headers={"origin": server.url})
    assert r.status_code == 200 and r.json()["acked_by"] == "web UI"


HOSTS = [
    ("rebound.evil.example", 421), ("rebound.evil.example:{port}", 421),
    ("127.0.0.1.nip.io:{port}", 421),
    ("127.0.0.1:{port}", 200), ("localhost:{port}", 200), ("[::1]:{port}", 200),
    ("monitor-agent:{port}", 200), ("sidecar.corp.example:{port}", 200),
    ("10.1.2.3:{port}", 200), ("ui.localhost:{port}", 200),
    # names no public DNS serves: a Kubernetes service, mDNS, a private network
    ("monitor-agent.monitoring.svc:{port}", 200),
    ("monitor-agent.monitoring.svc.cluster.local:{port}", 200),
    ("gpu-node-7.local:{port}", 200), ("sidecar.internal:{port}", 200),
    ("svc.evil.example:{port}", 421), ("x.local.evil.example:{port}", 421),
]


def test_only_hosts_that_cannot_be_rebound_are_answered(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, allowed_hosts=["sidecar.corp.example"])
    with LiveServer(settings) as server:
        port = server.url.rsplit(":", 1)[1]
        for host, status in HOSTS:
            for path in ("/v1/runs", "/metrics", "/"):
                r = httpx.get(server.url + path, headers={"host": host.format(port=port)})
                assert r.status_code == status, (host, path, r.status_code)
                if status == 421:
                    assert "allowed_hosts" in r.json()["detail"]
        # The UI behind a reverse proxy that rewrites Host: its listed public name may act.
        ack = server.url + "/v1/alerts/nope/ack"
        for origin, status in (("https://sidecar.corp.example", 404),
                               ("https://sidecar.corp.example.evil.example", 403),
                               ("http://10.9.9.9", 403), (EVIL, 403)):
            r = httpx.post(ack, json={}, headers={"origin": origin})
            assert r.status_code == status, (origin, r.text)


def test_every_answer_forbids_framing_and_sniffing(server):
    answers = [httpx.get(server.url + p) for p in
               ("/", "/runs/r1", "/ui/static/run.js", "/v1/runs", "/v1/runs/nope", "/metrics",
                "/healthz", "/v1/runs/r1/series?points=1", "/docs")]
    answers.append(httpx.post(server.url + "/v1/records", content=b"x"))
    answers.append(httpx.get(server.url + "/", headers={"host": "evil.example"}))
    assert {r.status_code for r in answers} >= {200, 404, 415, 421, 422}
    for r in answers:
        csp = r.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp, (r.request.url, r.headers)
        assert "'unsafe-inline'" not in csp.split("script-src", 1)[1].split(";")[0]
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"


def test_the_docs_pages_inline_scripts_are_allowed_by_hash(server):
    for path in ("/docs", "/redoc"):
        r = httpx.get(server.url + path)
        script_src = r.headers["content-security-policy"].split("script-src", 1)[1]
        script_src = script_src.split(";")[0]
        assert "'unsafe-inline'" not in script_src
        for expr in inline_script_hashes(r.text):
            assert expr in script_src, (path, expr)
