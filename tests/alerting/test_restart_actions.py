"""``action: restart`` as a rule takes it (alerting/rule_actions.py), on a real Alerting
service with its SQLite database: one decision for a fault every rank reports, stored and
noted on each rank's alert; held or refused, saying why; carried out by the relaunched
job's first step; weighed against the run's earlier restarts and rollbacks as the store
keeps them. The decisions themselves are in test_restart_decide.py; a real sidecar over
HTTP in test_restart_sidecar.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from monitor_agent.alerting import Alerting, AlertingSettings
from monitor_agent.alerting.alerts import NodeView, RunContext
from monitor_agent.records.types import Finding, LauncherDeclaration, Severity

RULES = """
routes: {page: [console]}
rules:
  - {name: Restart, match: {types: [hang]}, severity: critical, fingerprint: [rank],
     action: restart}
  - {name: RollBack, match: {types: [nan_inf]}, severity: critical, fingerprint: [rank],
     action: rollback}
"""
T0 = 1_700_000_000.0
NODES = tuple(NodeView(n, f"gpu-node-{n}", f"sc{n}" if n else None, (2 * n, 2 * n + 1))
              for n in range(4))
RUN = RunContext("job", clean_checkpoints=((100, "/c/100.pt"), (200, "/c/200.pt")),
                 checkpoint_positions={100: 110, 200: 220}, world=8, nodes=NODES,
                 launcher=LauncherDeclaration("torchrun", True, 0, 5, min_nodes=1))


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Alerting]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    alerting = Alerting(AlertingSettings(rules_file=rules), tmp_path / "alerts.sqlite",
                        CollectorRegistry())
    yield alerting
    alerting.db.close()


def hang(step: int = 250, rank: int = 0, gone: tuple[int, ...] = (),
         phase: str = "backward") -> Finding:
    table = {str(r): {"state": "gone"} if r in gone else
             {"state": "hung", "stuck_in": "c10d:all_reduce", "phase": phase}
             for r in range(8)}
    return Finding("hang", Severity.CRITICAL, "job", step=step, rank=rank, message="hung",
                   evidence={"gone_ranks": list(gone), "ranks": table})


def nan(step: int, rank: int) -> Finding:
    return Finding("nan_inf", Severity.CRITICAL, "job", step=step, rank=rank,
                   message="loss is NaN")


def notes(service: Alerting) -> dict[int | None, str | None]:
    """What each rank's alert says was done about it."""
    return {a.rank: a.action for a in service.list_alerts(run_id="job")}


def test_one_restart_is_decided_for_a_fault_every_rank_reports_and_each_alert_names_it(
        service: Alerting):
    [decided] = service.handle(RUN, [hang(rank=3, gone=(3,))], T0)
    told = ("restart all 8 ranks from checkpoint 200 (clean; /c/200.pt, data position 220) "
            "(rule Restart, hang at step 250)")
    assert (decided.id, decided.action, decided.rule, decided.type, decided.step,
            decided.created_at, decided.message) == (1, "restart", "Restart", "hang", 250, T0,
                                                     told)
    assert decided.restart is not None and decided.restart.cause == "gone"
    # Rank 0's report of the same hang is its own alert: it names the same restart.
    assert service.handle(RUN, [hang(rank=0, gone=(3,))], T0 + 1) == []
    assert notes(service) == {3: told, 0: told}
    assert service.actions_for_run("job") == [decided]


@pytest.mark.parametrize("run,attempt", [(replace(RUN, attempt=2, relaunching=True), 2),
                                         (replace(RUN, attempt=2), 1)])
def test_a_fault_of_a_job_its_launcher_relaunches_already_is_not_restarted(
        service: Alerting, run: RunContext, attempt: int):
    """A new process of the run sent records and no step yet, or the fault is the old
    attempt's: restarting now would hit the new processes."""
    assert service.handle(run, [replace(hang(), attempt=attempt)], T0) == []
    assert notes(service) == {0: "no restart: the job is being relaunched already (attempt 2 "
                                 "began)"}
    assert service.actions_for_run("job") == []


def test_a_restart_held_is_said_on_the_alert_and_in_the_sidecars_log(
        service: Alerting, caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="monitor_agent.alerting.rule_actions"):
        assert service.handle(RUN, [hang(phase="checkpoint")], T0) == []
    why = ("no restart: rank 0 is in its checkpoint save (phase checkpoint); a slow evaluation "
           "or checkpoint save is not a fault to restart for (rule Restart, hang at step 250)")
    assert notes(service) == {0: why}
    assert [r.getMessage() for r in caplog.records
            if r.name == "monitor_agent.alerting.rule_actions"] == [f"run job: {why}"]
    assert service.actions_for_run("job") == []


