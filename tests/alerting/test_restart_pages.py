"""What a page says of a restart decision (alerting/restart.py): the words whoever is paged
reads to know why the run was restarted, held or stopped, and what a repeat is compared by.
The decisions themselves are in test_restart_decide.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from monitor_agent.alerting.alerts import NodeView, RunContext
from monitor_agent.alerting.restart import (
    Hold,
    Past,
    Restart,
    Stop,
    decide,
    fault_of,
    kind_of,
    repeated,
)
from monitor_agent.alerting.rules import Rule
from monitor_agent.records.actions import RestartPlan
from monitor_agent.records.types import Finding, LauncherDeclaration, Severity

RESTART = Rule(name="Restart", types=("hang", "gpu_health", "straggler"),
               channels=("console",), cooldown=60, repeat_interval=3600, resolve_after=600,
               action="restart")
NODES = tuple(NodeView(n, f"gpu-node-{n}", f"sc{n}" if n else None, (2 * n, 2 * n + 1))
              for n in range(4))
RUN = RunContext("job", clean_checkpoints=((100, "/c/100.pt"), (200, "/c/200.pt")), world=8,
                 nodes=NODES, launcher=LauncherDeclaration("torchrun", True, 0, 5, min_nodes=1))


def hang(step: int = 250, gone: tuple[int, ...] = (),
         rows: dict[str, dict] | None = None) -> Finding:
    table = rows if rows is not None else {
        str(r): {"state": "gone"} if r in gone else
        {"state": "hung", "stuck_in": "c10d:all_reduce", "phase": "backward"}
        for r in range(8)}
    return Finding("hang", Severity.CRITICAL, "job", step=step, rank=min(gone or (0,)),
                   message="hung", evidence={"gone_ranks": list(gone), "ranks": table})


def restarts(times: list[float], step: int = 250, node: int | None = 1) -> tuple[Past, ...]:
    """Restarts decided at ``times`` for a rank of ``node`` gone at ``step``."""
    plan = RestartPlan(cause="gone", fault_step=step, ranks=8, nodes=4, fault_node=node,
                       fault_host=f"gpu-node-{node}" if node is not None else None)
    return tuple(Past(t, "restart", plan, honoured_step=step + 1) for t in times)


def test_a_gone_rank_is_a_hang_and_any_gpu_condition_a_gpu_fault_to_a_repeat():
    assert [kind_of(c) for c in ("hang", "gone")] == ["hang", "hang"]
    assert [kind_of(c) for c in ("xid 79", "xid", "gpu_lost", "ecc_uncorrectable",
                                 "row_remap_failure", "row_remap_pending", "pcie_degraded",
                                 "throttle")] == ["gpu"] * 8
    assert [kind_of(c) for c in ("nan_inf", "divergence")] == ["nan_inf", "divergence"]


@pytest.mark.parametrize("n,said", [(2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"),
                                    (12, "12th"), (13, "13th"), (21, "21st"), (22, "22nd"),
                                    (23, "23rd"), (24, "24th")])
def test_the_incident_on_a_node_is_counted_in_english_ordinals(n, said):
    rule = replace(RESTART, restart_window=86400.0)
    fault = fault_of(hang(step=900, gone=(2,)), RUN)
    why = repeated(rule, fault, RUN, restarts([60.0 * i for i in range(n - 1)]), now=3600.0)
    assert why == f"{said} incident on it within 24 h (gone at step 250 and at step 900)"


@pytest.mark.parametrize("window,said", [(90.0, "90 s"), (120.0, "2 min"), (1800.0, "30 min"),
                                         (5400.0, "90 min"), (3600.0, "1 h"),
                                         (90 * 86400.0, "2160 h")])
def test_the_restart_budgets_window_is_said_in_hours_minutes_or_seconds(window, said):
    rule = replace(RESTART, restart_window=window)
    stopped = decide(rule, hang(step=5000), RUN, restarts([0.0, 1.0, 2.0], node=None),
                     now=3.0)
    assert isinstance(stopped, Stop)
    assert stopped.why == f"restart budget spent (3 within {said}): stopping; a human must look"


def test_a_hold_for_a_slow_phase_names_the_first_rank_in_it_whatever_order_the_ranks_are_listed():
    rows = {"3": {"state": "hung", "stuck_in": "eval.py:run", "phase": "eval"},
            "1": {"state": "hung", "stuck_in": "torch/serialization.py:save",
                  "phase": "checkpoint"},
            "0": {"state": "hung", "stuck_in": "c10d:all_reduce", "phase": "backward"}}
    held = decide(RESTART, hang(rows=rows), RUN, (), now=0.0)
    assert isinstance(held, Hold)
    assert held.why == ("no restart: rank 1 is in its checkpoint save (phase checkpoint); a "
                        "slow evaluation or checkpoint save is not a fault to restart for")


def test_a_hold_for_a_slow_phase_orders_ranks_as_numbers_not_as_text():
    rows = {"10": {"state": "hung", "stuck_in": "eval.py:run", "phase": "eval"},
            "2": {"state": "hung", "stuck_in": "torch/serialization.py:save",
                  "phase": "checkpoint"}}
    held = decide(RESTART, hang(rows=rows), RUN, (), now=0.0)
    assert isinstance(held, Hold)
    assert held.why.startswith("no restart: rank 2 is in its checkpoint save"), held.why


def test_a_job_whose_ranks_did_not_say_they_can_be_restarted_is_held_saying_so():
    held = decide(RESTART, hang(), replace(RUN, launcher=None), (), now=0.0)
    assert isinstance(held, Hold)
    assert held.why == ("no restart: its ranks did not say they can be restarted (a client "
                        "older than the restart action); restart it from its last clean "
                        "checkpoint by hand")


def test_an_exclude_rule_on_a_soft_finding_no_verdict_judged_says_why_it_holds():
    rule = replace(RESTART, types=("straggler",), action="exclude")
    slow = Finding("straggler", Severity.WARNING, "job", step=300, rank=7, message="slow")
    held = decide(rule, slow, RUN, (), now=0.0)
    assert isinstance(held, Hold)
    assert held.why == ("no exclusion: no node verdict on straggler at step 300; one soft "
                        "signal is not enough to leave a node out")


def test_a_slow_node_past_the_exclude_budget_holds_saying_why_without_the_stop():
    xid = Finding("gpu_health", Severity.CRITICAL, "job", step=300, rank=7, message="xid",
                  evidence={"condition": "xid", "xid_last": 79})
    out = decide(RESTART, xid, RUN, (), now=0.0)
    assert isinstance(out, Restart) and out.kind == "exclude"  # node 3: the budget of 1
    rule = replace(RESTART, types=("straggler",), action="exclude")
    slow = Finding("straggler", Severity.WARNING, "job", step=900, rank=1, message="slow",
                   evidence={"node_verdict": "node gpu-node-0: sick (compute-slow)",
                             "node_state": "sick", "node_cause": "compute-slow",
                             "node_exclude_pays": True})
    held = decide(rule, slow, RUN, (Past(0.0, "exclude", out.plan, honoured_step=301),),
                  now=60.0)
    assert isinstance(held, Hold)
    assert held.why == ("no exclusion: node 0 (gpu-node-0) should be left out (node gpu-node-0: "
                        "sick (compute-slow)), but the run has left 1 node out already "
                        "(exclude_budget 1); a slow node costs less than a stopped run: "
                        "training on at its pace")
