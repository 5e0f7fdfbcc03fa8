"""``action: restart`` / ``exclude`` decisions (alerting/restart.py), as pure functions of a
finding, the run and its earlier healing actions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from monitor_agent.alerting.alerts import NodeView, RunContext
from monitor_agent.alerting.restart import Hold, Past, Restart, Stop, decide
from monitor_agent.alerting.rules import Rule
from monitor_agent.records.actions import ExcludedNode, RestartPlan
from monitor_agent.records.types import Finding, LauncherDeclaration, Severity

RESTART = Rule(name="Restart", types=("hang", "gpu_health", "nan_inf"), channels=("console",),
               cooldown=60, repeat_interval=3600, resolve_after=600, action="restart")
ELASTIC = LauncherDeclaration("torchrun", True, 0, 5, min_nodes=1, max_nodes=4)
NODES = tuple(NodeView(n, f"gpu-node-{n}", f"sc{n}" if n else None, (2 * n, 2 * n + 1))
              for n in range(4))
RUN = RunContext("job", clean_checkpoints=((100, "/c/100.pt"), (200, "/c/200.pt")),
                 checkpoint_positions={100: 110, 200: 220}, world=8, nodes=NODES,
                 launcher=ELASTIC, skipped=((150, 160),))


def hang(step: int = 250, gone: tuple[int, ...] = (), phase: str = "backward",
         stuck: dict[int, str] | None = None) -> Finding:
    stuck = stuck if stuck is not None else {r: "c10d:all_reduce" for r in range(8)
                                             if r not in gone}
    table = {str(r): {"state": "hung", "stuck_in": where, "phase": phase}
             for r, where in stuck.items()}
    table.update({str(r): {"state": "gone"} for r in gone})
    return Finding("hang", Severity.CRITICAL, "job", step=step, rank=min(gone or stuck),
                   message="hung", evidence={"hung_ranks": sorted(stuck),
                                             "gone_ranks": list(gone), "ranks": table})


def xid(rank: int = 5, step: int = 250, code: int = 79) -> Finding:
    return Finding("gpu_health", Severity.CRITICAL, "job", step=step, rank=rank, message="xid",
                   evidence={"condition": "xid", "xid_last": code})


def restarted(at: float, plan: RestartPlan, resumed: int | None = None) -> Past:
    return Past(at, "exclude" if plan.exclude else "restart", plan, honoured_step=resumed)


def plan_of(decision: Restart | Stop | Hold) -> RestartPlan:
    assert isinstance(decision, Restart), decision
    return decision.plan


def test_a_hang_restarts_every_rank_from_the_last_clean_checkpoint_keeping_old_windows():
    plan = plan_of(decide(RESTART, hang(), RUN, (), now=0.0))
    assert (plan.cause, plan.ranks, plan.nodes, plan.checkpoint_step, plan.checkpoint_path,
            plan.resume_position, plan.skip, plan.exclude) == (
        "hang", 8, 4, 200, "/c/200.pt", 220, ((150, 160),), ())


def test_a_gpu_fault_resumes_from_before_its_step_and_leaves_its_node_out():
    decision = decide(RESTART, xid(rank=5, step=200), RUN, (), now=0.0)
    assert isinstance(decision, Restart) and decision.kind == "exclude"
    plan = decision.plan
    # The checkpoint of the fault's own step may hold what the failing GPU computed.
    assert plan.checkpoint_step == 100
    assert plan.exclude == (ExcludedNode(2, "gpu-node-2", "sc2", (4, 5),
                                         "hard GPU error (xid 79) at step 200"),)
    assert plan.fault_node == 2 and plan.fault_host == "gpu-node-2"


def test_a_gpu_error_that_is_not_critical_restarts_without_leaving_the_node_out():
    soft = replace(xid(), severity=Severity.ERROR, evidence={"condition": "xid", "xid_last": 13})
    assert plan_of(decide(RESTART, soft, RUN, (), now=0.0)).exclude == ()


def test_one_hang_never_leaves_a_node_out_the_second_on_the_same_node_within_the_hour_does():
    first = plan_of(decide(RESTART, hang(gone=(3,)), RUN, (), now=0.0))
    assert first.exclude == () and first.fault_node == 1
    past = (restarted(0.0, first, resumed=201),)
    again = decide(RESTART, hang(step=900, gone=(2,)), RUN, past, now=1800.0)
    assert isinstance(again, Restart) and again.kind == "exclude"
    assert [n.node for n in again.plan.exclude] == [1]
    assert "2nd incident on it within 1 h" in again.plan.exclude[0].why
    later = decide(RESTART, hang(step=900, gone=(2,)), RUN, past, now=3700.0)
    assert plan_of(later).exclude == ()  # an hour later: unrelated


def test_the_same_node_is_told_by_its_host_when_node_ranks_moved():
    first = plan_of(decide(RESTART, hang(gone=(3,)), RUN, (), now=0.0))  # gpu-node-1
    moved = replace(RUN, nodes=tuple(replace(n, host=f"gpu-node-{(n.node + 1) % 4}")
                                     for n in NODES))
    # Node rank 1 is gpu-node-2 now: not the node at fault before.
    again = decide(RESTART, hang(step=900, gone=(2,)), moved,
                   (restarted(0.0, first, resumed=201),), now=60.0)
    assert plan_of(again).exclude == ()


def test_a_run_on_one_node_cannot_blame_its_node_for_a_second_hang():
    one = replace(RUN, nodes=(), world=2)
    first = plan_of(decide(RESTART, hang(stuck={0: "a", 1: "b"}), one, (), now=0.0))
    again = decide(RESTART, hang(step=900, stuck={0: "a", 1: "b"}), one,
                   (restarted(0.0, first, resumed=201),), now=60.0)
    assert plan_of(again).exclude == ()


def test_the_same_fault_soon_after_the_resume_stops_instead_of_looping():
    first = plan_of(decide(RESTART, hang(), RUN, (), now=0.0))
    decision = decide(RESTART, hang(step=290), RUN, (restarted(0.0, first, 201),), now=60.0)
    assert isinstance(decision, Stop)
    assert decision.why.startswith("the restart did not cure it: hang again at step 290, "
                                   "89 steps after the restart resumed at step 201")
    # With a node to blame (its rank gone again), leaving it out is the next remedy.
    gone = plan_of(decide(RESTART, hang(gone=(3,)), RUN, (), now=0.0))
    again = decide(RESTART, hang(step=290, gone=(3,)), RUN, (restarted(0.0, gone, 201),),
                   now=60.0)
    assert isinstance(again, Restart) and again.kind == "exclude"
    # A fault of another kind, or past restart_cure_steps, is a new one.
    assert isinstance(decide(RESTART, xid(step=290), RUN, (restarted(0.0, first, 201),),
                             now=60.0), Restart)
    assert isinstance(decide(RESTART, hang(step=302), RUN, (restarted(0.0, first, 201),),
                             now=60.0), Restart)


def test_the_restart_budget_per_hour_then_stop():
    plan = plan_of(decide(RESTART, hang(), RUN, (), now=0.0))
    past = tuple(restarted(t, plan, resumed=1000 * i) for i, t in enumerate((0.0, 600.0), 1))
    third = decide(RESTART, hang(step=5000), RUN, past, now=1200.0)
    assert plan_of(third).number == 3
    past += (restarted(1200.0, plan, resumed=3000),)
    fourth = decide(RESTART, hang(step=5000), RUN, past, now=1800.0)
    assert isinstance(fourth, Stop)
    assert fourth.why == "restart budget spent (3 within 1 h): stopping; a human must look"
    assert isinstance(decide(RESTART, hang(step=5000), RUN, past, now=3700.0), Restart)


@pytest.mark.parametrize("phase,what", [("checkpoint", "checkpoint save"),
                                        ("eval", "evaluation")])
def test_a_rank_in_a_slow_phase_holds_the_restart(phase, what):
    found = decide(RESTART, hang(stuck={0: "torch/serialization.py:save", 1: "c10d:all_reduce"},
                                 phase=phase), RUN, (), now=0.0)
    assert isinstance(found, Hold)
    assert found.why.startswith(f"no restart: rank 0 is in its {what} (phase {phase})")


@pytest.mark.parametrize("launcher,said", [
    (None, "its ranks did not say they can be restarted"),
    (LauncherDeclaration("torchrun", False, 3, 3), "its launcher (torchrun) does not run it "
                                                   "again on exit status 75")])
def test_a_job_its_launcher_will_not_run_again_is_not_restarted(launcher, said):
    found = decide(RESTART, hang(), replace(RUN, launcher=launcher), (), now=0.0)
    assert isinstance(found, Hold) and said in found.why


def test_leaving_a_node_out_below_the_jobs_minimum_stops_unless_a_scheduler_replaces_it():
    static = replace(RUN, launcher=LauncherDeclaration("torchrun", True, 0, 3))
    stopped = decide(RESTART, xid(), static, (), now=0.0)
    assert isinstance(stopped, Stop)
    assert stopped.why.startswith("leaving node 2 (gpu-node-2) out leaves 3 nodes, below the "
                                  "job's minimum of 4")
    slurm = replace(RUN, launcher=LauncherDeclaration("slurm", True, 0))
    assert plan_of(decide(RESTART, xid(), slurm, (), now=0.0)).left == 3


def test_past_the_exclude_budget_the_run_stops():
    first = plan_of(decide(RESTART, xid(rank=5), RUN, (), now=0.0))
    assert len(first.exclude) == 1  # 4 nodes: a budget of 1 (a tenth, at least one)
    second = decide(RESTART, xid(rank=1, step=900), RUN, (restarted(0.0, first, 201),),
                    now=60.0)
    assert isinstance(second, Stop) and "exclude_budget 1" in second.why
    wider = replace(RESTART, exclude_budget=2)
    assert plan_of(decide(wider, xid(rank=1, step=900), RUN, (restarted(0.0, first, 201),),
                          now=60.0)).exclude[0].node == 0


def test_an_exclude_rule_holds_on_a_soft_finding_no_node_verdict_judged():
    """A straggler no node verdict judged (one rank's slow window, a one-node run) is a
    single soft signal: never enough to leave a node out (a one-node run's exclusion would
    stop it: below its minimum)."""
    rule = replace(RESTART, types=("straggler",), action="exclude")
    slow = Finding("straggler", Severity.WARNING, "job", step=300, rank=7, message="slow",
                   evidence={"node_rank": 3})
    decision = decide(rule, slow, RUN, (), now=0.0)
    assert isinstance(decision, Hold) and "one soft signal" in decision.why, decision
    hard = Finding("gpu_health", Severity.CRITICAL, "job", step=300, rank=7, message="xid",
                   evidence={"condition": "xid", "xid_last": 79})
    left = decide(replace(rule, types=("gpu_health",)), hard, RUN, (), now=0.0)
    assert isinstance(left, Restart) and left.plan.exclude[0].node == 3


def test_an_exclude_rule_waits_for_the_node_verdict_to_say_leaving_it_out_pays():
    """The leader's node verdict (runs/node_verdict.py) on the finding: a suspect node is
    not left out; a sick one once its straggler tax paid reaches a restart's cost (ski
    rental), and the plan says the verdict."""
    rule = replace(RESTART, types=("straggler",), action="exclude")

    def slow(state: str, pays: bool) -> Finding:
        words = f"node gpu-node-3: {state} (compute-slow) at step 300: its tax ..."
        return Finding("straggler", Severity.WARNING, "job", step=300, rank=7, message="slow",
                       evidence={"node_verdict": words, "node_state": state,
                                 "node_cause": "compute-slow", "node_exclude_pays": pays})
    held = decide(rule, slow("suspect", True), RUN, (), now=0.0)
    assert isinstance(held, Hold) and "one soft signal" in held.why, held
    unpaid = decide(rule, slow("sick", False), RUN, (), now=0.0)
    assert isinstance(unpaid, Hold) and unpaid.why.startswith("no exclusion yet: node "
                                                                 "gpu-node-3: sick"), unpaid
    paid = decide(rule, slow("sick", True), RUN, (), now=0.0)
    assert isinstance(paid, Restart) and paid.kind == "exclude"
    assert paid.plan.exclude[0].node == 3
    assert paid.plan.exclude[0].why.startswith("node gpu-node-3: sick (compute-slow)")


def test_a_slow_node_that_cannot_be_left_out_holds_instead_of_stopping_the_run():
    """Past the exclude budget (or below the job's minimum) a fail-slow node is trained
    with, at its pace, and the page says why: a stop would cost the whole run. A node
    whose GPU failed still stops it."""
    rule = replace(RESTART, types=("straggler",), action="exclude")
    slow = Finding("straggler", Severity.WARNING, "job", step=900, rank=1, message="slow",
                   evidence={"node_verdict": "node gpu-node-0: sick (compute-slow) ...",
                             "node_state": "sick", "node_cause": "compute-slow",
                             "node_exclude_pays": True})
    first = plan_of(decide(rule, xid(rank=7, step=300), RUN, (), now=0.0))
    held = decide(rule, slow, RUN, (restarted(0.0, first, 301),), now=60.0)
    assert isinstance(held, Hold), held
    assert "exclude_budget 1" in held.why and held.why.endswith(
        "a slow node costs less than a stopped run: training on at its pace"), held.why
    failed = decide(RESTART, xid(rank=1, step=900), RUN, (restarted(0.0, first, 301),),
                    now=60.0)
    assert isinstance(failed, Stop) and "exclude_budget 1" in failed.why, failed


def test_a_straggler_on_a_node_sick_of_an_earlier_death_holds_rather_than_stopping():
    """Seen on the namespace cluster: a node whose one rank was killed in attempt 1 (sick,
    gone), back in the job since, is its straggler after another node was left out. Past
    the exclude budget its ranks train on, late, as any slow node's: no stop."""
    rule = replace(RESTART, types=("straggler",), action="exclude")
    late = Finding("straggler", Severity.WARNING, "job", step=900, rank=1, message="slow",
                   evidence={"cause": "collective",
                             "node_verdict": "node gpu-node-0: sick (gone) at step 11: ...",
                             "node_state": "sick", "node_cause": "gone"})
    first = plan_of(decide(rule, xid(rank=7, step=300), RUN, (), now=0.0))
    held = decide(rule, late, RUN, (restarted(0.0, first, 301),), now=60.0)
    assert isinstance(held, Hold) and "exclude_budget 1" in held.why, held


def test_no_clean_checkpoint_restarts_from_the_start():
    plan = plan_of(decide(RESTART, hang(step=50), RUN, (), now=0.0))
    assert (plan.checkpoint_step, plan.checkpoint_path, plan.resume_position) == (
        None, None, None)
    assert plan.describe().startswith("restart all 8 ranks from the start (no clean checkpoint")


def test_a_partial_view_never_restarts(tmp_path):
    """A finding made without every node in view (a node not heard) pages, saying so, and
    no rule acts on it: a restart decided then could leave ranks behind."""
    from prometheus_client import CollectorRegistry

    from monitor_agent.alerting import Alerting, AlertingSettings

    rules = tmp_path / "rules.yaml"
    rules.write_text("routes: {page: [console]}\nrules:\n  - {name: Restart, match: {types: "
                     "[hang]}, severity: critical, fingerprint: [], action: restart}\n")
    alerting = Alerting(AlertingSettings(rules_file=str(rules)), ":memory:",
                        CollectorRegistry())
    partial = hang(gone=(3,)).seen_partially("node 1 (gpu-node-1) not heard from for 12 s")
    assert alerting.handle(RUN, [partial], now=0.0) == []
    assert alerting.handle(RUN, [hang(gone=(3,))], now=1.0)[0].action == "restart"


def _table(rows: dict[int, tuple[str, str]]) -> Finding:
    """A hang as the detector words it: each rank's row (state, the frame a hung rank is
    stuck in; a running rank has no frame), in the detector's own order (by rank)."""
    table = {str(r): ({"state": state, "stuck_in": where, "phase": "backward"}
                      if state == "hung" else {"state": state})
             for r, (state, where) in rows.items()}
    hung = sorted(r for r, (state, _) in rows.items() if state == "hung")
    return Finding("hang", Severity.CRITICAL, "job", step=250, rank=min(hung), message="hung",
                   evidence={"hung_ranks": hung, "gone_ranks": [], "ranks": table})


def test_a_hang_names_the_node_of_the_rank_stuck_elsewhere_than_the_other_hung_ranks():
    """Ranks 0 and 1 wait in the all-reduce for rank 5, stuck in its data loader; the ranks
    still running say nothing about where the hang is. Rank 5's node is the one at fault,
    and a second such incident there leaves it out."""
    rows = {r: ("running", "") for r in range(8)}
    rows.update({0: ("hung", "c10d:all_reduce"), 1: ("hung", "c10d:all_reduce"),
                 5: ("hung", "data.py:__next__")})
    first = plan_of(decide(RESTART, _table(rows), RUN, (), now=0.0))
    assert (first.cause, first.fault_node, first.fault_host, first.exclude) == (
        "hang", 2, "gpu-node-2", ())
    again = decide(RESTART, replace(_table(rows), step=900), RUN,
                   (restarted(0.0, first, resumed=201),), now=60.0)
    assert [n.node for n in plan_of(again).exclude] == [2]


def test_a_hang_where_every_rank_waits_in_one_place_or_that_lists_no_ranks_names_no_node():
    assert plan_of(decide(RESTART, hang(), RUN, (), now=0.0)).fault_node is None
    bare = Finding("hang", Severity.CRITICAL, "job", step=250, rank=0, message="hung",
                   evidence={"hung_ranks": list(range(8)), "gone_ranks": []})
    plan = plan_of(decide(RESTART, bare, RUN, (), now=0.0))
    assert (plan.cause, plan.fault_node, plan.checkpoint_step) == ("hang", None, 200)


def test_a_gone_rank_is_the_plans_cause_and_a_hang_resumes_from_its_own_steps_checkpoint():
    """A hang leaves the weights as the last completed step left them: the checkpoint of
    that step is clean, one of a step no rank completed is not."""
    run = replace(RUN, clean_checkpoints=((100, "/c/100.pt"), (200, "/c/200.pt"),
                                          (201, "/c/201.pt")))
    plan = plan_of(decide(RESTART, hang(step=200, gone=(3,)), run, (), now=0.0))
    assert (plan.cause, plan.fault_step, plan.checkpoint_step, plan.fault_node) == (
        "gone", 200, 200, 1)


def gpu(evidence: dict, rank: int = 5, step: int = 250) -> Finding:
    return Finding("gpu_health", Severity.CRITICAL, "job", step=step, rank=rank,
                   message="gpu", evidence=evidence)


@pytest.mark.parametrize("evidence,cause", [
    ({"condition": "ecc_uncorrectable"}, "ecc_uncorrectable"),
    ({"condition": "gpu_lost", "xid_last": 79}, "gpu_lost"),  # the XID came with the loss
    ({"xid_last": 48}, "xid 48"),  # a condition not said: an XID's
    ({"condition": "xid"}, "xid")])  # its code unknown
def test_a_hard_gpu_fault_is_named_by_its_condition_in_the_plan_and_why_its_node_is_left_out(
        evidence, cause):
    plan = plan_of(decide(RESTART, gpu(evidence), RUN, (), now=0.0))
    assert (plan.cause, plan.fault_step, plan.fault_node) == (cause, 250, 2)
    assert plan.exclude[0].why == f"hard GPU error ({cause}) at step 250"


def test_the_plan_carries_the_fault_the_attempt_it_restarts_and_the_budget_it_spends():
    """What the client and the actions endpoint read of the decision."""
    rule = replace(RESTART, restart_budget=5, restart_window=1800.0)
    nan = Finding("nan_inf", Severity.CRITICAL, "job", step=250, rank=0, message="NaN",
                  evidence={"onset_step": 150})
    plan = plan_of(decide(rule, nan, replace(RUN, attempt=3), (), now=0.0))
    assert (plan.cause, plan.fault_step, plan.checkpoint_step, plan.attempt, plan.number,
            plan.budget, plan.window_seconds) == ("nan_inf", 250, 100, 3, 1, 5, 1800.0)


@pytest.mark.parametrize("run,positions,resume,unit", [
    (RUN, {100: 110, 200: 220}, 220, "steps"),  # earlier windows: in their own unit
    (replace(RUN, skipped=()), {100: 110, 200: 220}, 220, "positions"),
    (replace(RUN, skipped=()), {}, 200, "steps")])  # no data positions: by step
def test_the_resume_point_is_a_data_position_when_the_run_reports_them_else_a_step(
        run, positions, resume, unit):
    run = replace(run, checkpoint_positions=positions, skipped_unit="steps")
    plan = plan_of(decide(RESTART, hang(), run, (), now=0.0))
    assert (plan.checkpoint_step, plan.resume_position, plan.positions) == (200, resume, unit)


def test_a_single_process_job_is_restarted_as_the_job():
    plan = plan_of(decide(RESTART, hang(stuck={0: "a"}), replace(RUN, world=1, nodes=()), (),
                          now=0.0))
    assert plan.ranks == 1
    assert plan.describe().startswith("restart the job from checkpoint 200")


def test_the_node_the_evidence_names_is_left_out_rather_than_the_node_of_the_findings_rank():
    """A node verdict is about a node (evidence ``node_rank``): the rank it was reported
    with may run elsewhere."""
    rule = replace(RESTART, types=("straggler",), action="exclude")
    slow = Finding("straggler", Severity.WARNING, "job", step=300, rank=1, message="slow",
                   evidence={"node_rank": 2, "node_verdict": "node gpu-node-2: sick",
                             "node_state": "sick", "node_cause": "compute-slow",
                             "node_exclude_pays": True})
    assert [n.node for n in plan_of(decide(rule, slow, RUN, (), now=0.0)).exclude] == [2]


def test_a_node_judged_sick_without_the_verdicts_words_is_left_out_saying_what_judged_it():
    rule = replace(RESTART, types=("straggler",), action="exclude")
    slow = Finding("straggler", Severity.WARNING, "job", step=300, rank=7, message="slow",
                   evidence={"node_state": "sick", "node_exclude_pays": True})
    [node] = plan_of(decide(rule, slow, RUN, (), now=0.0)).exclude
    assert (node.node, node.why) == (3, "straggler judged on it")


@pytest.mark.parametrize("run,rank,evidence", [
    (RUN, 9, {"condition": "xid", "xid_last": 79}),  # a rank no node lists
    (RUN, 5, {"condition": "xid", "xid_last": 79, "node_rank": 9}),  # a node not heard
    (replace(RUN, nodes=()), 1, {"condition": "xid", "xid_last": 79, "node_rank": 3})])
def test_a_fault_on_a_node_the_leader_does_not_know_restarts_and_leaves_no_node_out(
        run, rank, evidence):
    """Never the leader's own node (or any other) in its place: a restart that leaves the
    wrong node out loses a good node and keeps the bad one."""
    decision = decide(RESTART, gpu(evidence, rank=rank), run, (), now=0.0)
    assert isinstance(decision, Restart) and decision.kind == "restart", decision
    assert decision.plan.exclude == ()


def test_a_one_node_job_with_a_hard_gpu_error_stops_unless_its_scheduler_gives_it_a_node():
    one = replace(RUN, nodes=(), world=2)
    stopped = decide(RESTART, xid(rank=1), one, (), now=0.0)
    assert isinstance(stopped, Stop), stopped
    assert stopped.why == ("leaving node 0 out leaves 0 nodes, below the job's minimum of 1: "
                           "stopping; a human must look")
    queued = decide(RESTART, xid(rank=1), replace(one, launcher=LauncherDeclaration(
        "slurm", True, 0)), (), now=0.0)
    assert isinstance(queued, Restart) and queued.kind == "exclude"
    assert queued.plan.exclude == (ExcludedNode(0, None, None, (), "hard GPU error (xid 79) "
                                                                  "at step 250"),)


def test_leaving_a_node_out_down_to_the_jobs_minimum_restarts():
    at_least_three = replace(RUN, launcher=LauncherDeclaration("torchrun", True, 0, 5,
                                                               min_nodes=3))
    decision = decide(RESTART, xid(), at_least_three, (), now=0.0)
    assert isinstance(decision, Restart) and decision.plan.left == 3


def test_leaving_a_node_out_of_a_two_node_job_that_needs_both_stops_saying_one_node_is_left():
    two = replace(RUN, nodes=NODES[:2], world=4,
                  launcher=LauncherDeclaration("torchrun", True, 0, 3))
    stopped = decide(RESTART, xid(rank=3), two, (), now=0.0)
    assert isinstance(stopped, Stop)
    assert stopped.why == ("leaving node 1 (gpu-node-1) out leaves 1 node, below the job's "
                           "minimum of 2: stopping; a human must look")


def test_a_tenth_of_the_nodes_rounded_up_may_be_left_out():
    """11 nodes: 2 may be left out (not 1)."""
    eleven = tuple(NodeView(n, f"gpu-node-{n}", f"sc{n}", (2 * n, 2 * n + 1))
                   for n in range(11))
    run = replace(RUN, nodes=eleven, world=22, launcher=LauncherDeclaration(
        "torchrun", True, 0, 3, min_nodes=1))
    first = plan_of(decide(RESTART, xid(rank=5), run, (), now=0.0))
    second = decide(RESTART, xid(rank=9, step=900), run, (restarted(0.0, first, 201),),
                    now=60.0)
    assert [n.node for n in plan_of(second).exclude] == [4]


def test_past_the_exclude_budget_the_stop_says_how_many_nodes_are_out_already():
    first = plan_of(decide(RESTART, xid(rank=5), RUN, (), now=0.0))
    stopped = decide(RESTART, xid(rank=1, step=900), RUN, (restarted(0.0, first, 201),),
                     now=60.0)
    assert isinstance(stopped, Stop)
    assert stopped.why == ("node 0 (gpu-node-0) should be left out (hard GPU error (xid 79) at "
                           "step 900), but the run has left 1 node out already "
                           "(exclude_budget 1): stopping; a human must look")
    two = replace(RESTART, exclude_budget=2)
    second = plan_of(decide(two, xid(rank=1, step=900), RUN, (restarted(0.0, first, 201),),
                            now=60.0))
    history = (restarted(0.0, first, 201), restarted(60.0, second, 901))
    third = decide(two, xid(rank=3, step=1500), RUN, history, now=120.0)
    assert isinstance(third, Stop)
    assert "but the run has left 2 nodes out already (exclude_budget 2)" in third.why


T0 = 1_700_000_000.0  # the sidecar's wall clock


def test_the_restart_budget_counts_the_restarts_and_exclusions_of_the_last_window():
    gone = plan_of(decide(RESTART, hang(gone=(3,)), RUN, (), now=T0))
    excluded = replace(gone, exclude=(ExcludedNode(1, "gpu-node-1", "sc1", (2, 3), "2nd"),))
    past = tuple(restarted(T0 + t, excluded, resumed=1000 * i)
                 for i, t in enumerate((0.0, 600.0, 1200.0), 1))
    assert all(p.kind == "exclude" for p in past)
    stopped = decide(RESTART, hang(step=5000), RUN, past, now=T0 + 1800.0)
    assert isinstance(stopped, Stop) and stopped.why.startswith("restart budget spent")


def test_an_action_exactly_one_window_old_is_out_of_the_window():
    """Neither counted in the budget nor a second incident on its node."""
    plan = plan_of(decide(RESTART, hang(), RUN, (), now=T0))
    past = tuple(restarted(T0 + t, plan, resumed=1000 * i)
                 for i, t in enumerate((0.0, 10.0, 20.0), 1))
    assert plan_of(decide(RESTART, hang(step=5000), RUN, past, now=T0 + 3600.0)).number == 3
    gone = plan_of(decide(RESTART, hang(gone=(3,)), RUN, (), now=T0))
    later = decide(RESTART, hang(step=900, gone=(2,)), RUN, (restarted(T0, gone, 201),),
                   now=T0 + 3600.0)
    assert plan_of(later).exclude == ()


def test_a_two_node_jobs_node_at_fault_twice_within_the_hour_is_left_out():
    two = replace(RUN, nodes=NODES[:2], world=4)
    first = plan_of(decide(RESTART, hang(gone=(3,)), two, (), now=T0))
    again = decide(RESTART, hang(step=900, gone=(2,)), two, (restarted(T0, first, 201),),
                   now=T0 + 1800.0)
    [node] = plan_of(again).exclude
    assert (node.node, node.why) == (
        1, "2nd incident on it within 1 h (gone at step 250 and at step 900)")


def test_without_hosts_the_same_node_is_told_by_its_node_rank():
    bare = replace(RUN, nodes=tuple(replace(n, host=None) for n in NODES))
    first = plan_of(decide(RESTART, hang(gone=(3,)), bare, (), now=0.0))
    past = (restarted(0.0, first, resumed=201),)
    same = decide(RESTART, hang(step=900, gone=(2,)), bare, past, now=60.0)
    assert [n.node for n in plan_of(same).exclude] == [1]
    other = decide(RESTART, hang(step=900, gone=(5,)), bare, past, now=60.0)
    assert plan_of(other).exclude == ()
    # A host learnt since the first incident: the node rank still tells.
    named = decide(RESTART, hang(step=900, gone=(2,)), RUN, past, now=60.0)
    assert [n.node for n in plan_of(named).exclude] == [1]


def test_a_rollback_on_a_node_then_a_hang_there_is_its_second_incident():
    """A rollback has no restart plan: its own fault node and cause are what compare."""
    bare = replace(RUN, nodes=tuple(replace(n, host=None) for n in NODES))
    rolled = Past(0.0, "rollback", None, honoured_step=301, fault_node=1, fault_step=300,
                  cause="nan_inf")
    again = decide(RESTART, hang(step=900, gone=(2,)), bare, (rolled,), now=60.0)
    [node] = plan_of(again).exclude
    assert (node.node, node.why) == (
        1, "2nd incident on it within 1 h (nan_inf at step 300 and at step 900)")


def test_a_rank_gone_then_every_rank_hung_after_the_resume_is_the_same_fault_not_cured():
    one = replace(RUN, nodes=(), world=8)
    gone = plan_of(decide(RESTART, hang(gone=(3,)), one, (), now=0.0))
    assert gone.cause == "gone"
    stopped = decide(RESTART, hang(step=260), one, (restarted(0.0, gone, 201),), now=60.0)
    assert isinstance(stopped, Stop) and stopped.why.startswith("the restart did not cure it")


def test_one_gpu_error_after_the_resume_of_a_restart_for_another_is_the_same_fault():
    one = replace(RUN, nodes=(), world=8)
    soft = replace(xid(rank=1, code=13), severity=Severity.ERROR)  # no node left out
    first = plan_of(decide(RESTART, soft, one, (), now=0.0))
    remap = replace(gpu({"condition": "row_remap_pending"}, rank=1, step=260),
                    severity=Severity.ERROR)
    stopped = decide(RESTART, remap, one, (restarted(0.0, first, 201),), now=60.0)
    assert isinstance(stopped, Stop), stopped
    assert stopped.why.startswith("the restart did not cure it: row_remap_pending again")


def test_a_fault_back_soon_after_an_exclusion_with_no_node_to_blame_stops():
    gone = plan_of(decide(RESTART, hang(gone=(3,)), RUN, (), now=0.0))
    excluded = plan_of(decide(RESTART, hang(step=900, gone=(2,)), RUN,
                              (restarted(0.0, gone, 201),), now=60.0))
    history = (restarted(0.0, gone, 201), restarted(60.0, excluded, 901))
    stopped = decide(RESTART, hang(step=950), RUN, history, now=120.0)
    assert isinstance(stopped, Stop) and stopped.why.startswith("the restart did not cure it")


def test_a_fault_restart_cure_steps_after_the_resume_is_still_not_cured_one_more_is_new():
    first = plan_of(decide(RESTART, hang(), RUN, (), now=0.0))
    past = (restarted(0.0, first, 201),)
    assert isinstance(decide(RESTART, hang(step=301), RUN, past, now=60.0), Stop)
    assert isinstance(decide(RESTART, hang(step=302), RUN, past, now=60.0), Restart)


def test_a_fault_while_the_last_restart_is_not_carried_out_yet_is_decided_anew():
    first = plan_of(decide(RESTART, hang(), RUN, (), now=0.0))
    second = decide(RESTART, hang(step=250), RUN, (restarted(0.0, first, None),), now=60.0)
    assert plan_of(second).number == 2


def test_a_hang_in_the_resumed_jobs_first_step_is_zero_steps_after_the_resume():
    first = plan_of(decide(RESTART, hang(), RUN, (), now=0.0))
    stopped = decide(RESTART, hang(step=200), RUN, (restarted(0.0, first, 201),), now=60.0)
    assert isinstance(stopped, Stop)
    assert stopped.why == ("the restart did not cure it: hang again at step 200, 0 steps after "
                           "the restart resumed at step 201 (restart_cure_steps 100): stopping; "
                           "a human must look")
