"""With a token configured and reads left open, no write or admin route (every one the app
serves, so a new route cannot slip through) works without it, and the token check is the
timing-safe comparison."""

from __future__ import annotations

import hmac
import re
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer

TOKEN = "guard-token-9c1d0e"
HEALTH = {"/healthz", "/readyz", "/metrics"}


def _routes(routes) -> list[tuple[str, str]]:
    out = []
    for route in routes:
        if isinstance(route, APIRoute) or hasattr(route, "methods"):
            out.extend((m, route.path) for m in route.methods if m not in ("HEAD", "OPTIONS"))
        elif hasattr(route, "original_router"):
            out.extend(_routes(route.original_router.routes))
    return out


def _fill(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "1", path)


@pytest.fixture
def guarded(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path, token=TOKEN)) as srv:
        yield srv


def test_every_write_route_needs_the_token_even_with_open_reads(guarded):
    writes = [(m, p) for m, p in _routes(guarded.app.routes)
              if m != "GET" and p not in HEALTH]
    assert ("POST", "/v1/records") in writes and len(writes) >= 4, writes
    for method, path in writes:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN},
                        {"authorization": f"Basic {TOKEN}"}, {"x-token": TOKEN}):
            r = httpx.request(method, guarded.url + _fill(path), json={}, headers=headers)
            assert r.status_code == 401, (method, path, headers, r.status_code)
            assert TOKEN not in r.text


def test_reads_stay_open_but_never_mutate(guarded):
    reads = [p for m, p in _routes(guarded.app.routes) if m == "GET" and "{" not in p]
    for path in reads:
        assert httpx.get(guarded.url + path).status_code in (200, 404), path
    assert httpx.get(guarded.url + "/v1/runs").json()["runs"] == []


def test_the_token_is_compared_in_constant_time(guarded, monkeypatch):
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    body = {"records": [{"kind": "step", "run_id": "t", "step": 1, "time": 1.0}]}
    for given in ("x", TOKEN[:-1], TOKEN):
        httpx.post(guarded.url + "/v1/records", json=body,
                   headers={"authorization": f"Bearer {given}"})
    assert seen == [(g.encode(), TOKEN.encode()) for g in ("x", TOKEN[:-1], TOKEN)]
