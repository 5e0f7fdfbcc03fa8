"""The outbox against real local receivers: retries, Retry-After, 400s, timeouts, order,
rate limits, limits and durability, on an injected clock; and the delivery guarantees (no
head-of-line blocking, a deadline per attempt, nothing pending past max_age) end to end,
through a real sidecar."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from monitor_agent.alerting.db import open_alert_db
from monitor_agent.metrics.delivery import DeliveryMetrics
from monitor_agent.notify.base import Notifier
from monitor_agent.notify.channel_settings import OutboxSettings
from monitor_agent.notify.console import ConsoleNotifier
from monitor_agent.notify.outbox import Outbox
from monitor_agent.notify.pagerduty import PagerDutyNotifier
from monitor_agent.notify.redact import SecretRedactor
from monitor_agent.notify.slack import SlackNotifier
from monitor_agent.settings import load_settings
from tests.eventually import eventually, scaled
from tests.live_server import LiveServer
from tests.notify.sample_events import T0, event, note
from tests.receivers import Receiver, Reply

KEY = "0123456789abcdef0123456789abcdef"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pd() -> Iterator[Receiver]:
    with Receiver("pagerduty") as r:
        yield r


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client() as c:
        yield c


def make(tmp: Path, notifier, clock: Clock, **limits) -> tuple[Outbox, DeliveryMetrics]:
    metrics = DeliveryMetrics(CollectorRegistry(), [notifier.name])
    settings = OutboxSettings(backoff_base_seconds=1, backoff_cap_seconds=8, **limits)
    return Outbox(open_alert_db(tmp / "a.sqlite"), {notifier.name: notifier}, settings, metrics,
                  clock, rand=lambda: 0.5), metrics


def put(outbox: Outbox, channel: str, *events) -> None:
    with outbox.db.tx() as conn:
        for e in events:
            outbox.enqueue(conn, channel, note(e), outbox.clock())


def count(metrics: DeliveryMetrics, channel: str, outcome: str) -> float:
    return metrics.notifications.labels(channel=channel, outcome=outcome)._value.get()


def test_429_retry_after_is_honoured(tmp_path, pd, client):
    clock = Clock()
    outbox, metrics = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock)
    pd.script(Reply(429, {"status": "throttle"}, retry_after=7))
    put(outbox, "pagerduty", event())
    assert outbox.deliver_next("pagerduty", client) == 0.0
    assert outbox.deliver_next("pagerduty", client) == pytest.approx(7.0)
    clock.now += 7
    assert outbox.deliver_next("pagerduty", client) == 0.0
    assert [r.status for r in pd.requests] == [429, 202]
    assert (count(metrics, "pagerduty", "retried"), count(metrics, "pagerduty", "sent")) == (1, 1)
    assert outbox.deliver_next("pagerduty", client) is None and outbox.pending == 0


def test_5xx_backs_off_exponentially_with_jitter(tmp_path, pd, client):
    clock = Clock()
    outbox, _ = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock)
    pd.script(Reply(500), Reply(502), Reply(503))
    put(outbox, "pagerduty", event())
    waits = []
    for _ in range(3):
        outbox.deliver_next("pagerduty", client)
        waits.append(outbox.deliver_next("pagerduty", client))
        clock.now += waits[-1]
    assert waits == pytest.approx([0.75, 1.5, 3.0])  # base 1 s, doubled, x0.75 jitter
    outbox.deliver_next("pagerduty", client)
    assert [r.status for r in pd.requests] == [500, 502, 503, 202]


def test_invalid_event_400_is_not_retried(tmp_path, pd, client, caplog):
    outbox, metrics = make(tmp_path, PagerDutyNotifier("", pd.url), Clock())  # blank key
    put(outbox, "pagerduty", event())
    outbox.deliver_next("pagerduty", client)
    assert outbox.deliver_next("pagerduty", client) is None
    assert [r.status for r in pd.requests] == [400]
    assert count(metrics, "pagerduty", "failed") == 1
    [row] = outbox.db.query("SELECT state, last_error FROM outbox")
    assert row["state"] == "failed" and "routing_key" in row["last_error"]
    # A lost page is loud: one ERROR line with the channel, the row, the reason, the error.
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f"pagerduty notification 1 NOT DELIVERED (http_400): {row['last_error']}"]


def test_a_notifier_that_raises_fails_its_page_as_an_internal_error_and_says_so(
        tmp_path, client, caplog):
    """A channel whose URL httpx cannot even parse raises inside the notifier: the page
    ends failed (an internal error, named by type), the sender lives on, and the log says
    which channel failed on which run, with the traceback."""
    outbox, metrics = make(tmp_path, PagerDutyNotifier(KEY, "http://[::1"), Clock())
    put(outbox, "pagerduty", event())
    assert outbox.deliver_next("pagerduty", client) == 0.0
    [row] = outbox.db.query("SELECT state, last_error FROM outbox")
    assert (row["state"], row["last_error"]) == ("failed", "internal error: InvalidURL")
    reason = metrics.undelivered.labels(channel="pagerduty", reason="internal_error")
    assert reason._value.get() == 1
    [failed] = [r for r in caplog.records if r.getMessage() == "pagerduty notifier failed on gpt-7"]
    assert failed.levelname == "ERROR" and failed.exc_info is not None
    [attempts] = [s for s in metrics.duration.collect()[0].samples
                  if s.name.endswith("_count") and s.labels == {"channel": "pagerduty"}]
    assert attempts.value == 1
    [took] = [s for s in metrics.duration.collect()[0].samples
              if s.name.endswith("_sum") and s.labels == {"channel": "pagerduty"}]
    assert 0.0 <= took.value < 60.0  # the attempt's own seconds, not a clock reading


def test_prune_forgets_only_what_ended_before_the_cutoff(tmp_path, pd, client):
    """What went out (or failed) before the cutoff is forgotten; what ended after it, and
    what is still pending however old, stays and shows on GET /v1/alerts."""
    clock = Clock()
    outbox, _ = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock)
    put(outbox, "pagerduty", event(fingerprint="early"))
    outbox.deliver_next("pagerduty", client)
    clock.now += 100
    put(outbox, "pagerduty", event(fingerprint="late"))
    outbox.deliver_next("pagerduty", client)
    clock.now += 1  # the Receiver's pace
    put(outbox, "pagerduty", event(fingerprint="waiting"))
    outbox.prune(T0 + 50)
    states = outbox.delivery_states()
    assert sorted(states) == ["late", "waiting"]
    assert states["late"]["pagerduty"]["state"] == "sent"
    assert states["waiting"]["pagerduty"]["state"] == "pending" and outbox.pending == 1


def test_timeouts_and_refused_connections_are_retried(tmp_path, pd, client):
    clock = Clock()
    outbox, metrics = make(tmp_path, PagerDutyNotifier(KEY, pd.url, timeout=0.2), clock)
    pd.script(Reply(202, {}, delay=2.0))
    put(outbox, "pagerduty", event())
    outbox.deliver_next("pagerduty", client)
    row = outbox.db.query("SELECT attempts, last_error FROM outbox")[0]
    assert (row["attempts"], row["last_error"]) == (1, "timeout (ReadTimeout)")
    outbox.notifiers["pagerduty"] = PagerDutyNotifier(KEY, "http://127.0.0.1:9", timeout=0.5)
    clock.now += 60
    outbox.deliver_next("pagerduty", client)
    assert "transport error" in outbox.db.query("SELECT last_error FROM outbox")[0][0]
    assert count(metrics, "pagerduty", "retried") == 2


def test_gives_up_after_max_attempts_and_max_age(tmp_path, pd, client):
    clock = Clock()
    outbox, metrics = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock, max_attempts=2,
                           max_age_seconds=100)
    pd.script(Reply(500), Reply(500))
    put(outbox, "pagerduty", event(fingerprint="a"))
    outbox.deliver_next("pagerduty", client)
    clock.now += 10
    outbox.deliver_next("pagerduty", client)
    assert count(metrics, "pagerduty", "failed") == 1
    put(outbox, "pagerduty", event(fingerprint="b"))
    clock.now += 101
    outbox.deliver_next("pagerduty", client)
    assert count(metrics, "pagerduty", "failed") == 2 and len(pd.requests) == 2


def test_a_page_exactly_max_age_old_is_still_tried_and_one_older_ends_failed_then_pruned(
        tmp_path, pd, client):
    """max_age is the oldest a page may be and still go out; past it the page ends failed,
    saying how often it was tried, at that moment (so pruning forgets it in its turn)."""
    clock = Clock()
    outbox, _ = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock, max_age_seconds=100)
    pd.script(Reply(500), Reply(500), Reply(500))
    put(outbox, "pagerduty", event())
    outbox.deliver_next("pagerduty", client)
    clock.now = T0 + 10
    outbox.deliver_next("pagerduty", client)
    clock.now = T0 + 100
    outbox.deliver_next("pagerduty", client)
    assert len(pd.requests) == 3 and outbox.pending == 1
    clock.now = T0 + 100.5
    assert outbox.deliver_next("pagerduty", client) is None
    state = outbox.delivery_states()["abc123"]["pagerduty"]
    assert state == {"state": "failed", "attempts": 3, "done_at": T0 + 100.5,
                     "last_error": "expired before delivery (3 attempts)"}
    outbox.prune(T0 + 101)
    assert outbox.delivery_states() == {}


def test_a_page_out_of_attempts_ends_failed_then_counted_by_its_reason_with_the_secret_masked(
        tmp_path, pd, client, caplog):
    """A receiver that echoes the routing key in its errors: each error is stored and
    logged with the key masked; out of attempts, the page ends failed at that moment,
    counted as ``max_attempts``."""
    caplog.set_level(logging.INFO, logger="monitor_agent.notify.outbox")
    clock = Clock()
    metrics = DeliveryMetrics(CollectorRegistry(), ["pagerduty"])
    outbox = Outbox(open_alert_db(tmp_path / "a.sqlite"),
                    {"pagerduty": PagerDutyNotifier(KEY, pd.url)},
                    OutboxSettings(backoff_base_seconds=1, max_attempts=2), metrics, clock,
                    rand=lambda: 0.5, redact=SecretRedactor([KEY]).redact)
    pd.script(*[Reply(500, {"status": "unavailable", "message": f"no key {KEY}"})] * 2)
    put(outbox, "pagerduty", event())
    outbox.deliver_next("pagerduty", client)
    clock.now += 10
    outbox.deliver_next("pagerduty", client)
    state = outbox.delivery_states()["abc123"]["pagerduty"]
    assert (state["state"], state["attempts"], state["done_at"]) == ("failed", 1, T0 + 10)
    assert KEY not in str(state["last_error"]) and "no key" in str(state["last_error"])
    assert not any(KEY in r.getMessage() for r in caplog.records)
    reason = metrics.undelivered.labels(channel="pagerduty", reason="max_attempts")
    assert reason._value.get() == 1
    [retry] = [r.getMessage() for r in caplog.records if r.levelname == "INFO"
               and r.name == "monitor_agent.notify.outbox"]
    assert retry == f"pagerduty delivery failed ({state['last_error']}); retry 1 in 0.8s"


def test_throttling_spends_no_attempt_only_max_age_ends_it(tmp_path, pd, client):
    clock = Clock()
    outbox, metrics = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock, max_attempts=2,
                           max_age_seconds=1000)
    pd.script(*[Reply(429, {"status": "throttled"}, retry_after=5)] * 20)
    put(outbox, "pagerduty", event())
    while (wait := outbox.deliver_next("pagerduty", client)) is not None:
        clock.now += wait
    assert [r.status for r in pd.requests] == [429] * 20 + [202]  # 20 throttles, delivered
    assert count(metrics, "pagerduty", "sent") == 1 and count(metrics, "pagerduty", "failed") == 0
    pd.script(*[Reply(429, {"status": "throttled"}, retry_after=400)] * 5)
    put(outbox, "pagerduty", event(fingerprint="late"))
    while (wait := outbox.deliver_next("pagerduty", client)) is not None:
        clock.now += wait
    assert count(metrics, "pagerduty", "failed") == 1  # max_age, not attempts, ended it


def test_a_resolve_never_overtakes_its_trigger(tmp_path, pd, client):
    clock = Clock()
    outbox, _ = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock)
    pd.script(Reply(500))
    put(outbox, "pagerduty", event(), event("resolved"))
    while (wait := outbox.deliver_next("pagerduty", client)) is not None:
        clock.now += wait
    assert [r.json["event_action"] for r in pd.requests] == ["trigger", "trigger", "resolve"]


def test_rows_an_older_version_queued_without_their_run_share_one_turn(tmp_path, pd, client):
    """Two messages of an older version (no run on their rows) and one of run b: once one
    runless message went out, run b (never served) goes before the other."""
    outbox, _ = make(tmp_path, PagerDutyNotifier(KEY, pd.url), Clock())
    put(outbox, "pagerduty", event(fingerprint="x"), event(fingerprint="y"),
        event(fingerprint="z", run_id="b"))
    outbox.db.execute("UPDATE outbox SET run_id = NULL WHERE id IN (1, 2)")
    while outbox.deliver_next("pagerduty", client) is not None:
        pass
    assert [r.json["dedup_key"] for r in pd.requests] == [
        "monitor-agent-x", "monitor-agent-z", "monitor-agent-y"]


def test_an_attempt_cut_off_at_its_deadline_is_a_failed_one_saying_so_and_retried(
        tmp_path, pd, client):
    clock = Clock()
    outbox, metrics = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock,
                           attempt_timeout_seconds=0.3)
    pd.script(Reply(202, {"status": "success"}, trickle=1.0))
    put(outbox, "pagerduty", event())
    outbox.deliver_next("pagerduty", client)
    state = outbox.delivery_states()["abc123"]["pagerduty"]
    assert (state["state"], state["attempts"], state["last_error"]) == (
        "pending", 1, "no complete answer within attempt_timeout_seconds=0.3")
    assert metrics.deadline_exceeded.labels(channel="pagerduty")._value.get() == 1
    clock.now += outbox.deliver_next("pagerduty", client) or 0.0
    outbox.deliver_next("pagerduty", client)
    assert outbox.delivery_states()["abc123"]["pagerduty"]["state"] == "sent"


def test_slack_is_rate_limited_per_webhook(tmp_path, client):
    with Receiver("slack") as slack:
        clock = Clock()
        outbox, _ = make(tmp_path, SlackNotifier(slack.url, min_interval=1.0), clock)
        put(outbox, "slack", event(), event("resolved"))
        assert outbox.deliver_next("slack", client) == 0.0
        assert outbox.deliver_next("slack", client) == pytest.approx(1.0)
        assert len(slack.requests) == 1
        clock.now += 1.0
        outbox.deliver_next("slack", client)
        assert len(slack.requests) == 2


def test_the_oldest_pending_gauge_is_the_age_of_the_channel_s_oldest_message(tmp_path, pd,
                                                                              client):
    """A page stuck for 30 s shows its age (long before max_age ends it); an empty queue
    shows 0."""
    clock = Clock()
    outbox, metrics = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock)
    pd.script(Reply(500))
    put(outbox, "pagerduty", event())
    clock.now += 30
    gauge = metrics.oldest_pending.labels(channel="pagerduty")
    outbox.deliver_next("pagerduty", client)  # the 500
    assert gauge._value.get() == 30.0
    clock.now += 10
    outbox.deliver_next("pagerduty", client)  # sent
    assert gauge._value.get() == 40.0
    assert outbox.deliver_next("pagerduty", client) is None
    assert gauge._value.get() == 0.0


def test_a_full_outbox_drops_and_counts(tmp_path, pd):
    outbox, metrics = make(tmp_path, PagerDutyNotifier(KEY, pd.url), Clock(), max_pending=2)
    put(outbox, "pagerduty", event(), event(), event())
    assert outbox.pending == 2 and count(metrics, "pagerduty", "dropped") == 1


def test_queued_notifications_survive_a_restart(tmp_path, pd, client):
    outbox, _ = make(tmp_path, PagerDutyNotifier(KEY, pd.url), Clock())
    put(outbox, "pagerduty", event())
    outbox.db.close()
    again, metrics = make(tmp_path, PagerDutyNotifier(KEY, pd.url), Clock())
    assert again.pending == 1 and metrics.pending._value.get() == 1
    again.start()
    pd.wait_for(1, accepted_only=True)
    again.stop()
    assert again.pending == 0


def test_sender_threads_deliver_promptly_and_stop_cleanly(tmp_path, pd):
    outbox, _ = make(tmp_path, PagerDutyNotifier(KEY, pd.url), Clock())
    outbox.start()
    put(outbox, "pagerduty", event(fingerprint="x"), event(fingerprint="y"))
    got = pd.wait_for(2, accepted_only=True)
    threads = list(outbox._threads)
    outbox.stop(timeout=5)
    assert [r.json["dedup_key"] for r in got] == ["monitor-agent-x", "monitor-agent-y"]
    assert threads and all(not t.is_alive() for t in threads)


class _Unopenable(httpx.BaseTransport):
    """A transport that cannot be opened: the sender thread that holds it dies at once."""

    def __enter__(self) -> _Unopenable:
        raise OSError("no sockets left")

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raise AssertionError("never opened")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_sender_thread_that_died_is_a_problem_naming_its_channel_until_stopped(tmp_path):
    """/readyz's line names each channel whose sender stopped; stopping them on purpose is
    no problem. The senders are daemon threads: one stuck in a send never holds the
    process open at its exit."""
    notifiers: dict[str, Notifier] = {
        "console": ConsoleNotifier(logging.Logger("alerts")),
        "pagerduty": PagerDutyNotifier(KEY, "http://127.0.0.1:9")}
    outbox = Outbox(open_alert_db(tmp_path / "a.sqlite"), notifiers, OutboxSettings(),
                    DeliveryMetrics(CollectorRegistry(), list(notifiers)), Clock(),
                    transport=_Unopenable())
    assert outbox.problem() is None
    outbox.start()
    assert all(t.daemon for t in outbox._threads)
    eventually(lambda: outbox.problem() == "delivery: sender threads stopped: notify-console, "
               "notify-pagerduty", what="both senders named")
    outbox.stop()
    assert outbox.problem() is None


def test_the_senders_send_through_the_transport_they_were_given(tmp_path):
    requests: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(202, json={"status": "success"})

    notifier = PagerDutyNotifier(KEY, "http://pagerduty.invalid/v2/enqueue")
    outbox = Outbox(open_alert_db(tmp_path / "a.sqlite"), {"pagerduty": notifier},
                    OutboxSettings(), DeliveryMetrics(CollectorRegistry(), ["pagerduty"]),
                    Clock(), transport=httpx.MockTransport(answer))
    outbox.start()
    try:
        put(outbox, "pagerduty", event())
        eventually(lambda: outbox.pending == 0, what="the page sent")
    finally:
        outbox.stop()
    assert [str(r.url) for r in requests] == ["http://pagerduty.invalid/v2/enqueue"]


def test_a_storage_failure_under_a_sender_is_logged_and_the_sender_goes_on(tmp_path, pd,
                                                                           caplog):
    outbox, _ = make(tmp_path, PagerDutyNotifier(KEY, pd.url), Clock())
    outbox.start()
    try:
        outbox.db.execute("DROP TABLE outbox")
        failed = eventually(lambda: [r for r in caplog.records
                                     if r.getMessage() == "pagerduty sender error"],
                            what="the sender's error logged")
        assert failed[0].levelname == "ERROR" and failed[0].exc_info is not None
        assert "no such table: outbox" in str(failed[0].exc_info[1])
        assert outbox.problem() is None  # still running: the next look may succeed
    finally:
        outbox.stop()


class _Looks(Clock):
    """A clock that counts how often the outbox reads it: once per look at the queue."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.now


