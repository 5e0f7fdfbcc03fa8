"""The client's side of actions: the inbox, the ingest answer, the poll, and close()."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import httpx
import pytest

from monitor_client import Monitor, MonitorSettings
from monitor_client._actions import ActionInbox
from monitor_client._transport import PostOutcome, classify
from tests.eventually import eventually

STOP = {"id": 7, "action": "stop", "rule": "R", "step": 40, "run_id": "r",
        "message": "stop requested at step 40 by rule R"}


def test_inbox_stop_is_sticky_checkpoint_is_consumed_duplicates_ignored():
    inbox, seen = ActionInbox(), []
    inbox.add_callback(seen.append)
    assert not inbox.should_stop() and inbox.stop_reason is None
    inbox.receive([{"id": 3, "action": "checkpoint"}, STOP, STOP, {"action": "stop"}])
    assert inbox.should_stop() and inbox.should_stop()
    assert inbox.stop_reason == STOP["message"]
    assert inbox.take_checkpoint() and not inbox.take_checkpoint()
    assert [a["id"] for a in seen] == [3, 7] and inbox.last_id == 7


def test_a_failing_callback_is_reported_not_raised():
    problems = []
    inbox = ActionInbox(lambda where, exc: problems.append((where, exc)))
    inbox.add_callback(lambda a: 1 / 0)
    inbox.receive([STOP])
    assert inbox.should_stop() and problems[0][0] == "action_callback"


def test_the_ingest_answer_carries_actions():
    body = b'{"accepted": 1, "duplicates": 0, "rejected": [], "actions": [{"id": 1}, 3]}'
    result = classify(200, body)
    assert result.outcome is PostOutcome.OK and result.actions == [{"id": 1}]
    assert classify(200, b"[]").actions == [] and classify(200, b"junk").actions == []


def _stop_rules(tmp: Path) -> Path:
    rules = tmp / "rules.yaml"
    rules.write_text("routes: {chat: [console]}\nrules:\n  - name: StopNow\n"
                     "    match: {types: [nan_inf]}\n    action: stop\n")
    config = tmp / "config.yaml"
    config.write_text(f"alerting:\n  rules_file: {rules}\n")
    return config


def test_monitor_stops_on_the_answer_and_ends_the_run_stopped(sidecar_factory, tmp_path):
    sc = sidecar_factory(config=_stop_rules(tmp_path)).start()
    mon = Monitor(url=sc.url, run_id="mon-stop",
                  settings=MonitorSettings(spool_dir=tmp_path / "spool", install_hooks=False,
                                           linger=0.01))
    got = threading.Event()
    mon.on_action(lambda a: got.set())
    for step in range(1, 6):
        mon.log_step(step, loss=2.0)
    mon.flush()
    assert not mon.should_stop()
    mon.log_step(6, loss=float("nan"))
    assert got.wait(10) and mon.should_stop()
    assert mon.stop_reason() == "stop requested at step 6 by rule StopNow"
    assert [a["action"] for a in mon.actions()] == ["stop"]
    mon.log_step(7, loss=float("nan"))  # this trainer takes two more steps to honour it
    mon.log_step(8, loss=float("nan"))
    assert mon.close()
    end = [r for r in sc.records("mon-stop") if r["kind"] == "end"][0]
    assert (end["status"], end["step"]) == ("stopped", 8)
    assert end["error"] == "stopped at step 8: stop requested at step 6 by rule StopNow"
    # The sidecar learns the step the run really stopped at from the end record.
    [action] = httpx.get(f"{sc.url}/v1/runs/mon-stop/actions", timeout=10).json()["actions"]
    assert (action["step"], action["honoured_step"]) == (6, 8)
    assert action["message"] == "run stopped at step 8 by rule StopNow (stop requested at step 6)"
    alerts = httpx.get(f"{sc.url}/v1/alerts", timeout=10).json()
    assert "run stopped at step 8 by rule StopNow" in str(alerts)


def test_a_stop_the_trainer_never_honoured_is_not_reported_as_honoured(sidecar_factory,
                                                                       tmp_path):
    """Issue 31: a loop that never asks should_stop() runs to its end; the run ends
    "completed", and the alert says the stop was not honoured, not "run stopped"."""
    sc = sidecar_factory(config=_stop_rules(tmp_path)).start()
    mon = Monitor(url=sc.url, run_id="mon-ignored",
                  settings=MonitorSettings(spool_dir=tmp_path / "spool", install_hooks=False,
                                           linger=0.01))
    got = threading.Event()
    mon.on_action(lambda a: got.set())
    for step in range(1, 6):
        mon.log_step(step, loss=2.0)
    mon.log_step(6, loss=float("nan"))
    assert got.wait(10)
    for step in range(7, 40):  # it never asks, and trains to the end
        mon.log_step(step, loss=2.0)
    assert mon.close()
    end = [r for r in sc.records("mon-ignored") if r["kind"] == "end"][0]
    assert (end["status"], end["step"]) == ("completed", 39)
    [action] = httpx.get(f"{sc.url}/v1/runs/mon-ignored/actions", timeout=10).json()["actions"]
    assert action["honoured_step"] is None
    assert action["message"] == ("stop requested at step 6 by rule StopNow, not honoured: the "
                                 "run went on to step 39 and ended completed")


def test_another_rank_learns_of_the_stop_by_polling(sidecar_factory, tmp_path):
    sc = sidecar_factory(config=_stop_rules(tmp_path)).start()
    steps = [{"kind": "step", "run_id": "poll-me", "step": 1, "time": 1.0, "loss": "NaN"}]
    assert httpx.post(sc.url + "/v1/records", json={"records": steps}).json()["actions"]
    mon = Monitor(url=sc.url, run_id="poll-me",
                  settings=MonitorSettings(rank=1, world_size=2, install_hooks=False,
                                           spool_dir=tmp_path / "spool", linger=0.01))
    mon._sender.poll_interval = 0.05  # the default polls every 5 s
    steps = iter(range(1, 10**6))

    def stopped() -> bool:
        if mon.should_stop():
            return True
        mon.log_step(next(steps), loss=1.0)  # a training loop keeps stepping meanwhile
        return False

    eventually(stopped, interval=0.05, what="the poll brought the stop")
    mon.close()


def test_a_trainer_that_raises_to_honour_a_stop_stopped_and_did_not_crash(sidecar_factory,
                                                                          tmp_path):
    """Issue 45: a run that leaves its loop by raising once should_stop() said so ends
    "stopped", not "failed": the sidecar pages a failed end as a crash. A sys.exit(0)
    inside ``with Monitor(...)`` is the script ending on its own: "completed"."""
    sc = sidecar_factory(config=_stop_rules(tmp_path)).start()
    settings = MonitorSettings(spool_dir=tmp_path / "spool", install_hooks=False, linger=0.01)
    got = threading.Event()
    with pytest.raises(RuntimeError, match="told to stop"), \
            Monitor(url=sc.url, run_id="raised-stop", settings=settings) as mon:
        mon.on_action(lambda a: got.set())
        for step in range(1, 6):
            mon.log_step(step, loss=2.0 + step / 100)
        mon.log_step(6, loss=float("nan"))
        assert got.wait(10)
        if mon.should_stop():
            raise RuntimeError("told to stop")
    end = [r for r in sc.records("raised-stop") if r["kind"] == "end"][0]
    assert (end["status"], end["step"]) == ("stopped", 6)
    assert end["error"] == ("stopped at step 6: stop requested at step 6 by rule StopNow; it "
                            "left by RuntimeError: told to stop")
    found = httpx.get(f"{sc.url}/v1/runs/raised-stop/findings", timeout=10).json()["findings"]
    assert "crashed" not in {f["type"] for f in found}

    with pytest.raises(SystemExit), \
            Monitor(url=sc.url, run_id="exit-0", settings=settings) as mon:
        mon.log_step(1, loss=2.0)
        sys.exit(0)
    end = [r for r in sc.records("exit-0") if r["kind"] == "end"][0]
    assert (end["status"], end["error"]) == ("completed", None)
