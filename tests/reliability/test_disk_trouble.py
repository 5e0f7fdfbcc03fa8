"""A really full disk (a small tmpfs) and a really read-only data directory (a read-only
bind mount): the sidecar says not-ready and answers 503, never acknowledges what it cannot
store, and recovers by itself when the disk does. Needs mount rights (skipped without)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer
from tests.reliability.disk_full import disk_full, sh, steps, wait_ready


@pytest.fixture
def mountpoint(tmp_path: Path) -> Iterator[Path]:
    point = tmp_path / "mnt"
    point.mkdir()
    yield point
    subprocess.run(["umount", "-l", str(point)], capture_output=True)  # -l: open handles may linger


def _mount(cmd: str) -> None:
    try:
        sh(cmd)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot mount here: {exc.stderr.decode().strip()}")


def test_full_tmpfs_means_503_then_recovers_when_space_frees(mountpoint: Path):
    # Only the first mount may skip (no mount rights here); once it is up, a failed step of
    # the scenario (the recovery's remount too) is a failure.
    _mount(f"mount -t tmpfs -o size=3m tmpfs {mountpoint}")
    report = disk_full(mountpoint, mount=False)
    assert report.accepted > 0 and report.refusal == 503, report.line()
    assert "retry" in report.refusal_detail
    assert report.readyz == 503 and "storage" in report.readyz_reason
    # The refused write either stored nothing, or stored its records and then failed to
    # write their alerts (the alert store shares the full disk), which its 503 says: the
    # client's retry of it is then all duplicates. Either way nothing is lost or doubled.
    if "records stored" in report.refusal_detail:
        assert report.stored == report.accepted + 20, report.line()
        assert (report.accepted_after, report.duplicates_after) == (0, 20), report.line()
    else:
        assert report.stored == report.accepted, report.line()  # acknowledged == stored
        assert report.accepted_after == 20, report.line()


def test_read_only_data_dir_is_not_ready_then_recovers(tmp_path: Path, mountpoint: Path):
    data = tmp_path / "data"
    with LiveServer(load_settings(data_dir=data)) as srv:
        assert httpx.post(srv.url + "/v1/records", json=steps("ro", 1)).status_code == 200
    _mount(f"mount --bind {data} {mountpoint} && mount -o remount,ro,bind {mountpoint}")

    with LiveServer(load_settings(data_dir=mountpoint, tick_interval_seconds=0.1)) as srv:
        ready = httpx.get(srv.url + "/readyz")
        assert ready.status_code == 503 and "storage" in ready.json()["reason"], ready.text
        assert httpx.get(srv.url + "/healthz").status_code == 200  # alive, just not ready
        refused = httpx.post(srv.url + "/v1/records", json=steps("ro", 21))
        assert refused.status_code == 503 and "retry" in refused.json()["detail"]
        assert httpx.get(srv.url + "/v1/runs").status_code == 503

        sh(f"mount -o remount,rw,bind {mountpoint}")
        wait_ready(srv.url)
        r = httpx.post(srv.url + "/v1/records", json=steps("ro", 21))
        assert r.status_code == 200 and r.json()["accepted"] == 20
        stored = httpx.get(srv.url + "/v1/runs/ro/records", params={"limit": 100}).json()
        assert [s["step"] for s in stored["records"]] == list(range(1, 41))
