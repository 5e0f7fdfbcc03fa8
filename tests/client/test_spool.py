import os
import time

from monitor_client._spool import Spool


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
