import json
import os
import stat
import time

import pytest

from monitor_client import Monitor, MonitorSettings
from monitor_client._spool import Spool, spool_directory


def _lines(n, start=0, kind="step"):
    return [f'{{"kind":"{kind}","step":{i}}}'.encode() for i in range(start, start + n)]


def test_fifo_across_segments_and_ack_removes(tmp_path):
    spool = Spool(tmp_path, segment_bytes=200)
    spool.append(_lines(30))
    assert len(list(tmp_path.iterdir())) > 1
    got = []
    while len(spool):
        batch = spool.peek(7)
        got.extend(batch)
        spool.ack(len(batch))
    assert got == _lines(30)
    assert spool.pending_bytes == 0 and list(tmp_path.iterdir()) == []


def test_partial_ack_keeps_the_rest_in_order(tmp_path):
    spool = Spool(tmp_path)
    spool.append(_lines(5))
    assert len(spool.peek(5)) == 5
    spool.ack(2)
    assert spool.peek(10) == _lines(3, start=2)


def test_survives_reopen_and_skips_torn_write(tmp_path):
    spool = Spool(tmp_path, segment_bytes=10_000)
    spool.append(_lines(3))
    spool.close()
    with open(sorted(tmp_path.iterdir())[-1], "ab") as fh:
        fh.write(b'{"kind":"step","st')  # a crash in the middle of a write
    again = Spool(tmp_path)
    again.append(_lines(2, start=3))
    got = []
    while len(again):
        batch = again.peek(2)
        got.extend(batch)
        again.ack(len(batch))
    assert got == _lines(5)


def test_bounded_drops_the_oldest_steps_but_keeps_run_and_end(tmp_path):
    spool = Spool(tmp_path, max_bytes=300)
    run = b'{"kind":"run","run_id":"r"}'
    spool.append([run])
    dropped = spool.append(_lines(50))
    assert dropped > 0 and spool.pending_bytes <= 300
    spool.append(_lines(1, kind="end"))
    assert spool.dropped >= dropped
    count, everything = len(spool), []
    while batch := spool.peek(10_000, max_bytes=1 << 20):
        everything.extend(batch)
        spool.ack(len(batch))
    assert run in everything  # the run record survived the drop of its segment
    assert everything[-1] == _lines(1, kind="end")[0]
    steps = [line for line in everything if line.startswith(b'{"kind":"step"')]
    assert steps and steps[-1] == _lines(50)[-1]  # the newest steps are the ones kept
    assert count == len(everything)


def test_segments_older_than_max_age_are_dropped(tmp_path):
    old = Spool(tmp_path, max_bytes=1 << 20)
    old.append(_lines(10))
    old.close()
    for segment in tmp_path.glob("*.ndjson"):
        os.utime(segment, (time.time() - 7200, time.time() - 7200))
    again = Spool(tmp_path, max_bytes=1 << 20, max_age=3600)
    assert len(again) == 10
    assert again.trim() == 10 and len(again) == 0 and again.pending_bytes == 0
    again.append(_lines(2))
    assert again.peek(10) == _lines(2)


# -- a spool is replayed as this user's own: private directories, its own run's records ------

def _planted(directory, run_id="victim"):
    """An attacker's segment: a checkpoint for ``run_id`` waiting to be replayed."""
    directory.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"kind": "checkpoint", "run_id": run_id, "rank": 0, "step": 1,
                       "time": 1.0, "path": "/evil/payload.pt"})
    (directory / "000000000001.ndjson").write_text(line + "\n")


def _close_and_sent(mon, receiver):
    mon.log_step(1, loss=1.0)
    assert mon.close(timeout=10)
    return [r for r in receiver.records if r.get("path") == "/evil/payload.pt"]


@pytest.mark.parametrize("how", ["symlink", "other-user", "shared-base"])
def test_a_spool_someone_else_could_have_written_is_never_replayed(receiver, tmp_path, how,
                                                                   caplog):
    base = tmp_path / "spool"
    base.mkdir(mode=0o700)
    mine = spool_directory(base, "victim", 0)
    if how == "symlink":  # the run's spool directory points at the attacker's
        _planted(tmp_path / "attacker")
        mine.symlink_to(tmp_path / "attacker")
    elif how == "other-user":
        if os.geteuid() != 0:
            pytest.skip("making a directory another user's needs root")
        _planted(mine)
        for path in (mine, *mine.iterdir()):
            os.chown(path, 4242, 4242)
    else:  # a base anyone may write to (no sticky bit): anyone could have made the run's
        _planted(mine)
        base.chmod(0o777)
    mon = Monitor(url=receiver.url, run_id="victim",
                  settings=MonitorSettings(spool_dir=base, install_hooks=False, linger=0.01))
    assert _close_and_sent(mon, receiver) == []
    assert "not used" in caplog.text
    assert [r["step"] for r in receiver.of_kind("step")] == [1]  # the run itself is monitored
    assert (tmp_path / ("attacker" if how == "symlink" else mine)).exists()  # left alone


def test_a_replay_sends_only_its_own_runs_and_ranks_records(receiver, tmp_path, caplog):
    base = tmp_path / "spool"
    mine = spool_directory(base, "victim", 0)
    _planted(mine, run_id="someone-else")
    with open(mine / "000000000001.ndjson", "a") as fh:
        fh.write(json.dumps({"kind": "step", "run_id": "victim", "rank": 3, "step": 7,
                             "time": 1.0}) + "\n")
        fh.write("not json\n")
        fh.write(json.dumps({"kind": "step", "run_id": "victim", "rank": 0, "step": 8,
                             "time": 1.0}) + "\n")  # its own, left by its last process
    mon = Monitor(url=receiver.url, run_id="victim",
                  settings=MonitorSettings(spool_dir=base, install_hooks=False, linger=0.01))
    assert _close_and_sent(mon, receiver) == []
    assert [(r["rank"], r["step"]) for r in receiver.of_kind("step")] == [(0, 8), (0, 1)]
    assert "held 3 records of another run or rank" in caplog.text
    assert mon.counters().dropped == 3 and mon.counters().pending == 0


def test_spool_directories_and_segments_are_made_private(stopped_receiver, tmp_path):
    base = tmp_path / "fresh" / "spool"
    mon = Monitor(url=stopped_receiver.url, run_id="private",
                  settings=MonitorSettings(spool_dir=base, install_hooks=False, linger=0.01,
                                           close_timeout=0.5))
    mon.log_step(1, loss=1.0)
    mon.close(timeout=0.5)  # nobody listens: it stays spooled
    run_dir = spool_directory(base, "private", 0)
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    segments = list(run_dir.iterdir())
    assert segments and all(stat.S_IMODE(s.stat().st_mode) == 0o600 for s in segments)
