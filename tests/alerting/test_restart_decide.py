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
