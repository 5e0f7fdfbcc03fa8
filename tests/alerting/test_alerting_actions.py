"""Rule actions (stop, checkpoint): taken once per episode, stored, paged, polled."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from alert_harness import FakeClock, Harness, nan, spike
from monitor_agent.alerting import RunContext
from monitor_agent.alerting.rules import RuleError, parse_rules
from monitor_agent.records.types import Severity
from tests.receivers import Receiver

RULES = """
routes: {page: [pagerduty, slack], chat: [slack]}
rules:
  - name: StopOnRepeatedNaN
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: []
    action: stop
    action_after: {after}
  - name: CheckpointOnSpike
    match: {types: [loss_spike]}
    action: checkpoint
"""


@pytest.fixture
def acting(tmp_path: Path, clock: FakeClock, request):
    after = getattr(request, "param", 2)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.replace("{after}", str(after)))
    with Receiver("slack") as slack, Receiver("pagerduty") as pd:
        h = Harness(tmp_path, clock, slack, pd, rules_file=rules)
        try:
            yield h
        finally:
            h.alerting.stop(timeout=5)


def _handle(h: Harness, *findings) -> list[dict]:
    """The actions taken, as the ingest answer carries them to the client."""
    taken = h.alerting.handle(RunContext("r1", project="proj"), list(findings), h.clock())
    return [a.to_dict() for a in taken]


def test_stop_is_taken_once_on_the_nth_finding_of_an_episode(acting: Harness):
    assert _handle(acting, nan(step=10)) == []
    [action] = _handle(acting, nan(step=11))
    assert (action["action"], action["rule"], action["step"], action["run_id"]) == (
        "stop", "StopOnRepeatedNaN", 11, "r1")
    assert action["message"] == "stop requested at step 11 by rule StopOnRepeatedNaN"
    assert action["honoured_step"] is None
    assert _handle(acting, nan(step=12)) == [] and _handle(acting, nan(step=13)) == []
    stored = acting.alerting.actions_for_run("r1")
    assert [a.id for a in stored] == [action["id"]]
    assert acting.alerting.actions_for_run("r1", after=action["id"]) == []
    assert acting.alerting.stop_requested("r1") and not acting.alerting.stop_requested("r2")
    assert acting.alerting.action_counts() == {("r1", "stop", "StopOnRepeatedNaN"): 1}


def test_the_page_says_the_stop_was_requested_then_where_the_run_stopped(acting: Harness):
    _handle(acting, nan(step=10), nan(step=10, layer="h.0"))
    acting.drain()
    [page] = acting.pd.wait_for(1, timeout=5)
    assert "stop requested at step 10 by rule StopOnRepeatedNaN" in page.json["payload"]["summary"]
    [alert] = acting.alerting.active_alerts()
    assert alert.action == "stop requested at step 10 by rule StopOnRepeatedNaN"
    # The trainer honours the stop 64 steps later; its end record says where.
    acting.alerting.run_ended("r1", "stopped", acting.clock.advance(1), step=74)
    acting.drain()
    pages = acting.pd.wait_for(2, timeout=5)
    told = "run stopped at step 74 by rule StopOnRepeatedNaN (stop requested at step 10)"
    assert told in pages[1].json["payload"]["summary"]
    assert "run stopped at step 10" not in str([p.json for p in pages])
    [alert] = acting.alerting.active_alerts()
    assert alert.action == told
    [action] = acting.alerting.actions_for_run("r1")
    assert (action.step, action.honoured_step, action.message) == (10, 74, told)
    acting.alerting.run_ended("r1", "stopped", acting.clock.advance(1), step=90)  # other rank
    assert acting.alerting.actions_for_run("r1")[0].honoured_step == 74


@pytest.mark.parametrize("acting", [3], indirect=True)
def test_an_action_after_the_page_is_paged_at_once_despite_the_cooldown(acting: Harness):
    _handle(acting, nan(step=10))
    acting.drain()
    assert len(acting.pd.wait_for(1, timeout=5)) == 1
    _handle(acting, nan(step=11))
    _handle(acting, nan(step=12))
    acting.drain()
    pages = acting.pd.wait_for(2, timeout=5)
    assert "stop requested at step 12" in pages[1].json["payload"]["summary"]
    assert acting.decisions()["action"] == 1


def test_a_new_episode_may_act_again_and_checkpoint_is_its_own_action(acting: Harness):
    _handle(acting, nan(step=10), nan(step=11))
    acting.drain()
    acting.tick(3600)  # resolve_after passes: the episode ends
    assert acting.alerting.active_alerts() == []
    assert _handle(acting, nan(step=50)) == []
    assert [a["step"] for a in _handle(acting, nan(step=51))] == [51]
    [ckpt] = _handle(acting, spike(step=52))
    assert ckpt["action"] == "checkpoint"
    assert ckpt["message"] == "checkpoint requested at step 52 by rule CheckpointOnSpike"
    assert [a.action for a in acting.alerting.actions_for_run("r1")] == [
        "stop", "stop", "checkpoint"]


def test_actions_survive_a_restart(acting: Harness):
    _handle(acting, nan(step=10), nan(step=11))
    acting.restart()
    assert [a.step for a in acting.alerting.actions_for_run("r1")] == [11]


def test_notify_only_is_the_default_and_typos_are_rejected():
    rules = parse_rules("routes: {chat: [console]}\nrules:\n"
                        "  - {name: A, match: {types: [nan_inf]}}\n")
    assert (rules[0].action, rules[0].action_after) == ("notify-only", 1)
    with pytest.raises(RuleError, match=r"rules\[0\]\.action.*(stop|checkpoint)"):
        parse_rules("routes: {chat: [console]}\nrules:\n"
                    "  - {name: A, match: {types: [nan_inf]}, action: halt}\n")
    with pytest.raises(RuleError, match=r"action_after"):
        parse_rules("routes: {chat: [console]}\nrules:\n"
                    "  - {name: A, match: {types: [nan_inf]}, action: stop, action_after: 0}\n")


def test_the_default_rules_heal_hardware_faults_only_and_show_how_to_stop_on_repeated_nan():
    text = resources.files("monitor_agent").joinpath("default_rules.yaml").read_text()
    acting = {(r.name, r.types, r.action) for r in parse_rules(text) if r.action != "notify-only"}
    # A hang or a rank gone, and a hard GPU error, restart the job (docs/actions.md,
    # "Healing"); nothing else acts unless told.
    assert acting == {("TrainingHung", ("hang",), "restart"),
                      ("TrainingGpuFaultHard", ("gpu_health",), "restart")}
    hard = next(r for r in parse_rules(text) if r.name == "TrainingGpuFaultHard")
    assert hard.min_severity == Severity.CRITICAL
    # Uncommenting the documented example gives a working stop rule, matched first.
    enabled = re.sub(r"(?m)^  # (- name: StopOnRepeatedNaN|  \S.*)$", r"  \1", text)
    first = parse_rules(enabled)[0]
    assert (first.name, first.action, first.action_after) == ("StopOnRepeatedNaN", "stop", 2)


def test_a_stop_the_trainer_never_honoured_says_so_when_the_run_ends_otherwise(
        acting: Harness):
    """Its loop never asked ``should_stop()``: the run went on and ended ``completed``.
    The stop stays unhonoured, and its alert says where the run went instead."""
    [stop] = _handle(acting, nan(step=10), nan(step=11))
    acting.alerting.run_ended("r1", "completed", acting.clock.advance(1), step=90)
    told = ("stop requested at step 11 by rule StopOnRepeatedNaN, not honoured: the run went "
            "on to step 90 and ended completed")
    [action] = acting.alerting.actions_for_run("r1")
    assert (action.id, action.honoured_step, action.message) == (stop["id"], None, told)
    [alert] = acting.alerting.list_alerts(run_id="r1")
    assert alert.action == told
