"""Permanent mistakes are said once and stop the sender; outages are retried; the spool and
``close()`` stay bounded; a NaN step is previewed ahead of a backlog and itself delivered in
order. Against a real sidecar process and the loopback receiver scripted to answer each
status."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from monitor_client import Monitor, MonitorSettings
from monitor_client._sender import Sender
from monitor_client._spool import Spool
from monitor_client._transport import HttpTransport, PostOutcome, classify, url_problem
from tests.eventually import eventually


def _step(i, loss=1.0, run="r1"):
    return {"kind": "step", "run_id": run, "step": i, "time": 1.0 + i, "loss": loss}


def _sender(url, tmp_path, token=None, **kw):
    kw.setdefault("linger", 0.02)
    kw.setdefault("backoff", (0.02, 0.1))
    return Sender(HttpTransport(url, token=token, timeout=(0.5, 2.0)),
                  Spool(tmp_path / "spool", max_bytes=kw.pop("spool_max", 1 << 20)), **kw)


def _errors(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "monitor_client" and r.levelno >= logging.ERROR]


@pytest.mark.parametrize("status", [401, 403, 404, 405, 421])
def test_permanent_answers_are_said_once_and_nothing_piles_up(receiver, tmp_path, caplog,
                                                              status):
    receiver.fail_status = status
    sender = _sender(receiver.url, tmp_path)
    for i in range(20):
        sender.submit(_step(i))
        time.sleep(0.005)  # spread over several posts, each refused
    assert sender.close(timeout=5) is False
    [error] = _errors(caplog)
    assert f"{receiver.url}/v1/records" in error and str(status) in error and "Fix:" in error
    assert "retrying" not in caplog.text
    c = sender.counters()
    assert c.dropped == 20 and c.pending == 0 and c.spooled == 0
    assert receiver.posts == 1  # asked once, then stopped
    assert len(Spool(tmp_path / "spool")) == 0


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_transient_answers_are_retried_until_delivered(receiver, tmp_path, status):
    receiver.fail_status = status
    sender = _sender(receiver.url, tmp_path)
    for i in range(5):
        sender.submit(_step(i))
    assert not sender.flush(timeout=0.3)
    assert sender.misconfigured is None and sender.counters().spooled == 5
    receiver.fail_status = None
    assert sender.close(timeout=10)
    assert [r["step"] for r in receiver.of_kind("step")] == list(range(5))


@pytest.mark.parametrize("url", ["127.0.0.1:9400", "localhost:9400/x", "http://", "ftp://h/",
                                 "http://127.0.0.1:port"])
def test_a_url_that_cannot_work_is_refused_before_any_request(url, tmp_path, caplog):
    assert url_problem(url)
    sender = _sender(url, tmp_path)
    sender.submit(_step(0))
    assert sender.close(timeout=5) is False
    [error] = _errors(caplog)
    assert "MONITOR_AGENT_URL" in error and "http://127.0.0.1:9400" in error
    assert sender.counters().dropped == 1


def test_classification_of_whole_batch_answers():
    assert classify(422, b"{}").outcome is PostOutcome.BAD
    assert classify(415, b"{}").outcome is PostOutcome.BAD
    assert classify(400, b"{}").outcome is PostOutcome.BAD
    assert classify(413, b"{}").outcome is PostOutcome.TOO_LARGE
    assert classify(401, b"{}").fix.startswith("the token")
    assert classify(504, b"").outcome is PostOutcome.RETRY
    assert url_problem("http://127.0.0.1:9400") == url_problem("https://h.example/") == ""


def test_wrong_token_and_wrong_path_against_the_real_sidecar(sidecar_factory, tmp_path, caplog):
    sc = sidecar_factory(env={"MONITOR_AGENT_TOKEN": "right-token"}).start()
    for url, token, status in ((sc.url, "wrong-token", "401"), (sc.url, None, "401"),
                               (sc.url + "/api", "right-token", "404")):
        caplog.clear()
        mon = Monitor(url=url, token=token, run_id=f"mistake-{status}",
                      settings=MonitorSettings(install_hooks=False, spool_dir=tmp_path / "spool",
                                               linger=0.02))
        for step in range(1, 6):
            mon.log_step(step, loss=1.0)
        mon.close()
        [error] = _errors(caplog)
        assert status in error and url in error
        assert "token" in error if status == "401" else "without a path" in error
        assert "wrong-token" not in caplog.text and "right-token" not in caplog.text
    eventually(lambda: "401 for POST /v1/records" in sc.log(), what="the sidecar's 401 line")
    log = sc.log()
    assert log.count("401 for POST /v1/records") == 1  # rate-limited: two 401s, one line
    assert "right-token" not in log and "wrong-token" not in log


def test_https_to_the_plain_http_sidecar_is_named_a_scheme_mismatch(sidecar, tmp_path,
                                                                     caplog):
    url = sidecar.url.replace("http://", "https://")
    mon = Monitor(url=url, run_id="https-by-mistake",
                  settings=MonitorSettings(install_hooks=False, spool_dir=tmp_path / "spool",
                                           linger=0.02))
    for step in range(1, 6):
        mon.log_step(step, loss=1.0)
    mon.close()
    [error] = _errors(caplog)
    assert "plain HTTP" in error and "use http://" in error and url in error
    assert "unavailable" not in caplog.text and "retrying" not in caplog.text


class _Silent:
    """A port that accepts connections and never answers (a hung sidecar)."""

    def __enter__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns, self._stop = [], threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self):
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                continue

    def __exit__(self, *exc):
        self._stop.set()
        for c in self.conns:
            c.close()
        self.sock.close()


def test_close_is_bounded_when_nothing_answers(tmp_path, caplog):
    with _Silent() as silent:
        mon = Monitor(url=silent.url, run_id="hung",
                      settings=MonitorSettings(install_hooks=False, spool_dir=tmp_path / "spool",
                                               linger=0.02, timeout=(2.0, 3600.0),
                                               close_timeout=0.5))
        for step in range(1, 20):
            mon.log_step(step, loss=1.0)
        # The request in flight would hang for an hour: close returning at all means it
        # gave up on its own 0.5 s (bench/client_mistakes.py times it, case "hung").
        closed: list[bool] = []
        closer = threading.Thread(target=lambda: closed.append(mon.close()), daemon=True)
        closer.start()
        eventually(lambda: closed, what="close() returned against a sidecar that never answers")
    assert closed == [False]
    assert mon.counters().pending > 0  # honest: not delivered, kept in the spool
    assert "did not acknowledge" in caplog.text and "stay in the spool" in caplog.text


def test_spool_drops_the_oldest_and_says_so(stopped_receiver, tmp_path, caplog):
    sender = _sender(stopped_receiver.url, tmp_path, spool_max=2000)
    for i in range(200):
        sender.submit(_step(i))
    sender.flush(timeout=0.3)
    assert sender.spool.pending_bytes <= 2000
    assert "dropped the" in caplog.text and "oldest records" in caplog.text
    stopped_receiver.start()
    sender.close(timeout=10)
    c = sender.counters()
    assert c.sent + c.dropped == 200 and c.pending == 0 and c.dropped > 0
    steps = [r["step"] for r in stopped_receiver.of_kind("step")]
    assert steps[-1] == 199 and steps == sorted(steps)  # the newest survived, in order


def test_a_nan_step_is_previewed_ahead_of_the_backlog_and_delivered_in_order(
        stopped_receiver, tmp_path):
    sender = _sender(stopped_receiver.url, tmp_path)
    for i in range(50):
        sender.submit(_step(i))
    assert not sender.flush(timeout=0.3)
    sender.submit(_step(50, loss=float("nan")))
    sender.submit(_step(51))
    assert not sender.flush(timeout=0.3)
    assert sender.counters().spooled == 52  # the NaN step keeps its place in the spool
    stopped_receiver.start()
    assert sender.close(timeout=10)
    assert [r["step"] for r in stopped_receiver.of_kind("step")] == list(range(52))
    assert [p["step"] for p in stopped_receiver.previews] == [50]
    assert stopped_receiver.previews[0]["loss"] == "NaN"
    assert stopped_receiver.arrivals[0] == ("preview", 50)  # before any of the backlog


def test_a_nan_step_is_previewed_even_when_the_queue_is_full(stopped_receiver, tmp_path):
    sender = _sender(stopped_receiver.url, tmp_path, max_queue=5)
    for i in range(200):
        sender.submit(_step(i))
    sender.submit(_step(200, loss=float("inf")))  # the queue is full: spooled and previewed
    assert not sender.flush(timeout=0.3)
    stopped_receiver.start()
    assert sender.close(timeout=10)
    steps = [r["step"] for r in stopped_receiver.of_kind("step")]
    assert sorted(steps) == list(range(201))
    assert stopped_receiver.arrivals[0] == ("preview", 200)
    assert stopped_receiver.previews[0]["loss"] == "Infinity"


def test_a_preview_of_a_run_the_sidecar_has_not_stored_is_sent_again_after_the_run_record(
        stopped_receiver, tmp_path):
    """The sidecar answers which previews are of a run it has no record of (they began
    nothing): the client keeps them and sends them again as soon as the next records, the
    run record first among them, got through, still ahead of the NaN step's own turn."""
    stopped_receiver.unknown_runs = True
    sender = _sender(stopped_receiver.url, tmp_path, batch_records=5)
    sender.submit({"kind": "run", "run_id": "r1", "time": 0.5})
    for i in range(1, 31):
        sender.submit(_step(i, loss=float("nan") if i >= 20 else 1.0))
    assert not sender.flush(timeout=0.3)
    stopped_receiver.start()
    assert sender.close(timeout=10)
    assert [r["step"] for r in stopped_receiver.of_kind("step")] == list(range(1, 31))
    arrivals = stopped_receiver.arrivals
    nan_steps = [("preview", i) for i in range(20, 31)]
    assert arrivals[:11] == nan_steps  # first, before the run record: not taken
    # Right after the first batch (the run record and steps 1-4) got through, again.
    assert arrivals[11:16] == [("record", 0)] + [("record", i) for i in range(1, 5)]
    assert arrivals[16:27] == nan_steps
    assert len(stopped_receiver.previews) == 22  # then taken: not sent a third time