def test_the_relaunched_jobs_first_step_carries_the_restart_out_and_says_when(
        service: Alerting):
    [decided] = service.handle(RUN, [hang()], T0)
    service.attempt_settled("job", 201, T0 + 75, started=T0 + 30)
    told = ("restarted all 8 ranks from checkpoint 200 (clean; /c/200.pt, data position "
            "220); training resumed at step 201, 75 s after the decision")
    [done] = service.actions_for_run("job")
    assert (done.id, done.honoured_step, done.message) == (decided.id, 201, told)
    assert notes(service) == {0: told}


def test_a_restart_carried_out_closes_the_hang_page_saying_where_the_run_went_back_to(
        service: Alerting):
    from monitor_agent.notify.base import Notification
    from monitor_agent.records import wire

    service.handle(RUN, [hang()], T0)
    service.attempt_settled("job", 201, T0 + 75, started=T0 + 30)
    [alert] = service.store.alerts(run_id="job")
    assert alert.state == "resolved"
    rows = service.db.query("SELECT body FROM outbox WHERE channel = 'console' ORDER BY id")
    events = [e for r in rows for e in Notification.from_dict(wire.loads(r["body"])).events]
    assert [e.status for e in events] == ["firing", "resolved"]  # one page, one resolve
    assert events[-1].summary.startswith(
        "run restarted from step 200 (closed: steps 201 on were abandoned; restarted all 8 "
        "ranks"), events[-1].summary


def test_an_attempt_not_saying_when_it_began_carries_the_restart_out_and_the_log_says_so(
        service: Alerting, caplog: pytest.LogCaptureFixture):
    service.handle(RUN, [hang()], T0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="monitor_agent.alerting.episodes"):
        service.attempt_settled("job", 201, T0 + 75)  # begun now, as far as it says
    [done] = service.actions_for_run("job")
    assert done.honoured_step == 201
    assert [r.getMessage() for r in caplog.records
            if r.name == "monitor_agent.alerting.episodes"] == [f"run job: {done.message}"]


def test_a_rollback_carried_out_is_logged_with_the_step_the_run_resumed_at(
        service: Alerting, caplog: pytest.LogCaptureFixture):
    [rolled] = service.handle(TWO, [nan(step=250, rank=3)], T0)
    assert rolled.action == "rollback"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="monitor_agent.alerting.episodes"):
        service.attempt_settled("job", 201, T0 + 60)
    [done] = service.actions_for_run("job")
    assert [r.getMessage() for r in caplog.records
            if r.name == "monitor_agent.alerting.episodes"] == [
        f"run job resumed at step 201: {done.message}"]


def test_an_attempt_begun_before_the_decision_does_not_carry_it_out(service: Alerting):
    """Its first record came before the decision: a node's ranks whose launcher had
    relaunched them already; the restart waits for the attempt it asked for."""
    service.handle(RUN, [hang()], T0)
    service.attempt_settled("job", 201, T0 + 5, started=T0 - 5)
    [pending] = service.actions_for_run("job")
    assert pending.honoured_step is None
    service.attempt_settled("job", 201, T0 + 0.4, started=T0)
    [done] = service.actions_for_run("job")
    assert done.honoured_step == 201
    assert done.message.endswith("training resumed at step 201, 0 s after the decision")


def _restarted(service: Alerting, step: int, at: float) -> None:
    """A hang at ``step`` restarted at ``at``, carried out a minute later (from the
    plan's checkpoint)."""
    [decided] = service.handle(RUN, [hang(step=step)], at)
    assert decided.restart is not None, decided
    service.attempt_settled("job", decided.restart.resume_step, at + 60, started=at + 30)


def test_past_the_restart_budget_the_run_is_stopped_and_the_rule_never_restarts_it_again(
        service: Alerting):
    for i, step in enumerate((250, 900, 1500)):
        _restarted(service, step, T0 + 600 * i)
    [stop] = service.handle(RUN, [hang(step=2500)], T0 + 1800)
    assert (stop.action, stop.rule, stop.type, stop.step, stop.created_at, stop.plan,
            stop.message) == (
        "stop", "Restart", "hang", 2500, T0 + 1800, None,
        "restart budget spent (3 within 1 h): stopping; a human must look (rule Restart, "
        "hang at step 2500)")
    # An hour on, the budget would allow one again: a stopped run is a human's to restart.
    assert service.handle(RUN, [hang(step=2600)], T0 + 1800 + 3600) == []
    assert [a.action for a in service.actions_for_run("job")] == ["restart"] * 3 + ["stop"]


