"""The optional bearer token guards every write and admin route, enumerated from the app."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer

TOKEN = "s3cret-token-value"
# /metrics names runs and their values: under auth_reads it is a read like any other.
OPEN_ROUTES = {("GET", "/healthz"), ("GET", "/readyz")}
# The web UI's shells and assets hold no data (the page asks the API, with the token the
# user types in), so they load without it.
UI_SHELLS = {("GET", "/"), ("GET", "/runs/{run_id}"), ("GET", "/compare"),
             ("GET", "/ui/static/{path:path}")}


@pytest.fixture
def guarded(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path, token=TOKEN, auth_reads=True)) as srv:
        yield srv


def _routes(routes) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, walking included routers too."""
    out = []
    for route in routes:
        if isinstance(route, APIRoute):
            out.extend((m, route.path) for m in route.methods if m != "HEAD")
        elif hasattr(route, "original_router"):  # FastAPI's included-router wrapper
            out.extend(_routes(route.original_router.routes))
        elif hasattr(route, "methods"):
            out.extend((m, route.path) for m in route.methods if m != "HEAD")
    return out


def _fill(path: str) -> str:
    return path.replace("{run_id}", "r").replace("{fingerprint}", "f").replace("{id}", "1")


def test_every_route_but_health_needs_the_token(guarded):
    routes = [r for r in _routes(guarded.app.routes) if r not in OPEN_ROUTES | UI_SHELLS
              and not r[1].startswith(("/docs", "/redoc", "/openapi"))]
    writes = [r for r in routes if r[0] != "GET"]
    assert ("POST", "/v1/records") in writes and ("GET", "/metrics") in routes
    for method, path in routes:
        r = httpx.request(method, guarded.url + _fill(path), json={}, timeout=10)
        assert r.status_code == 401, (method, path, r.status_code)
        assert r.headers["www-authenticate"] == "Bearer"
        wrong = httpx.request(method, guarded.url + _fill(path), json={},
                              headers={"authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401, (method, path)


def test_ui_shells_are_the_same_for_every_run(guarded):
    assert {r for r in _routes(guarded.app.routes)} >= UI_SHELLS
    one, other = (httpx.get(f"{guarded.url}/runs/{r}", timeout=10) for r in ("a", "b"))
    assert one.status_code == 200 and one.content == other.content


def test_the_token_lets_writes_through(guarded):
    rec = {"kind": "step", "run_id": "a", "step": 1, "time": 1.0, "loss": 1.0}
    r = httpx.post(guarded.url + "/v1/records", json={"records": [rec]},
                   headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.json()["accepted"] == 1
    assert TOKEN not in r.text


def test_reads_are_open_by_default_but_writes_are_not(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path, token=TOKEN)) as srv:
        assert httpx.get(srv.url + "/v1/runs").status_code == 200
        assert httpx.post(srv.url + "/v1/records", json={"records": []}).status_code == 401


def test_without_a_token_everything_is_open(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        assert httpx.post(srv.url + "/v1/records", json={"records": []}).status_code == 200