def test_an_amp_overflow_step_is_not_previewed(stopped_receiver, tmp_path):
    sender = _sender(stopped_receiver.url, tmp_path)
    sender.submit(_step(0))
    assert not sender.flush(timeout=0.3)
    overflow = {**_step(1, loss=2.0), "grad_norm": float("inf"), "loss_scale": 65536.0}
    skipped = {**_step(2, loss=2.0), "grad_norm": float("nan"), "skipped": True}
    sender.submit(overflow)
    sender.submit(skipped)
    sender.submit(_step(3))
    stopped_receiver.start()
    assert sender.close(timeout=10)
    assert [r["step"] for r in stopped_receiver.of_kind("step")] == [0, 1, 2, 3]
    assert stopped_receiver.previews == []


def test_a_sidecar_without_the_preview_route_still_gets_everything(stopped_receiver, tmp_path,
                                                                   caplog):
    stopped_receiver.preview_route = False  # an older sidecar: 404 on /v1/records/preview
    sender = _sender(stopped_receiver.url, tmp_path)
    for i in range(20):
        sender.submit(_step(i, loss=float("nan") if i in (5, 15) else 1.0))
    assert not sender.flush(timeout=0.3)
    stopped_receiver.start()
    assert sender.close(timeout=10)
    assert [r["step"] for r in stopped_receiver.of_kind("step")] == list(range(20))
    assert sender.misconfigured is None and not sender.previews_on
    assert sender.counters().sent == 20 and sender.counters().dropped == 0
    assert _errors(caplog) == []  # quietly: no "cannot send records" error