def test_the_same_fault_right_after_the_resume_stops_instead_of_restarting_again(
        service: Alerting):
    _restarted(service, 250, T0)
    [stop] = service.handle(RUN, [hang(step=260)], T0 + 120)
    assert stop.message == (
        "the restart did not cure it: hang again at step 260, 59 steps after the restart "
        "resumed at step 201 (restart_cure_steps 100): stopping; a human must look (rule "
        "Restart, hang at step 260)")


TWO = replace(RUN, nodes=NODES[:2], world=4)
# The job re-formed after the rollback with its node ranks swapped (torchrun's
# re-rendezvous): gpu-node-1 is node 0 now.
SWAPPED = replace(TWO, nodes=(NodeView(0, "gpu-node-1", "sc1", (0, 1)),
                              NodeView(1, "gpu-node-0", None, (2, 3))))


# Nodes whose hosts the leader does not know: told apart by node rank alone.
BARE = replace(TWO, nodes=tuple(replace(n, host=None) for n in TWO.nodes))


@pytest.mark.parametrize("first,later,rank,node", [
    (TWO, TWO, 2, "node 1 (gpu-node-1)"), (TWO, SWAPPED, 1, "node 0 (gpu-node-1)"),
    (BARE, BARE, 2, "node 1")])
def test_a_node_rolled_back_for_and_at_fault_again_within_the_hour_is_left_out(
        service: Alerting, first: RunContext, later: RunContext, rank: int, node: str):
    """The rollback rule's second incident on one node is the node's, not the data's: a
    restart without it, not another rollback (told by host when node ranks moved)."""
    [rolled] = service.handle(first, [nan(step=250, rank=3)], T0)
    assert rolled.action == "rollback"
    service.attempt_settled("job", 201, T0 + 60)
    [healed] = service.handle(later, [nan(step=900, rank=rank)], T0 + 1800)
    assert healed.action == "exclude", healed
    assert healed.message == (
        f"restart all 4 ranks from checkpoint 200 (clean; /c/200.pt, data position 220); "
        f"{node} left out: 2nd incident on it within 1 h (nan_inf at step 250 and at step "
        f"900) (rule RollBack, nan_inf at step 900)")
    assert [n.name() for n in healed.restart.exclude] == [node]  # type: ignore[union-attr]


def test_a_fault_on_another_node_after_a_rollback_is_rolled_back_again(service: Alerting):
    service.handle(TWO, [nan(step=250, rank=3)], T0)
    service.attempt_settled("job", 201, T0 + 60)
    [again] = service.handle(TWO, [nan(step=900, rank=0)], T0 + 1800)
    assert again.action == "rollback" and again.rollback.number == 2  # type: ignore[union-attr]


@pytest.mark.parametrize("run,evidence,fault", [
    (TWO, {}, {"fault_node": 1, "fault_host": "gpu-node-1"}),
    (TWO, {"node_rank": 5}, {"fault_node": 5, "fault_host": None}),  # a node not listed
    (replace(RUN, nodes=NODES[:1], world=2), {}, {})])  # one node: nothing to tell apart
def test_a_rollback_remembers_the_node_at_fault_only_where_nodes_can_be_told_apart(
        service: Alerting, run: RunContext, evidence: dict, fault: dict):
    [rolled] = service.handle(run, [replace(nan(step=250, rank=3 if run.world > 2 else 1),
                                            evidence=evidence)], T0)
    plan = rolled.to_dict()["plan"]
    assert {k: plan[k] for k in ("fault_node", "fault_host") if k in plan} == fault


def test_a_restart_whose_plan_this_sidecar_cannot_read_does_not_hold_back_the_next(
        service: Alerting, tmp_path: Path):
    """A node sidecar keeps the restarts its leader decided; one whose plan it could not
    read (a newer leader's) is no order, and the next is carried out all the same."""
    (tmp_path / "leader").mkdir()
    leader = Alerting(AlertingSettings(rules_file=tmp_path / "rules.yaml"),
                      tmp_path / "leader" / "alerts.sqlite", CollectorRegistry())
    [decided] = leader.handle(RUN, [hang()], T0)
    leader.db.close()
    unread = replace(decided, plan=None, created_at=T0 - 60)
    service.adopt_actions("job", [unread, replace(decided, id=2)], "leader")
    service.attempt_settled("job", 201, T0 + 60, started=T0 + 30)
    assert [(a.id, a.honoured_step) for a in service.actions_for_run("job")] == [
        (1, None), (2, 201)]