def test_an_idle_sender_or_one_whose_page_is_in_backoff_waits_rather_than_spinning(
        tmp_path, pd):
    """With nothing queued, a sender looks at the queue once and waits (a second at most,
    or until an enqueue wakes it); with a page in its 0.75 s backoff (the clock stands
    still here), it waits for it, looking again only then."""
    looks = _Looks()
    outbox, _ = make(tmp_path, PagerDutyNotifier(KEY, pd.url), looks)
    pd.script(Reply(500))
    outbox.start()
    try:
        eventually(lambda: looks.calls >= 1, what="the first look")
        threading.Event().wait(0.3)
        assert looks.calls <= 3
        put(outbox, "pagerduty", event())
        pd.wait_for(1)
        eventually(lambda: outbox.db.query("SELECT attempts FROM outbox")[0][0] == 1,
                   what="the failure recorded")
        before = looks.calls
        threading.Event().wait(0.3)
        assert looks.calls - before <= 2
    finally:
        outbox.stop()


def test_stop_waits_for_a_send_in_flight_up_to_its_timeout(tmp_path):
    """A sender in the middle of a send finishes it before stop() returns; one whose
    receiver keeps it past the timeout is left behind (a daemon) and stop() returns."""
    arrived, release = threading.Event(), threading.Event()
    hold = [0.5, 10.0]  # how long the receiver keeps each request before answering

    def answer(request: httpx.Request) -> httpx.Response:
        arrived.set()
        release.wait(hold.pop(0))
        return httpx.Response(202, json={"status": "success"})

    outbox = Outbox(open_alert_db(tmp_path / "a.sqlite"),
                    {"pagerduty": PagerDutyNotifier(KEY, "http://pagerduty.invalid")},
                    OutboxSettings(), DeliveryMetrics(CollectorRegistry(), ["pagerduty"]),
                    Clock(), transport=httpx.MockTransport(answer))
    for fingerprint in ("one", "two"):
        arrived.clear()
        outbox.start()
        put(outbox, "pagerduty", event(fingerprint=fingerprint))
        assert arrived.wait(scaled(10))  # the send is in flight
        threads = list(outbox._threads)
        if fingerprint == "one":
            outbox.stop(timeout=30)
            assert not any(t.is_alive() for t in threads) and outbox.pending == 0
        else:
            outbox.stop(timeout=0.1)
            assert all(t.is_alive() for t in threads) and outbox.pending == 1
            release.set()
            for t in threads:
                t.join(scaled(10))


