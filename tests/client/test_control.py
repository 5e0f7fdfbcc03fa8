"""The client's control plane (``_control.py``) on its own, and ``Monitor`` as its front.

What the sidecar asks of a run lives in one class that needs nothing of the Monitor but a
few callables: it is driven here against the actions stand-in with no Monitor at all, and
the Monitor's control methods are one line each into it (a method that grows a body again
pulls the control plane back into the reporting class)."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
from actions_stand_in import StandIn, rollback_action

from monitor_client import Monitor
from monitor_client._control import STOP_GRACE, Control
from monitor_client._restart import RestartOrder
from monitor_client._transport import HttpTransport
from monitor_client._warn import Warner
from tests.eventually import eventually

# Monitor's methods for what the sidecar asks of the run: each is Control's of that name.
CONTROL_METHODS = ("should_stop", "should_checkpoint", "stop_reason", "on_action", "actions",
                   "resumed_from", "job_checkpoints", "resume_plan", "rollback_plan")


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


def _control(url: str, sent: list[dict], step: list[int]) -> Control:
    transport = HttpTransport(url, None, timeout=5.0)
    return Control("r", 0, enabled=True, warner=Warner(),
                   restart=RestartOrder(started=0.0, enabled=False, node_rank=0,
                                        flush=lambda timeout: True, timeout=1.0),
                   transport=lambda: transport, flush=lambda timeout: True,
                   submit=sent.append, progress=lambda: ("attempt-1", step[0]))


def test_the_control_plane_runs_without_a_monitor(stand_in):
    # A rollback plan naming a checkpoint this process never saved: refused, the run told
    # to stop, the hold reported with the attempt and step the Monitor would give.
    sent: list[dict] = []
    step = [36]
    control = _control(stand_in.url, sent, step)
    control.vouch(30, "/ckpt/step-30.pt")  # not the plan's checkpoint
    stand_in.publish(rollback_action())
    control.poll(HttpTransport(stand_in.url, None, timeout=5.0))
    assert [a["id"] for a in control.actions()] == [5]
    assert control.rollback_plan() is None
    assert control.should_stop() and control.stop_reason().startswith("rollback plan 5 ")
    [held] = sent
    assert (held["kind"], held["attempt"], held["step"], held["outcome"]) == (
        "agreement", "attempt-1", 36, "unreported")
    step[0] = 36 + STOP_GRACE
    assert control.end_status("completed", None, step[0])[0] == "stopped"
    assert control.end_status("completed", None, step[0] + 1) == ("completed", None)
    # Once this process resumed from the plan's checkpoint, the plan is one to apply.
    control.resumed_from(20, "/ckpt/step-20.pt")
    assert control.rollback_plan().checkpoint_step == 20
    assert [20, "/ckpt/step-20.pt"] in control.job_checkpoints()


def test_a_user_callback_hears_each_new_action_once(stand_in):
    heard: list[int] = []
    control = _control(stand_in.url, [], [1])
    control.on_action(lambda action: heard.append(action["id"]))
    checkpoint = {"id": 3, "action": "checkpoint", "step": 10}
    control.receive([checkpoint])
    control.receive([checkpoint])
    eventually(lambda: heard == [3], timeout=5, what="the callback heard the action")
    assert control.should_checkpoint() and not control.should_checkpoint()


@pytest.mark.parametrize("name", CONTROL_METHODS)
def test_monitors_control_methods_are_one_line_into_control(name):
    method = ast.parse(textwrap.dedent(inspect.getsource(
        inspect.unwrap(getattr(Monitor, name))))).body[0]
    assert isinstance(method, ast.FunctionDef)
    body = method.body[1:] if isinstance(method.body[0], ast.Expr) and isinstance(
        method.body[0].value, ast.Constant) else method.body
    assert len(body) == 1, f"Monitor.{name} does more than call the control plane"
    call = body[0].value
    assert isinstance(call, ast.Call) and ast.unparse(call.func) == f"self._control.{name}"
