import threading
import time

from monitor_client._sender import Sender
from monitor_client._spool import Spool
from monitor_client._transport import HttpTransport
from tests.eventually import eventually


def _step(i, run="r1"):
    return {"kind": "step", "run_id": run, "step": i, "time": 1.0 + i, "loss": 1.0}


def _sender(url, tmp_path, **kw):
    kw.setdefault("linger", 0.02)
    kw.setdefault("backoff", (0.02, 0.1))
    token = kw.pop("token", None)
    return Sender(HttpTransport(url, token=token, timeout=(0.5, 2.0)),
                  Spool(tmp_path / "spool", max_bytes=kw.pop("spool_max", 1 << 20)), **kw)


def _steps_of(receiver):
    return [r["step"] for r in receiver.of_kind("step")]


def test_every_record_arrives_once_in_order(receiver, tmp_path):
    sender = _sender(receiver.url, tmp_path, batch_records=7)
    for i in range(100):
        sender.submit(_step(i))
    assert sender.close(timeout=10)
    assert _steps_of(receiver) == list(range(100))
    assert receiver.duplicates == 0
    c = sender.counters()
    assert (c.sent, c.pending, c.dropped, c.spooled) == (100, 0, 0, 0)


def test_sidecar_absent_then_started_delivers_everything_in_order(stopped_receiver, tmp_path):
    sender = _sender(stopped_receiver.url, tmp_path)
    for i in range(50):
        sender.submit(_step(i))
    assert sender.flush(timeout=0.5) is False  # nobody listening: nothing can be acked
    c = sender.counters()
    assert c.spooled == 50 and c.pending == 50 and c.sent == 0
    stopped_receiver.start()
    for i in range(50, 60):
        sender.submit(_step(i))
    assert sender.close(timeout=10)
    assert _steps_of(stopped_receiver) == list(range(60))


def test_sidecar_killed_mid_run_loses_nothing_and_keeps_order(receiver, tmp_path):
    sender = _sender(receiver.url, tmp_path, batch_records=5)

    def produce():
        for i in range(300):
            sender.submit(_step(i))
            time.sleep(0.002)  # a training loop's pace: records keep coming through the outage

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(0.15)  # some records delivered before the sidecar goes away
    receiver.stop()
    time.sleep(0.3)  # and some submitted while it is away
    receiver.start()
    producer.join()
    assert sender.close(timeout=10)
    steps = _steps_of(receiver)
    assert steps == list(range(300))
    assert sender.counters().spooled > 0


def test_503_is_retried_from_the_spool(receiver, tmp_path):
    receiver.fail_status = 503
    sender = _sender(receiver.url, tmp_path)
    for i in range(10):
        sender.submit(_step(i))
    assert not sender.flush(timeout=0.3)
    receiver.fail_status = None
    assert sender.close(timeout=10)
    assert _steps_of(receiver) == list(range(10))


def test_413_splits_the_batch(receiver, tmp_path):
    receiver.max_body = 400  # gzip'd bytes: a few records per request at most
    sender = _sender(receiver.url, tmp_path, batch_records=200)
    big = [dict(_step(i), note=f"x{i * 7919}" * 20) for i in range(40)]
    for rec in big:
        sender.submit(rec)
    assert sender.close(timeout=10)
    assert _steps_of(receiver) == list(range(40))
    assert receiver.posts > 2


def test_rejected_records_are_counted_not_retried(receiver, tmp_path, caplog):
    sender = _sender(receiver.url, tmp_path)
    sender.submit(_step(0))
    sender.submit({"kind": "step", "run_id": "bad id with spaces", "step": 1, "time": 0.0})
    assert sender.close(timeout=10)
    c = sender.counters()
    assert (c.sent, c.rejected, c.pending) == (1, 1, 0)
    assert "rejected" in caplog.text


def test_token_is_sent_as_bearer(receiver, tmp_path):
    receiver.token = "s3cret"
    sender = _sender(receiver.url, tmp_path, token="s3cret")
    sender.submit(_step(0))
    assert sender.close(timeout=10)
    assert _steps_of(receiver) == [0]
    assert "s3cret" not in repr(sender.transport)


def test_full_queue_spills_to_spool_without_blocking(stopped_receiver, tmp_path):
    sender = _sender(stopped_receiver.url, tmp_path, max_queue=1)
    # Nobody listens, so a submit that waited for room would wait for good: the submits
    # returning at all is the point (bench/client_overhead.py times log_step's enqueue).
    producer = threading.Thread(target=lambda: [sender.submit(_step(i)) for i in range(200)],
                                daemon=True)
    producer.start()
    eventually(lambda: not producer.is_alive(), what="200 submits past a full queue returned")
    assert sender.counters().pending == 200
    stopped_receiver.start()
    assert sender.close(timeout=10)
    assert sorted(_steps_of(stopped_receiver)) == list(range(200))


def test_records_past_a_full_queue_wait_behind_it_in_order(stopped_receiver, tmp_path):
    sender = _sender(stopped_receiver.url, tmp_path, max_queue=50)
    for i in range(95):  # 50 queued, 45 in the overflow behind the queue
        sender.submit(_step(i))
    stopped_receiver.start()
    assert sender.close(timeout=10)
    assert _steps_of(stopped_receiver) == list(range(95))  # none overtook: none is late


def test_leftover_spool_is_replayed_by_the_next_sender(stopped_receiver, tmp_path):
    first = _sender(stopped_receiver.url, tmp_path)
    for i in range(5):
        first.submit(_step(i))
    assert first.close(timeout=0.2) is False
    stopped_receiver.start()
    second = _sender(stopped_receiver.url, tmp_path)
    second.submit(_step(5))
    assert second.close(timeout=10)
    assert _steps_of(stopped_receiver) == list(range(6))
    assert second.counters().pending == 0 and second.counters().sent == 6


def test_spool_bound_drops_steps_and_counts_them(stopped_receiver, tmp_path):
    sender = _sender(stopped_receiver.url, tmp_path, spool_max=2000)
    for i in range(200):
        sender.submit(_step(i))
    sender.flush(timeout=0.3)
    c = sender.counters()
    assert c.dropped > 0 and sender.spool.pending_bytes <= 2000
    stopped_receiver.start()
    sender.close(timeout=10)
    c = sender.counters()
    assert c.sent + c.dropped == 200 and c.pending == 0


def test_a_stuck_process_asks_for_its_actions_every_second_not_every_five(receiver, tmp_path):
    """A rank whose watchdog reported it stuck sends nothing whose answer could carry the
    restart that frees it: it polls every HURRIED_POLL s; otherwise every poll_interval.
    On a frozen clock 1.5 s past the last poll."""
    from monitor_client._sender import HURRIED_POLL

    clock = [1000.0]
    polls: list[float] = []
    stuck = [False]
    sender = _sender(receiver.url, tmp_path, now=lambda: clock[0],
                     poll=lambda: polls.append(clock[0]), poll_interval=5.0,
                     hurry=lambda: stuck[0])
    try:
        clock[0] += HURRIED_POLL + 0.5
        sender._maybe_poll()  # what its thread does each iteration
        assert polls == []  # healthy: not before poll_interval
        stuck[0] = True
        eventually(lambda: polls == [clock[0]], timeout=10, what="the hurried poll")
        stuck[0] = False  # it stepped again: back to the plain interval
        clock[0] += HURRIED_POLL + 0.5
        sender._maybe_poll()
        assert polls == [clock[0] - HURRIED_POLL - 0.5]
    finally:
        sender.close(timeout=5)