# -- the guarantees, through a real sidecar ---------------------------------------------

NAN_RULES = """
routes: {page: [pagerduty]}
rules:
  - name: NaNLoss
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: []
"""


def _sidecar(tmp: Path, pd: Receiver, **outbox) -> LiveServer:
    rules = tmp / "rules.yaml"
    rules.write_text(NAN_RULES)
    return LiveServer(load_settings(data_dir=tmp / "data", alerting={
        "rules_file": rules, "group_wait_seconds": 0.05, "outbox": outbox,
        "pagerduty": {"routing_key": KEY, "url": pd.url + "/v2/enqueue"}}))


def _nan(srv: LiveServer, run_id: str) -> None:
    records = [{"kind": "step", "run_id": run_id, "step": 1, "time": 1000.0, "loss": "NaN"}]
    assert httpx.post(srv.url + "/v1/records", json={"records": records}).status_code == 200


def _delivery(srv: LiveServer, run_id: str) -> dict:
    [alert] = httpx.get(srv.url + "/v1/alerts", params={"run_id": run_id}).json()["alerts"]
    return alert["delivery"].get("pagerduty", {})


def _metric(srv: LiveServer, line_start: str) -> float:
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {line_start} in /metrics")


def test_a_page_that_fails_does_not_hold_back_another_runs_page(tmp_path, pd):
    """Run a's page gets a 500 and a 10-minute backoff; run b's page, queued behind it on
    the same channel, goes out at once, and a's is still pending with its error."""
    pd.script(Reply(500, {"status": "unavailable"}))
    with _sidecar(tmp_path, pd, backoff_base_seconds=600, backoff_cap_seconds=600) as srv:
        _nan(srv, "a")
        pd.wait_for(1)
        _nan(srv, "b")
        [page] = pd.wait_for(1, timeout=20, accepted_only=True)
        assert page.json["payload"]["custom_details"]["run_id"] == "b"
        a = _delivery(srv, "a")
        assert (a["state"], a["attempts"]) == ("pending", 1) and "HTTP 500" in a["last_error"]
        eventually(lambda: _delivery(srv, "b").get("state") == "sent", timeout=20, what="b sent")


