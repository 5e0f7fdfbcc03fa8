"""A really full disk (a small tmpfs) and a really read-only data directory (a read-only
bind mount): the sidecar says not-ready and answers 503, never acknowledges what it cannot
store, and recovers by itself when the disk does. Needs mount rights (skipped without)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from live_server import LiveServer
from monitor_agent.settings import load_settings


def _sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True, capture_output=True)


@pytest.fixture
def mountpoint(tmp_path: Path) -> Iterator[Path]:
    point = tmp_path / "mnt"
    point.mkdir()
    yield point
    subprocess.run(["umount", "-l", str(point)], capture_output=True)  # -l: open handles may linger


def _mount(cmd: str) -> None:
    try:
        _sh(cmd)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot mount here: {exc.stderr.decode().strip()}")


def _steps(run: str, start: int, n: int = 20) -> dict:
    blob = {f"layer{i}": {"grad_norm": 1.0, "param_norm": 1.0} for i in range(200)}
    return {"records": [{"kind": "step", "run_id": run, "step": s, "time": float(s),
                         "loss": 1.0, "layers": blob} for s in range(start, start + n)]}


def _wait_ready(url: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/readyz").status_code != 200:
        assert time.monotonic() < deadline, httpx.get(url + "/readyz").text
        time.sleep(0.05)


def test_full_tmpfs_means_503_then_recovers_when_space_frees(mountpoint: Path):
    _mount(f"mount -t tmpfs -o size=3m tmpfs {mountpoint}")
    settings = load_settings(data_dir=mountpoint, tick_interval_seconds=0.1,
                             max_body_bytes=512 * 1024)
    with LiveServer(settings) as srv:
        accepted, step, r = 0, 1, None
        while step < 20_000:
            r = httpx.post(srv.url + "/v1/records", json=_steps("full", step), timeout=10)
            if r.status_code != 200:
                break
            accepted += r.json()["accepted"]
            step += 20
        assert r is not None and r.status_code == 503, r.text
        assert "retry" in r.json()["detail"]
        ready = httpx.get(srv.url + "/readyz")
        assert ready.status_code == 503 and "storage" in ready.json()["reason"]
        stored = httpx.get(srv.url + "/v1/runs/full/records", params={"limit": 10_000}).json()
        assert len(stored["records"]) == accepted  # acknowledged == stored, nothing more

        _sh(f"mount -o remount,size=64m {mountpoint}")
        _wait_ready(srv.url)
        again = httpx.post(srv.url + "/v1/records", json=_steps("full", step), timeout=10)
        assert again.status_code == 200 and again.json()["accepted"] == 20


def test_read_only_data_dir_is_not_ready_then_recovers(tmp_path: Path, mountpoint: Path):
    data = tmp_path / "data"
    with LiveServer(load_settings(data_dir=data)) as srv:
        assert httpx.post(srv.url + "/v1/records", json=_steps("ro", 1)).status_code == 200
    _mount(f"mount --bind {data} {mountpoint} && mount -o remount,ro,bind {mountpoint}")

    with LiveServer(load_settings(data_dir=mountpoint, tick_interval_seconds=0.1)) as srv:
        ready = httpx.get(srv.url + "/readyz")
        assert ready.status_code == 503 and "storage" in ready.json()["reason"], ready.text
        assert httpx.get(srv.url + "/healthz").status_code == 200  # alive, just not ready
        refused = httpx.post(srv.url + "/v1/records", json=_steps("ro", 21))
        assert refused.status_code == 503 and "retry" in refused.json()["detail"]
        assert httpx.get(srv.url + "/v1/runs").status_code == 503

        _sh(f"mount -o remount,rw,bind {mountpoint}")
        _wait_ready(srv.url)
        r = httpx.post(srv.url + "/v1/records", json=_steps("ro", 21))
        assert r.status_code == 200 and r.json()["accepted"] == 20
        stored = httpx.get(srv.url + "/v1/runs/ro/records", params={"limit": 100}).json()
        assert [s["step"] for s in stored["records"]] == list(range(1, 41))
