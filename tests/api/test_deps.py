"""The bearer token fails closed: a token file deleted, emptied or unreadable while the
sidecar runs refuses every guarded route with 503 and the reason (clients retry), never
opens them and never answers 500; the outage is logged once, and a fixed file works."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer

TOKEN = "rotating-token-5f1e"
STEP = {"kind": "step", "run_id": "r", "step": 1, "time": 1.0, "loss": 1.0}


def _calls(url: str, headers: dict[str, str]) -> list[httpx.Response]:
    return [httpx.post(url + "/v1/records", json={"records": [STEP]}, headers=headers),
            httpx.get(url + "/v1/runs", headers=headers),
            httpx.get(url + "/metrics", headers=headers)]


@pytest.mark.parametrize("break_it", ["delete", "empty", "whitespace", "directory"])
def test_a_broken_token_file_fails_closed_and_is_logged_once(tmp_path: Path, caplog, break_it):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    settings = load_settings(data_dir=tmp_path / "data", token_file=token_file, auth_reads=True)
    good = {"authorization": f"Bearer {TOKEN}"}
    with LiveServer(settings) as srv:
        assert [r.status_code for r in _calls(srv.url, good)] == [200, 200, 200]
        token_file.unlink()
        if break_it == "empty":
            token_file.write_text("")
        elif break_it == "whitespace":
            token_file.write_text(" \n\t\n")
        elif break_it == "directory":
            token_file.mkdir()
        caplog.clear()
        for headers in ({}, good, {"authorization": "Bearer x"}):
            for r in _calls(srv.url, headers):
                assert r.status_code == 503, (r.request.url, headers, r.status_code, r.text)
                assert "token_file" in r.json()["detail"] and r.headers["retry-after"]
        outage = [r for r in caplog.records if "bearer token unavailable" in r.getMessage()]
        assert len(outage) == 1 and outage[0].levelno == logging.ERROR
        assert httpx.get(srv.url + "/healthz").status_code == 200  # the process is fine
        if token_file.is_dir():
            token_file.rmdir()
        token_file.write_text(TOKEN)
        assert [r.status_code for r in _calls(srv.url, good)] == [200, 200, 200]
        assert [r.status_code for r in _calls(srv.url, {})] == [401, 401, 401]