def test_a_trickling_receiver_costs_one_bounded_attempt_then_the_page_goes_out(tmp_path, pd):
    """Every read is short (one byte a second, the read timeout is 5 s), the answer never
    ends: the attempt is cut off at its deadline, counted, and the retry delivers."""
    pd.script(Reply(202, {"status": "success"}, trickle=1.0))
    with _sidecar(tmp_path, pd, attempt_timeout_seconds=0.5, backoff_base_seconds=0.1) as srv:
        _nan(srv, "t")
        eventually(lambda: _delivery(srv, "t").get("state") == "sent", timeout=20, what="t sent")
        assert _delivery(srv, "t")["attempts"] == 1
        deadline = 'monitor_agent_notification_deadline_exceeded_total{channel="pagerduty"}'
        assert _metric(srv, deadline) == 1


def test_a_page_past_max_age_ends_failed_not_pending(tmp_path, pd):
    """A receiver that never finishes an answer: the page ends failed (expired) after its
    attempts, shown on GET /v1/alerts and counted, rather than pending with 0 attempts."""
    pd.script(*[Reply(202, {"status": "success"}, trickle=1.0)] * 50)
    with _sidecar(tmp_path, pd, attempt_timeout_seconds=0.3, backoff_base_seconds=0.1,
                  max_age_seconds=1.0) as srv:
        _nan(srv, "m")
        eventually(lambda: _delivery(srv, "m").get("state") == "failed", timeout=20,
                   what="m failed")
        failed = _delivery(srv, "m")
        assert failed["attempts"] >= 1 and "expired" in failed["last_error"]
        expired = 'monitor_agent_notifications_undelivered_total{channel="pagerduty",reason="expired"}'
        assert _metric(srv, expired) == 1


def test_a_page_that_finds_the_outbox_full_shows_failed_with_the_reason(tmp_path, pd):
    """max_pending is reached by a page its receiver refuses for now: the next page is not
    queued, and its alert says so (``failed``, outbox full) instead of ``delivery: {}``."""
    pd.script(Reply(500, {"status": "unavailable"}))
    with _sidecar(tmp_path, pd, max_pending=1, backoff_base_seconds=600,
                  backoff_cap_seconds=600) as srv:
        _nan(srv, "a")
        pd.wait_for(1)
        _nan(srv, "b")
        full = eventually(lambda: _delivery(srv, "b"), timeout=20, what="b's delivery state")
        assert (full["state"], full["attempts"]) == ("failed", 0)
        assert "outbox full" in full["last_error"] and "max_pending=1" in full["last_error"]
        dropped = 'monitor_agent_notifications_undelivered_total{channel="pagerduty",reason="outbox_full"}'
        assert _metric(srv, dropped) == 1
        assert _delivery(srv, "a")["state"] == "pending"
