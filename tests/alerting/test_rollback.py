"""``action: rollback`` (alerting/rollback.py): one decision per run and fault for every
rank, its plan stored with the alert and paged, a budget that turns into a stop, and
rule files that say it (or say it wrong)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest

from alert_harness import T0, FakeClock, Harness, nan
from monitor_agent.alerting import RunContext
from monitor_agent.alerting.rollback import (
    ROLLBACK_WAIT_LIMIT_SECONDS,
    Positions,
    behind,
    decide,
    onset_of,
)
from monitor_agent.alerting.rules import RuleError, parse_rules
from monitor_agent.notify.base import Notification
from monitor_agent.records import wire
from monitor_agent.records.actions import Action, RollbackDecision, RollbackSpec
from tests.receivers import Receiver

RULES = """
routes: {page: [pagerduty]}
rules:
  - name: RollbackOnNaN
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: [rank]
    action: rollback
    rollback_skip_margin: 50
    rollback_lr_factor: 0.5
    rollback_lr_steps: 100
    rollback_budget: 2
"""
CLEAN = ((100, "/ckpt/step-100.pt"), (200, "/ckpt/step-200.pt"))
LINE = "last clean checkpoint: step 200, /ckpt/step-200.pt"


def _harness(tmp_path: Path, clock: FakeClock, rules_text: str) -> Iterator[Harness]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_text)
    with Receiver("slack") as slack, Receiver("pagerduty") as pd:
        h = Harness(tmp_path, clock, slack, pd, rules_file=rules)
        try:
            yield h
        finally:
            h.alerting.stop(timeout=5)


@pytest.fixture
def rolling(tmp_path: Path, clock: FakeClock) -> Iterator[Harness]:
    yield from _harness(tmp_path, clock, RULES)


def _handle(h: Harness, *findings, clean=CLEAN, line: str | None = LINE,
            positions: bool = True) -> list[dict]:
    """``positions``: the run reports its data positions, one batch per step (the
    checkpoint at step C resumes the data at position C)."""
    data = {"checkpoint_positions": {s: s for s, _ in clean},
            "data": {f.rank: (f.step, f.step, 1) for f in findings}} if positions else {}
    # Rank 0 reports the saves; rank 1 is where its finding is (every rank caught up,
    # unless ``positions`` is off: then rank 0 is at step 238, before any onset here).
    steps = {0: max(f.step for f in findings) if positions else 238, 1: 252}
    run = RunContext("r1", clean_checkpoints=clean, checkpoint_line=line, **data,
                     rank_steps=steps, checkpoint_ranks=(0,))
    return _wire(h.alerting.handle(run, list(findings), h.clock()))


def _wire(actions: list[Action]) -> list[dict]:
    """The actions as the ingest answer carries them to the client."""
    return [a.to_dict() for a in actions]


def test_two_ranks_reporting_the_same_fault_get_one_decision(rolling: Harness):
    [decided] = _handle(rolling, nan(step=250, rank=0))
    # Rank 1's NaN is its own alert (fingerprint [rank]), and still no second decision.
    assert _handle(rolling, nan(step=250, rank=1)) == []
    assert _handle(rolling, nan(step=251, rank=0), nan(step=251, rank=1)) == []
    assert decided["action"] == "rollback"
    assert decided["plan"] == {"checkpoint_step": 200, "checkpoint_path": "/ckpt/step-200.pt",
                               "resume_position": 200, "skip": [[201, 300]],
                               "positions": "positions",
                               "skip_from": 201, "skip_to": 300, "lr_factor": 0.5,
                               "lr_steps": 100, "number": 1, "budget": 2}
    assert decided["message"] == ("rolled back to step 200 (/ckpt/step-200.pt, data position "
                                  "200), skipping batches 201-300; LR x0.5 for 100 steps")
    # Every rank polls the same dict, the plan included, after a restart too.
    rolling.restart()
    [polled] = [a.to_dict() for a in rolling.alerting.actions_for_run("r1")]
    assert polled == decided
    rolling.drain()
    summaries = [p.json["payload"]["summary"] for p in rolling.pd.wait_for(2, timeout=5)]
    assert all(decided["message"] in s and LINE in s for s in summaries), summaries


def test_a_resume_applies_it_and_past_the_budget_the_run_is_stopped(rolling: Harness):
    [first] = _handle(rolling, nan(step=250))
    rolling.alerting.attempt_settled("r1", 260, rolling.clock())  # not at the window: pending
    assert _handle(rolling, nan(step=262)) == []
    rolling.alerting.attempt_settled("r1", 201, rolling.clock())
    [applied] = rolling.alerting.actions_for_run("r1")
    assert (applied.id, applied.honoured_step) == (first["id"], 201)
    [second] = _handle(rolling, nan(step=240))
    assert (second["action"], second["plan"]["number"], second["plan"]["skip_to"]) == (
        "rollback", 2, 290)
    rolling.alerting.attempt_settled("r1", 201, rolling.clock())
    [stop] = _handle(rolling, nan(step=230))
    assert stop["action"] == "stop" and stop["plan"] is None
    assert stop["message"].startswith("rollback budget 2 spent: stopping; a human must look")
    assert _handle(rolling, nan(step=231)) == []  # one stop, not one per finding
    rolling.drain()
    # (the resume at 201 closed the first rollback's alert: a resolve, no payload)
    # Each resume closed the alert its rollback answered (a resolve each), and each new
    # episode's action is told at once, within the rule's cooldown too: five messages.
    sent = rolling.pd.wait_for(5, timeout=5)
    pages = [p.json["payload"]["summary"] for p in sent if "payload" in p.json]
    assert any("rollback budget 2 spent" in s for s in pages), pages


def test_the_resume_closes_the_alerts_about_the_abandoned_steps(rolling: Harness):
    """The fault's history was abandoned: its alert closes (resolve sent), instead of
    firing on and swallowing a new fault of the resumed history into its episode."""
    [decided] = _handle(rolling, nan(step=250, rank=0))
    _handle(rolling, nan(step=190, rank=1))  # a finding about history the resume keeps
    rolling.drain()
    rolling.pd.wait_for(2, timeout=5)
    rolling.alerting.attempt_settled("r1", decided["plan"]["skip_from"], rolling.clock())
    rolling.drain()
    states = {a.rank: a.state for a in rolling.alerting.list_alerts(run_id="r1")}
    assert states == {0: "resolved", 1: "firing"}
    [resolve] = [p.json for p in rolling.pd.wait_for(3, timeout=5)][2:]
    assert resolve["event_action"] == "resolve"
    rows = rolling.alerting.db.query("SELECT body FROM outbox WHERE channel = 'pagerduty' "
                                     "ORDER BY id")
    said = [e.summary for r in rows for e in Notification.from_dict(wire.loads(r["body"])).events
            if e.status == "resolved"]
    skip_from = decided["plan"]["skip_from"]
    assert [s.split(";")[0] for s in said] == [
        f"run rolled back to step {skip_from - 1} (closed: steps {skip_from} on were "
        "abandoned"], said
    [again] = _handle(rolling, nan(step=240, rank=0))  # the resumed history's own fault
    assert again["plan"]["number"] == 2


def test_with_no_clean_checkpoint_before_the_fault_the_run_is_stopped(rolling: Harness):
    # The checkpoint at 200 is after the onset (evidence onset_step 150): not a target.
    fault = nan(step=250, evidence={"onset_step": 150})
    [stop] = _handle(rolling, fault, clean=((200, "/ckpt/step-200.pt"),),
                     line="no clean checkpoint reported")
    assert stop["action"] == "stop"
    assert stop["message"].startswith("no clean checkpoint to roll back to: stopping")
    assert _handle(rolling, nan(step=251, rank=3)) == []  # stopped: nothing more to decide


def test_rule_files_with_rollback_load_and_bad_fields_are_refused():
    [rule] = parse_rules(RULES)
    assert (rule.action, rule.rollback_skip_margin, rule.rollback_lr_factor,
            rule.rollback_lr_steps, rule.rollback_budget) == ("rollback", 50, 0.5, 100, 2)
    [plain] = parse_rules("routes: {page: [console], chat: [console]}\nrules:\n"
                          "  - {name: R, match: {types: [divergence]}, action: rollback}\n")
    assert (plain.rollback_skip_margin, plain.rollback_budget, plain.rollback_lr_factor) == (
        200, 2, None)
    bad = {
        "action: stop, rollback_budget: 3": "only apply to action: rollback",
        "action: rollback, rollback_lr_factor: 0.5": "go together",
        "action: rollback, rollback_lr_factor: 2, rollback_lr_steps: 5": "less than or equal to 1",
        "action: rollback, rollback_budget: 0": "greater than or equal to 1",
        "action: rollback, rollback_skip_margin: -1": "greater than or equal to 0",
        "action: rollback, rollback_budgett: 2": "unknown field",
    }
    for fields, why in bad.items():
        with pytest.raises(RuleError, match=why):
            parse_rules("routes: {page: [console], chat: [console]}\nrules:\n"
                        f"  - {{name: R, match: {{types: [nan_inf]}}, {fields}}}\n")


def test_the_commented_example_in_the_default_rules_is_a_working_rollback_rule():
    text = resources.files("monitor_agent").joinpath("default_rules.yaml").read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "- {name: RollbackOnDivergence" in line)
    example = "\n".join(line.lstrip("#").strip() for line in lines[start:start + 3])
    [rule] = parse_rules(f"routes: {{page: [console], chat: [console]}}\nrules:\n  {example}\n")
    assert (rule.name, rule.action, rule.rollback_lr_factor, rule.rollback_budget) == (
        "RollbackOnDivergence", "rollback", 0.5, 2)
    # issue 45: where bad data is the fault, the spike it makes is a loss_spike
    start = next(i for i, line in enumerate(lines) if "- {name: RollbackOnBadData" in line)
    example = "\n".join(line.lstrip("#").strip() for line in lines[start:start + 2])
    [rule] = parse_rules(f"routes: {{page: [console], chat: [console]}}\nrules:\n  {example}\n")
    assert (rule.name, rule.action, rule.types) == (
        "RollbackOnBadData", "rollback", ("loss_spike", "divergence"))


def _saving_run(rank0_at: int, clean: tuple) -> RunContext:
    """Rank 0 saves (every 10 steps) and has reached ``rank0_at``; rank 1 is at 252."""
    return RunContext("r1", clean_checkpoints=clean, checkpoint_line=LINE,
                      rank_steps={0: rank0_at, 1: 252}, checkpoint_ranks=(0,))


def test_a_rollback_waits_for_the_saving_rank_to_reach_the_faults_onset(rolling: Harness):
    """Issue 31: rank 1's fault (onset 241) arrives while rank 0, which saves, is at step
    238: its save at 240 may be on its way, so the decision waits for it, not going back to
    200 meanwhile; once rank 0 is past the onset it is decided, with the save at 240."""
    fault = nan(step=241, rank=1)
    assert _handle(rolling, fault, clean=CLEAN, positions=False) == []
    assert rolling.alerting.waiting("r1")
    assert _wire(rolling.alerting.retry(_saving_run(239, CLEAN), rolling.clock())) == []
    # Its page is held meanwhile, so the one page says what was done.
    rolling.alerting.episodes.flush(rolling.clock())
    assert [a.state for a in rolling.alerting.list_alerts(run_id="r1")] == ["pending"]
    with_240 = (*CLEAN, (240, "/ckpt/step-240.pt"))
    [decided] = _wire(rolling.alerting.retry(_saving_run(241, with_240), rolling.clock()))
    assert decided["plan"]["checkpoint_step"] == 240 and not rolling.alerting.waiting("r1")
    rolling.alerting.episodes.flush(rolling.clock())
    rolling.drain()
    [page] = [p.json["payload"]["summary"] for p in rolling.pd.wait_for(1, timeout=5)]
    assert "rolled back to step 240 (/ckpt/step-240.pt)" in page, page


def test_the_wait_is_bounded(rolling: Harness):
    assert _handle(rolling, nan(step=241, rank=1), clean=CLEAN, positions=False) == []
    rolling.clock.advance(4.0)
    assert _wire(rolling.alerting.retry(_saving_run(238, CLEAN), rolling.clock())) == []
    rolling.clock.advance(1.5)  # rank 0 silent past ROLLBACK_WAIT_SECONDS: decide with what is known
    [decided] = _wire(rolling.alerting.retry(_saving_run(238, CLEAN), rolling.clock()))
    assert decided["plan"]["checkpoint_step"] == 200


def test_a_plan_whose_checkpoint_turns_suspect_is_withdrawn_and_decided_again(
        rolling: Harness):
    [decided] = _handle(rolling, nan(step=250, rank=0))
    assert decided["plan"]["checkpoint_step"] == 200
    run = RunContext("r1", clean_checkpoints=CLEAN, checkpoint_positions={100: 100, 200: 200},
                     data={0: (250, 250, 1)}, rank_steps={0: 250, 1: 252},
                     checkpoint_ranks=(0,))
    assert _wire(rolling.alerting.revise(run, rolling.clock())) == []  # still clean: nothing to do
    # A finding that arrived later made the save at 200 suspect: the plan goes back to 100,
    # as rollback number 1 still (the budget is not spent twice).
    suspect = RunContext("r1", clean_checkpoints=CLEAN[:1], checkpoint_positions={100: 100},
                         data={0: (250, 250, 1)}, rank_steps={0: 250, 1: 252},
                         checkpoint_ranks=(0,))
    [revised] = _wire(rolling.alerting.revise(suspect, rolling.clock()))
    assert (revised["action"], revised["plan"]["checkpoint_step"], revised["plan"]["number"]) \
        == ("rollback", 100, 1)
    assert revised["message"].endswith("(revised: checkpoint step 200 turned suspect)")
    old, new = rolling.alerting.actions_for_run("r1")
    assert (old.id, old.withdrawn_by, new.id) == (decided["id"], new.id, revised["id"])
    assert old.message.startswith("withdrawn: checkpoint step 200 turned suspect")
    # What the run's lifecycle and its ranks read: the new plan only, once.
    assert [a.id for a in rolling.alerting.open_actions("r1")] == [revised["id"]]
    assert _wire(rolling.alerting.revise(suspect, rolling.clock())) == []
    # No clean checkpoint left before the fault: the run is asked to stop instead.
    none_left = RunContext("r1", rank_steps={0: 250, 1: 252}, checkpoint_ranks=(0,))
    [stop] = _wire(rolling.alerting.revise(none_left, rolling.clock()))
    assert stop["action"] == "stop" and stop["message"].startswith(
        "no clean checkpoint to roll back to: stopping; a human must look")


def test_a_plan_joins_the_windows_its_run_skips_already_with_its_own():
    """The windows a run skips already and the new one: sorted, overlapping or adjacent ones
    joined into one, a window that ends before it begins left out; the page names each."""
    [rule] = parse_rules(RULES)
    data = Positions(checkpoints={200: 200}, latest={0: (250, 250, 1)},
                     skipped=((121, 130), (100, 120), (180, 215), (90, 80), (20, 20)))
    decision = decide(rule, nan(step=250), CLEAN, number=2, data=data)
    assert isinstance(decision, RollbackDecision)
    plan = decision.plan
    # Its own window: after the checkpoint's position to the fault's plus the margin (50).
    assert plan.to_dict()["skip"] == [[20, 20], [100, 130], [180, 300]], plan
    assert plan.skip == ((20, 20), (100, 130), (180, 300))
    assert "skipping batches 20, 100-130, 180-300" in plan.describe(), plan.describe()
    # A plan from before the windows were a list reads as its steps' one window.
    old = RollbackSpec.parse({"checkpoint_step": 200, "checkpoint_path": "/c/200.pt",
                              "skip_from": 201, "skip_to": 300})
    assert (old.skip, old.positions) == (((201, 300),), "steps")


def _plan(finding, clean=CLEAN, rules: str = RULES, **data) -> RollbackSpec:
    [rule] = parse_rules(rules)
    decision = decide(rule, finding, clean, number=1, data=Positions(**data) if data else None)
    assert isinstance(decision, RollbackDecision), decision
    return decision.plan


def test_the_checkpoint_saved_at_the_faults_onset_is_not_clean_to_go_back_to():
    """The onset step is the first bad one: its checkpoint holds the bad update, so the plan
    goes back to the save before it; a detector's onset after the fault, or not a step
    number, is no onset (the fault's own step is)."""
    assert _plan(nan(step=250, evidence={"onset_step": 200})).checkpoint_step == 100
    assert _plan(nan(step=250, evidence={"onset_step": 201})).checkpoint_step == 200
    for odd in (260, True, "200", 2.0e2):
        assert onset_of(nan(step=250, evidence={"onset_step": odd})) == 250, odd
    assert onset_of(nan(step=250, evidence={"onset_step": 250})) == 250
    assert onset_of(nan(step=250)) == 250


def test_the_window_is_measured_from_the_faulting_ranks_position_in_positions_per_step():
    """Rank 1 (the fault's) runs at 2 positions a step and is 10 steps past the fault: the
    fault's position is 20 back from its latest, and the margin (50 steps) is 100
    positions. Without the fault's rank, the least advanced rank's place counts."""
    checkpoints = {200: 400}
    plan = _plan(nan(step=250, rank=1), checkpoints=checkpoints,
                 latest={0: (240, 100, 3), 1: (260, 520, 2)}, skips_by="sampler")
    assert (plan.resume_position, plan.skip, plan.positions) == (400, ((401, 600),), "positions")
    assert (plan.skip_from, plan.skip_to, plan.skips_by) == (201, 300, "sampler")
    # A rank that has not reached the fault's step yet: its latest position is the fault's.
    plan = _plan(nan(step=250, rank=1), checkpoints=checkpoints, latest={1: (240, 490, 2)})
    assert plan.skip == ((401, 590),)
    # The fault's rank reports no position: the least advanced of the others.
    plan = _plan(nan(step=250, rank=3), checkpoints=checkpoints,
                 latest={0: (250, 500, 2), 1: (250, 700, 2)})
    assert plan.skip == ((401, 600),)


def test_a_window_never_ends_before_the_position_it_resumes_after():
    """No margin, and the rank's position at the fault is before the checkpoint's (its data
    restarted): the window is the one position after the resume, not an empty one."""
    no_margin = RULES.replace("rollback_skip_margin: 50", "rollback_skip_margin: 0")
    plan = _plan(nan(step=250), rules=no_margin, checkpoints={200: 400},
                 latest={0: (250, 300, 1)})
    assert plan.skip == ((401, 401),) and plan.skip_to == 250
    # Nor in steps: a fault one step after the checkpoint skips that one step.
    plan = _plan(nan(step=201), clean=((200, "/ckpt/step-200.pt"),), rules=no_margin)
    assert (plan.skip_from, plan.skip_to, plan.skip) == (201, 201, ((201, 201),))


def test_earlier_windows_join_only_a_plan_counted_in_their_unit():
    """Windows skipped in steps mean nothing in data positions (and the other way): a plan
    joins only those counted as it is; a plan in steps says nothing of how data is skipped."""
    in_steps = dict(skipped=((150, 160),), skipped_unit="steps", skips_by="reading")
    plan = _plan(nan(step=250), checkpoints={200: 400}, latest={0: (250, 450, 1)}, **in_steps)
    assert plan.skip == ((401, 500),)
    plan = _plan(nan(step=250), **in_steps)  # no positions reported: the plan counts steps
    assert (plan.skip, plan.positions, plan.skips_by) == (((150, 160), (201, 300)), "steps", None)


def test_a_rank_is_waited_for_until_its_step_at_the_onset_is_here():
    fault = nan(step=66, evidence={"onset_step": 61})
    assert behind({0: 60, 1: 66}, (0,), fault) == [0]
    assert behind({0: 61, 1: 66}, (0,), fault) == []
    assert behind({1: 66}, (0,), fault) == [0]  # nothing heard of the saving rank yet
    assert behind({1: 5}, (0,), nan(step=1)) == [0]  # even for a fault at step 1
    assert behind({0: 59, 1: 60, 2: 66}, (), fault) == [0, 1]  # no saves yet: every rank


SAVES = ((50, "/ckpt/step-50.pt"), (60, "/ckpt/step-60.pt"), (70, "/ckpt/step-70.pt"))


def _job(node1_at: int, clean=SAVES) -> RunContext:
    """Four ranks that all save every 10 steps; node 0's (0, 1) at step 105, node 1's
    (2, 3) at ``node1_at``, as the leader hears them through node 1's sidecar."""
    return RunContext("r1", clean_checkpoints=clean, checkpoint_line=LINE,
                      rank_steps={0: 105, 1: 105, 2: node1_at, 3: node1_at},
                      checkpoint_ranks=(0, 1, 2, 3))


def test_a_node_whose_records_keep_coming_late_is_waited_for_and_its_earlier_onset_decides(
        rolling: Harness):
    """Node 1's ranks trained a bad batch at step 65; DDP spread it to every rank, and rank
    0's loss left its band only at 75 (found at 105). Node 1's sidecar forwards its steps
    seconds late (starved of CPU); every rank reports its saves. The decision waits as long
    as node 1's records keep coming, past the quiet wait; once they reach the onset, their
    finding from 65 has made the save at 70 suspect, and the one plan goes back to 60, not to 70 (which
    holds the bad batch and would cost a second rollback)."""
    fault = nan(step=105, rank=0, evidence={"onset_step": 75})
    assert _wire(rolling.alerting.handle(_job(40), [fault], rolling.clock())) == []
    for at in (50, 60, 66, 74):  # 4 s apart: each within the quiet wait of the last news
        rolling.clock.advance(4.0)
        assert _wire(rolling.alerting.retry(_job(at), rolling.clock())) == []
        rolling.alerting.episodes.flush(rolling.clock())  # its page waits for the decision
        assert [a.state for a in rolling.alerting.list_alerts(run_id="r1")] == ["pending"]
    rolling.clock.advance(4.0)
    [decided] = _wire(rolling.alerting.retry(_job(75, clean=SAVES[:2]), rolling.clock()))
    assert decided["plan"]["checkpoint_step"] == 60, decided
    assert not rolling.alerting.waiting("r1")


def test_a_node_that_trickles_is_waited_for_a_minute_at_most(rolling: Harness):
    fault = nan(step=105, rank=0, evidence={"onset_step": 75})
    assert _wire(rolling.alerting.handle(_job(40), [fault], rolling.clock())) == []
    at = 40
    while rolling.clock() - T0 < ROLLBACK_WAIT_LIMIT_SECONDS - 4.0:
        rolling.clock.advance(4.0)
        at += 1
        assert _wire(rolling.alerting.retry(_job(at), rolling.clock())) == []
    rolling.clock.advance(4.0)
    [decided] = _wire(rolling.alerting.retry(_job(at + 1), rolling.clock()))
    assert decided["plan"]["checkpoint_step"] == 70  # what is known then


def test_a_node_that_went_quiet_is_not_waited_for_past_the_quiet_wait(rolling: Harness):
    fault = nan(step=105, rank=0, evidence={"onset_step": 75})
    assert _wire(rolling.alerting.handle(_job(50), [fault], rolling.clock())) == []
    rolling.clock.advance(4.0)
    assert _wire(rolling.alerting.retry(_job(60), rolling.clock())) == []
    rolling.clock.advance(4.0)  # 8 s since the start, 4 s since node 1's last news
    assert _wire(rolling.alerting.retry(_job(60), rolling.clock())) == []
    rolling.clock.advance(1.5)
    [decided] = _wire(rolling.alerting.retry(_job(60), rolling.clock()))
    assert decided["plan"]["checkpoint_step"] == 70


def test_windows_one_position_apart_stay_apart_and_a_window_inside_another_is_absorbed():
    """Position 200 is trained between a skipped window ending at 199 and the new one
    starting at 201: two windows. A window inside an earlier one, after several others,
    leaves that one whole."""
    [rule] = parse_rules(RULES)
    data = Positions(checkpoints={200: 200}, latest={0: (250, 250, 1)},
                     skipped=((100, 199), (10, 12), (20, 30), (25, 26), (1, 5)))
    decision = decide(rule, nan(step=250), CLEAN, number=2, data=data)
    assert isinstance(decision, RollbackDecision)
    assert decision.plan.skip == ((1, 5), (10, 12), (20, 30), (100, 199), (201, 300))


def test_a_rollback_keeps_skipping_the_windows_the_run_skips_already_and_says_how(
        rolling: Harness):
    """The run's record says a sampler leaves windows out, and an applied rollback skips
    150-160 already: the new plan skips both, in positions, and names the sampler."""
    run = RunContext("r1", clean_checkpoints=CLEAN, checkpoint_line=LINE,
                     checkpoint_positions={100: 100, 200: 200}, data={0: (250, 250, 1)},
                     skipped=((150, 160),), skipped_unit="positions", skips_by="sampler",
                     rank_steps={0: 250}, checkpoint_ranks=(0,))
    [decided] = _wire(rolling.alerting.handle(run, [nan(step=250)], rolling.clock()))
    assert (decided["plan"]["skip"], decided["plan"]["positions"],
            decided["plan"]["skips_by"]) == ([[150, 160], [201, 300]], "positions", "sampler")


def test_a_fault_back_after_the_resume_on_an_alert_still_open_decides_again(
        rolling: Harness):
    """Rank 1's alert is about step 190, which the resume keeps: it stays open, and the
    NaN it sees again after the resume is a new fault of its episode, decided anew."""
    [first] = _handle(rolling, nan(step=250, rank=0))
    assert _handle(rolling, nan(step=190, rank=1)) == []  # decided already
    rolling.alerting.attempt_settled("r1", first["plan"]["skip_from"], rolling.clock())
    [again] = _handle(rolling, nan(step=240, rank=1))
    assert (again["action"], again["plan"]["number"]) == ("rollback", 2)


@pytest.fixture
def one_alert(tmp_path: Path, clock: FakeClock) -> Iterator[Harness]:
    """The rule with one alert for the run (``fingerprint: []``), as the multi-node
    example's: every rank's finding is one episode."""
    yield from _harness(tmp_path, clock, RULES.replace("fingerprint: [rank]", "fingerprint: []"))


def test_a_ranks_finding_that_arrives_after_a_later_one_still_decides(one_alert: Harness):
    """The leader began the episode on rank 0's finding at step 105 while node 1 was not
    heard (a partial view: no action). Node 1's ranks' own finding at step 67 arrives
    after it: news of a rank that was late, not a replay, so it decides, from its onset."""
    late = nan(step=105, rank=0, evidence={"onset_step": 75}).seen_partially(
        "node 1 (ranks 2-3) not heard from for 4 s")
    assert _wire(one_alert.alerting.handle(_job(67), [late], one_alert.clock())) == []
    first = nan(step=67, rank=2, evidence={"onset_step": 65})
    [decided] = _wire(one_alert.alerting.handle(_job(67), [first], one_alert.clock()))
    assert decided["plan"]["checkpoint_step"] == 60, decided
    # The same finding replayed (a sidecar restart): decided already, nothing more.
    assert _wire(one_alert.alerting.handle(_job(67), [first], one_alert.clock())) == []


@pytest.mark.parametrize("harness", ["rolling", "one_alert"])
def test_a_late_finding_of_a_replaced_history_does_not_decide(
        harness: str, request: pytest.FixtureRequest):
    """A finding of the run's attempt before its last rollback or restart (a lagging
    rank's record of the abandoned branch) is about weights the run no longer has."""
    rolling = request.getfixturevalue(harness)
    late = nan(step=105, rank=0, evidence={"onset_step": 75}).seen_partially("node 1 away")
    run = dataclasses.replace(_job(67), attempt=2)
    assert _wire(rolling.alerting.handle(run, [dataclasses.replace(late, attempt=2)],
                                         rolling.clock())) == []
    old = nan(step=67, rank=2, evidence={"onset_step": 65}, attempt=1)
    assert _wire(rolling.alerting.handle(run, [old], rolling.clock())) == []
    assert rolling.alerting.actions_for_run("r1") == []