def _run_steps(run, steps, nan_from=12):
    head = [{"kind": "run", "run_id": run, "time": 1.0}] if 1 in steps else []
    return head + [{**_step(s, float("nan") if s >= nan_from else 2.0 - 0.01 * s, run),
                    "grad_norm": 1.0} for s in steps]


def test_nan_behind_an_outage_real_sidecar_same_findings_one_alert(stopping_sidecar,
                                                                   pd_receiver, tmp_path):
    import httpx

    sc = stopping_sidecar
    ref = _sender(sc.url, tmp_path / "ref")
    for rec in _run_steps("ref", range(1, 21)):
        ref.submit(rec)
    assert ref.close(timeout=10)
    sender = _sender(sc.url, tmp_path / "prev")
    for rec in _run_steps("prev", range(1, 11)):
        sender.submit(rec)
    assert sender.flush(timeout=10)
    sc.kill()
    for rec in _run_steps("prev", range(11, 21)):  # spooled, NaN from step 12
        sender.submit(rec)
    assert not sender.flush(timeout=0.5)
    sc.start()
    assert sender.close(timeout=20)

    def get(path):
        return httpx.get(sc.url + path, timeout=10).json()

    stored = [r["step"] for r in sc.records("prev") if r["kind"] == "step"]
    assert stored == list(range(1, 21))  # once each, in order: nothing overtook
    findings = {run: sorted((f["type"], f["step"], f["message"].replace(run, "RUN"))
                            for f in get(f"/v1/runs/{run}/findings")["findings"])
                for run in ("ref", "prev")}
    assert findings["prev"] == findings["ref"] and findings["ref"]
    actions = {run: [(a["action"], a["step"]) for a in get(f"/v1/runs/{run}/actions")["actions"]]
               for run in ("ref", "prev")}
    assert actions["prev"] == actions["ref"] == [("stop", 14)]
    alerts = [a for a in get("/v1/alerts")["alerts"] if a["run_id"] == "prev"]
    assert len(alerts) == 1
    eventually(lambda: any(r.json["payload"]["custom_details"]["run_id"] == "prev"
                           for r in pd_receiver.accepted() if "payload" in r.json),
               what="the previewed run's page")
    keys = {r.json["dedup_key"] for r in pd_receiver.accepted()
            if r.json.get("payload", {}).get("custom_details", {}).get("run_id") == "prev"}
    assert len(keys) == 1
    metrics = httpx.get(sc.url + "/metrics", timeout=10).text
    assert 'monitor_agent_alert_decisions_total{reason="previewed"} 1.0' in metrics


