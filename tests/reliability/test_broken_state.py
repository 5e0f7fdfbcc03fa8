"""Broken state is repaired or reported, never served: a corrupt or orphaned chart history
is rebuilt from the records, a corrupt record store turns readiness and ingest to 503, a
second sidecar on one data directory refuses to start, and a clean stop leaves every
``*.sqlite`` complete on its own.

Real sidecars (a subprocess where a second process or a clean stop matters), real HTTP,
real SQLite files damaged on disk.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer
from tests.sidecar_process import SidecarProcess

PAGE = 4096


def _steps(run_id: str, steps, **extra) -> list[dict]:
    layers = {f"h.{i}.weight": {"grad_norm": 0.1 * i, "param_norm": 1.0, "update_norm": 1e-3}
              for i in range(8)}
    return [{"kind": "step", "run_id": run_id, "step": s, "time": 1000.0 + s, "loss": 1.0,
             "layers": layers, **extra} for s in steps]


def _post(url: str, records: list[dict]) -> httpx.Response:
    return httpx.post(url + "/v1/records", json={"records": records}, timeout=30)


def _series(url: str, run_id: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/runs/{run_id}/series", timeout=10)


def _charted(url: str, run_id: str, last: int):
    return lambda: (r := _series(url, run_id)).status_code == 200 and \
        r.json()["range"][1] == last and r


def _damage(path: Path, start: float = 0.0, end: float = 1.0) -> None:
    """Overwrite the pages from ``start`` to ``end`` (fractions of the file), never the
    first (the header and schema), with garbage: the file opens, those pages do not read."""
    size = path.stat().st_size
    assert size > 8 * PAGE, size
    lo = max(PAGE, int(size * start) // PAGE * PAGE)
    hi = int(size * end) // PAGE * PAGE
    with path.open("r+b") as fh:
        fh.seek(lo)
        fh.write(b"\xa5" * (hi - lo))


def _filled(data: Path, run_id: str = "r1", steps: int = 300) -> None:
    """A data directory holding ``steps`` steps of a run, charted, cleanly stopped."""
    with LiveServer(load_settings(data_dir=data)) as srv:
        for lo in range(1, steps + 1, 100):
            assert _post(srv.url, _steps(run_id, range(lo, lo + 100))).status_code == 200
        eventually(_charted(srv.url, run_id, steps),
                   timeout=30, interval=0.1, what="the run charted")


def test_a_corrupt_chart_history_is_moved_aside_and_rebuilt(tmp_path: Path, caplog):
    _filled(tmp_path)
    _damage(tmp_path / "history.sqlite")
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        series = eventually(_charted(srv.url, "r1", 300),
                            timeout=30, interval=0.1, what="the charts rebuilt")
        assert series.json()["count"] == 300
        assert httpx.get(srv.url + "/readyz").json() == {"status": "ready"}
    assert (tmp_path / "history.sqlite.corrupt").is_file()
    assert "moved to" in caplog.text and "rebuilding it from the records" in caplog.text


def test_history_follows_its_records_when_the_records_database_is_replaced(tmp_path: Path):
    _filled(tmp_path, run_id="gone", steps=300)
    for name in ("monitor.sqlite", "monitor.sqlite-wal", "monitor.sqlite-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        # Fewer records than the old history had folded: they must not hide behind its cursor.
        assert _post(srv.url, _steps("new", range(1, 11))).status_code == 200
        eventually(_charted(srv.url, "new", 10),
                   timeout=30, interval=0.1, what="the new run charted")
        assert _series(srv.url, "gone").status_code == 404  # no chart of a run not stored


def test_a_corrupt_record_store_is_not_ready_and_refuses_ingest(tmp_path: Path):
    _filled(tmp_path)
    # The middle of the records only: the run and its detector snapshot (written first and
    # last) still read, so it opens and recovers; on main it served 200s over the damage.
    _damage(tmp_path / "monitor.sqlite", 0.35, 0.65)
    with LiveServer(load_settings(data_dir=tmp_path, tick_interval_seconds=0.1)) as srv:
        ready = eventually(lambda: (r := httpx.get(srv.url + "/readyz")).status_code == 503
                           and r, timeout=30, interval=0.1, what="readyz red")
        assert "storage is corrupt: database disk image is malformed" in ready.json()["reason"]
        refused = _post(srv.url, _steps("r1", [301]))
        assert refused.status_code == 503, refused.text
        assert httpx.get(srv.url + "/v1/runs").status_code == 503  # no 500, never


def test_a_second_sidecar_on_the_same_data_dir_refuses_to_start(tmp_path: Path):
    with SidecarProcess(tmp_path / "data") as first:
        second = SidecarProcess(tmp_path / "data")
        with pytest.raises(RuntimeError, match="sidecar exited") as failed:
            second.start(timeout=60)
        assert f"in use by another monitor-agent (pid {first.proc.pid})" in str(failed.value)
        assert _post(first.url, _steps("solo", [1])).status_code == 200  # the first serves on


def test_after_a_clean_stop_the_sqlite_files_alone_are_a_complete_backup(tmp_path: Path):
    data, backup = tmp_path / "data", tmp_path / "backup"
    with SidecarProcess(data) as sc:
        assert sc.post(_steps("paged", [1, 2], loss="NaN")).status_code == 200
        eventually(lambda: httpx.get(sc.url + "/v1/alerts").json()["alerts"],
                   timeout=30, interval=0.1, what="an alert")
    backup.mkdir()
    for path in data.glob("*.sqlite"):  # what a naive backup copies
        shutil.copy(path, backup / path.name)
    assert not [p.name for p in data.glob("*-wal") if p.stat().st_size], "WAL left behind"
    with LiveServer(load_settings(data_dir=backup)) as srv:
        alerts = httpx.get(srv.url + "/v1/alerts").json()["alerts"]
        assert [a["run_id"] for a in alerts] == ["paged"]
        assert [r["step"] for r in httpx.get(srv.url + "/v1/runs/paged/records",
                                             params={"since_step": -1}).json()["records"]] \
            == [1, 2]
    assert os.listdir(backup)


def test_a_chart_history_damaged_while_serving_is_rebuilt_and_never_answers_500(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        for lo in (1, 101, 201):
            assert _post(srv.url, _steps("live", range(lo, lo + 100))).status_code == 200
        eventually(_charted(srv.url, "live", 300), timeout=30, interval=0.1, what="the run charted")
        with sqlite3.connect(tmp_path / "history.sqlite") as db:  # its pages into the file
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        _damage(tmp_path / "history.sqlite")
        # Whoever meets the damage first, a reader or the indexer's own fold, has it moved
        # aside and rebuilt; meanwhile readers get a 503 saying so, or the partial rebuild.
        answers = []
        series = eventually(lambda: answers.append(r := _series(srv.url, "live")) or (
            r.status_code == 200 and r.json()["range"][1] == 300 and r),
            timeout=30, interval=0.1, what="the charts rebuilt")
        assert series.json()["count"] == 300
        for r in answers:
            assert r.status_code in (200, 404, 503), r.text  # never a 500
            if r.status_code == 503:  # corrupt, or the new file not made yet: retry
                assert r.json()["detail"].startswith("chart history"), r.text
                assert "retry" in r.json()["detail"], r.text
        assert httpx.get(srv.url + "/readyz").json() == {"status": "ready"}
        assert _post(srv.url, _steps("live", [301])).status_code == 200  # ingest never stopped


def test_a_detector_snapshot_that_cannot_be_restored_is_rebuilt_from_the_records(tmp_path):
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        assert _post(srv.url, _steps("snap", range(1, 51))).status_code == 200
    # What an older version (or a damaged page) could leave: a snapshot of another shape.
    with sqlite3.connect(tmp_path / "monitor.sqlite") as db:
        assert db.execute("UPDATE detector_state SET state = ? WHERE run_id = 'snap'",
                          (b'{"suite": 42, "ranks": {"0": {}}}',)).rowcount == 1
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        assert httpx.get(srv.url + "/readyz").json() == {"status": "ready"}
        detail = httpx.get(srv.url + "/v1/runs/snap").json()
        assert detail["active"] and detail["last_step"] == 50
        assert _post(srv.url, _steps("snap", [51])).status_code == 200


def test_a_record_store_damaged_while_serving_turns_ready_and_ingest_to_503(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        for lo in (1, 101, 201):
            assert _post(srv.url, _steps("live", range(lo, lo + 100))).status_code == 200
        with sqlite3.connect(tmp_path / "monitor.sqlite") as db:  # its pages into the file
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        _damage(tmp_path / "monitor.sqlite", 0.35, 0.65)
        read = httpx.get(srv.url + "/v1/runs/live/records", params={"since_step": -1})
        assert read.status_code == 503, read.text  # never a 500
        assert read.json()["detail"].startswith("storage is corrupt"), read.text
        ready = httpx.get(srv.url + "/readyz")
        assert ready.status_code == 503 and "storage is corrupt" in ready.json()["reason"]
        refused = _post(srv.url, _steps("live", [301]))
        assert refused.status_code == 503 and "storage is corrupt" in refused.json()["detail"]