def test_a_nan_run_started_while_the_sidecar_was_down_is_paged_at_its_first_nan_step(
        sidecar_factory, pd_receiver, tmp_path):
    """A stranger's report: the run began while the sidecar was down and went NaN at step
    N (and stayed NaN); the sidecar came up later. Its previews of steps N.. were answered
    before the run record, waiting in the same spool, was stored: they began nothing and
    were dropped, and a NaN step the loop made during the replay, previewed once the run
    was stored, began the alert: the page named that step, not N. The sidecar now says
    which previews are of a run it has not stored, and the client sends them again once
    records got through, so the page names N."""
    import httpx

    from tests.conftest import STOP_RULES

    rules = tmp_path / "rules.yaml"
    rules.write_text(STOP_RULES)
    config = tmp_path / "config.yaml"
    config.write_text(f"alerting:\n  rules_file: {rules}\n  group_wait_seconds: 0.05\n"
                      f"  pagerduty: {{routing_key: k-0123456789abcdef0123456789abcd, "
                      f"url: '{pd_receiver.url}/v2/enqueue'}}\n")
    sc = sidecar_factory(config=config)  # not started: down when the run begins
    nan_from, run = 1500, "late"
    # Small batches: replaying the steps before the NaN takes longer than one replay pass
    # (1 s), as a backlog of real steps, with their layer statistics, does.
    sender = _sender(sc.url, tmp_path, batch_records=2, spool_max=64 << 20)
    for rec in _run_steps(run, range(1, nan_from + 100), nan_from=nan_from):
        sender.submit(rec)
    assert not sender.flush(timeout=0.3)
    stop = threading.Event()

    def training() -> None:  # the loop goes on making NaN steps while the backlog drains
        step = nan_from + 100
        while not stop.is_set():
            sender.submit(_run_steps(run, [step], nan_from=nan_from)[0])
            step += 1
            stop.wait(0.005)

    trainer = threading.Thread(target=training)
    trainer.start()
    try:
        sc.start()
        eventually(lambda: any(_pd_run(r) == run for r in pd_receiver.accepted()),
                   timeout=60, what="the run's page")
        # The in-order copy of the first NaN step arrives behind the backlog...
        eventually(lambda: sc.records(run, since_step=nan_from - 1, limit=1), timeout=120,
                   what=f"step {nan_from} delivered in order")
    finally:
        stop.set()
        trainer.join()
        sender.close(timeout=0.5, max_extra=0)  # the rest of the backlog is not needed
    pages = [r.json for r in pd_receiver.accepted() if _pd_run(r) == run]
    first = pages[0]
    assert first["event_action"] == "trigger"
    assert first["payload"]["custom_details"]["step"] == nan_from, first["payload"]["summary"]
    assert f"step {nan_from}" in first["payload"]["summary"]
    # ... and joins the alert its preview began: one alert, one page.
    assert len({p["dedup_key"] for p in pages}) == 1
    alerts = httpx.get(sc.url + "/v1/alerts", timeout=10).json()["alerts"]
    assert [a["run_id"] for a in alerts] == [run]


def _pd_run(request) -> str | None:
    return request.json.get("payload", {}).get("custom_details", {}).get("run_id")
