"""Episodes (alerting/episodes.py): how findings become one alert's episode, and when it
pages, repeats, resolves or closes, read on the real Alerting and its SQLite store.

Not started: nothing is delivered, and what people would hear is read from the outbox's
rows, each a notification as the channel gets it, so a test says exactly what went out
and when (a fake clock, no threads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from monitor_agent.alerting import Alerting, AlertingSettings, RunContext
from monitor_agent.alerting.alerts import StoredAlert
from monitor_agent.alerting.rollback import ROLLBACK_WAIT_SECONDS
from monitor_agent.notify.base import AlertEvent, Notification
from monitor_agent.records import wire
from monitor_agent.records.types import Finding, Severity

T0 = 1_700_000_000.0
RUN = RunContext("r1", project="proj", labels={"team": "nlp"})


def _alerting(tmp_path: Path, rules: str | None = None, **settings: Any) -> Alerting:
    """Alerting on a file database, console and Alertmanager channels, no group wait."""
    if rules is not None:
        (tmp_path / "rules.yaml").write_text(rules)
        settings["rules_file"] = tmp_path / "rules.yaml"
    settings.setdefault("group_wait_seconds", 0)
    return Alerting(AlertingSettings(console={"enabled": True}, **settings),
                    tmp_path / "alerts.sqlite", CollectorRegistry(), clock=lambda: T0)


def _sent(alerting: Alerting, channel: str = "console") -> list[Notification]:
    """What ``channel`` was given to send, oldest first."""
    rows = alerting.db.query("SELECT body FROM outbox WHERE channel = ? ORDER BY id",
                             (channel,))
    return [Notification.from_dict(wire.loads(r["body"])) for r in rows]


def _events(alerting: Alerting, channel: str = "console") -> list[AlertEvent]:
    return [e for note in _sent(alerting, channel) for e in note.events]


def _said(alerting: Alerting) -> list[tuple[str, str, str]]:
    """(status, alert name, reason) of each event sent on the console, oldest first."""
    return [(e.status, e.alertname, e.reason) for e in _events(alerting)]


def _alert(alerting: Alerting, run_id: str = "r1") -> StoredAlert:
    [alert] = alerting.store.alerts(run_id=run_id)
    return alert


def _decisions(alerting: Alerting) -> dict[str, float]:
    """monitor_agent_alert_decisions_total by reason."""
    return {s.labels["reason"]: s.value for m in alerting.metrics.decisions.collect()
            for s in m.samples if s.name.endswith("_total")}


def nan(step: int = 10, run_id: str = "r1", **kw: Any) -> Finding:
    return Finding("nan_inf", Severity.CRITICAL, run_id, step=step, message="loss is NaN", **kw)


def spike(step: int = 10, run_id: str = "r1", **kw: Any) -> Finding:
    return Finding("loss_spike", Severity.WARNING, run_id, step=step,
                   message="loss 4.2 is 2.0x its EMA", **kw)


# -- preview: an episode begun by a record sent ahead of its turn ---------------------------


def test_a_preview_begins_each_finding_a_rule_takes_past_one_none_takes(tmp_path):
    alerting = _alerting(tmp_path)
    unmatched = Finding("plateau2", Severity.INFO, "r1", step=150, message="m")
    assert alerting.preview(RUN, [unmatched, nan(step=150), spike(step=150)], T0) == 2
    assert sorted((a.rule, a.state, a.count) for a in alerting.store.alerts()) == [
        ("TrainingLossSpike", "pending", 0), ("TrainingNanInf", "pending", 0)]


def test_a_previewed_findings_in_order_copy_is_its_episodes_first_not_a_second(tmp_path):
    alerting = _alerting(tmp_path)
    alerting.preview(RUN, [nan(step=150)], T0)
    alerting.handle(RUN, [nan(step=150)], T0 + 1)
    alerting.flush(T0 + 2)
    assert (_alert(alerting).count, _alert(alerting).state) == (1, "firing")
    [page] = _events(alerting)
    assert (page.status, page.count, page.step) == ("firing", 1, 150)


def test_a_preview_leaves_an_open_episode_as_it_is(tmp_path):
    alerting = _alerting(tmp_path)
    alerting.handle(RUN, [nan(step=10)], T0)
    alerting.flush(T0)
    assert alerting.preview(RUN, [nan(step=150)], T0 + 5) == 0
    alert = _alert(alerting)
    assert (alert.state, alert.count, alert.last_step, alert.started_at) == (
        "firing", 1, 10, T0)
    alerting.flush(T0 + 6)
    assert len(_events(alerting)) == 1  # no second page


def test_a_preview_begins_a_new_episode_of_a_resolved_alert(tmp_path):
    alerting = _alerting(tmp_path)
    alerting.handle(RUN, [nan(step=10)], T0)
    alerting.tick(T0 + 600)  # resolved after 10 quiet minutes
    assert _alert(alerting).state == "resolved"
    assert alerting.preview(RUN, [nan(step=150)], T0 + 700) == 1
    alert = _alert(alerting)
    assert (alert.state, alert.count, alert.started_at) == ("pending", 0, T0 + 700)


# -- acknowledge ------------------------------------------------------------------------------


def test_an_acknowledgement_by_nobody_named_is_someones(tmp_path):
    alerting = _alerting(tmp_path)
    alerting.handle(RUN, [nan()], T0)
    alerting.flush(T0)
    assert alerting.acknowledge(_alert(alerting).fingerprint, by="").acked_by == "someone"
    [_, ack] = _events(alerting)
    assert (ack.status, ack.reason, ack.acked_by) == ("acknowledged", "acknowledged", "someone")


def test_acknowledging_a_page_nobody_got_tells_nobody(tmp_path):
    alerting = _alerting(tmp_path)
    alerting.add_silence(run_id="r1", duration=3600, comment="known")
    alerting.handle(RUN, [nan()], T0)
    alerting.flush(T0)
    alert = _alert(alerting)
    assert (alert.state, alert.notified) == ("firing", None)  # silenced: fired quietly
    assert alerting.acknowledge(alert.fingerprint, by="ana").acked_by == "ana"
    assert _events(alerting) == []


# -- a new attempt: what it abandoned closes, saying so ---------------------------------------


def divergence(step: int, run_id: str = "r1") -> Finding:
    return Finding("divergence", Severity.ERROR, run_id, step=step,
                   message="loss rose 3 steps in a row")


def crashed(step: int, run_id: str = "r1") -> Finding:
    return Finding("crashed", Severity.ERROR, run_id, step=step, message="rank 0 exited 1")


def _resumed_at_100(tmp_path: Path) -> Alerting:
    """Run r1 with a divergence page begun at step 90 (seen until 120), then, still in
    their group wait, a crash at step 130 and a NaN at step 100; run r2 with a NaN at 200."""
    alerting = _alerting(tmp_path, group_wait_seconds=30)
    alerting.handle(RUN, [divergence(90)], T0)
    alerting.handle(RUN, [divergence(120)], T0 + 1)  # pending: the step it began stays the news
    alerting.flush(T0 + 30)
    alerting.handle(RUN, [crashed(130)], T0 + 40)
    alerting.handle(RUN, [nan(step=100)], T0 + 40)
    alerting.handle(RunContext("r2"), [nan(step=200, run_id="r2")], T0 + 40)
    return alerting


def test_a_resume_closes_the_alerts_about_steps_it_abandoned_after_paging_them(tmp_path):
    alerting = _resumed_at_100(tmp_path)
    alerting.attempt_settled("r1", start_step=100, now=T0 + 45)
    states = {a.rule: (a.state, a.last_step) for a in alerting.store.alerts(run_id="r1")}
    assert states == {
        "TrainingDivergence": ("firing", 99),  # began at 90, before the resume: still open
        "TrainingNanInf": ("resolved", 99),    # at the resumed step itself: abandoned
        "TrainingCrashed": ("firing", 99),     # the process died: its relaunch closes it
    }  # (each seen last, in the history kept, at the step before the resume)
    assert _alert(alerting, "r2").state == "firing"  # another run's: paged, not closed
    nan_events = [e for e in _events(alerting) if e.alertname == "TrainingNanInf"]
    # Its page goes out first (the group wait is cut short), then its resolve.
    assert [(e.status, e.run_id) for e in nan_events] == [
        ("firing", "r1"), ("firing", "r2"), ("resolved", "r1")]
    # No action of ours: the job resumed by itself, and the resolve does not say otherwise.
    assert nan_events[2].summary == ("run resumed from step 99 (closed: steps 100 on were "
                                     "abandoned; last finding: loss is NaN)")
    assert nan_events[2].ends_at == T0 + 45


def test_after_a_resume_a_finding_at_the_resumed_step_is_news_not_a_replay(tmp_path):
    alerting = _resumed_at_100(tmp_path)
    alerting.attempt_settled("r1", start_step=100, now=T0 + 45)
    alerting.handle(RUN, [divergence(100)], T0 + 50)
    [div] = [a for a in alerting.store.alerts(run_id="r1") if a.rule == "TrainingDivergence"]
    assert (div.count, div.last_step) == (3, 100)


def test_a_relaunch_closes_the_crash_page_saying_what_was_done(tmp_path):
    alerting = _resumed_at_100(tmp_path)
    alerting.attempt_settled("r1", start_step=100, now=T0 + 45)
    assert alerting.relaunched("r1", "relaunched by torchrun", start_step=100, now=T0 + 46)
    [crash] = [a for a in alerting.store.alerts(run_id="r1") if a.rule == "TrainingCrashed"]
    assert crash.state == "resolved"
    [resolve] = [e for e in _events(alerting)
                 if e.alertname == "TrainingCrashed" and e.status == "resolved"]
    assert resolve.summary == ("relaunched by torchrun (closed: steps 100 on were abandoned; "
                               "last finding: rank 0 exited 1)")
    assert resolve.reason == "resolved" and resolve.ends_at == T0 + 46
    assert not alerting.relaunched("r1", "again", start_step=100, now=T0 + 47)  # none open


def test_a_relaunch_closes_only_its_own_runs_crash_abandoned_from_its_own_step(tmp_path):
    alerting = _alerting(tmp_path)
    alerting.handle(RUN, [crashed(100)], T0)
    alerting.handle(RunContext("r2"), [crashed(100, run_id="r2")], T0)
    assert alerting.relaunched("r1", "relaunched by torchrun", start_step=100, now=T0 + 1)
    assert {a.run_id: a.state for a in alerting.store.alerts()} == {
        "r1": "resolved", "r2": "firing"}
    [resolve] = [e for e in _events(alerting) if e.status == "resolved"]
    assert resolve.summary.startswith("relaunched by torchrun (closed: steps 100 on were "
                                      "abandoned;")


def test_a_relaunch_from_after_the_crash_says_the_run_runs_again(tmp_path):
    alerting = _alerting(tmp_path, group_wait_seconds=30)
    alerting.handle(RUN, [crashed(80)], T0)
    # What is pending is paged first: the crash is news even within its group wait.
    assert alerting.relaunched("r1", "relaunched by slurm", start_step=100, now=T0 + 1)
    assert [(e.status, e.summary) for e in _events(alerting)] == [
        ("firing", "rank 0 exited 1"),
        ("resolved", "relaunched by slurm (closed: it runs again; last finding: "
                     "rank 0 exited 1)")]
    assert _decisions(alerting)["resolved"] == 1
    assert alerting.flush(T0 + 2) is None  # paged early, closed: nothing left to wait for


def test_a_leader_back_takes_over_this_nodes_partial_view_pages_closing_them_quietly(tmp_path):
    alerting = _alerting(tmp_path)
    partial = nan(step=10).seen_partially("the run's leader is away")
    alerting.handle(RUN, [divergence(12), partial], T0)
    alerting.handle(RunContext("r2"), [nan(step=10, run_id="r2").seen_partially("away")], T0)
    alerting.flush(T0)
    sent = len(_events(alerting))
    assert alerting.hand_over("r1", T0 + 5) == 1
    states = {(a.run_id, a.rule): a.state for a in alerting.store.alerts()}
    assert states == {("r1", "TrainingNanInf"): "resolved", ("r1", "TrainingDivergence"): "firing",
                      ("r2", "TrainingNanInf"): "firing"}
    assert len(_events(alerting)) == sent  # the leader's resolve is the one that goes out
    [mine] = [a for a in alerting.store.alerts(state="resolved")]
    assert (mine.resolved_at, mine.notified) == (T0 + 5, "firing")  # its resolve: not ours
    assert _decisions(alerting)["handed_over"] == 1


def test_a_leader_back_takes_over_a_partial_view_page_still_in_its_group_wait(tmp_path):
    alerting = _alerting(tmp_path, group_wait_seconds=30)
    alerting.handle(RUN, [nan(step=10).seen_partially("the run's leader is away")], T0)
    assert alerting.hand_over("r1", T0 + 1) == 1
    assert _alert(alerting).state == "resolved"
    alerting.flush(T0 + 30)
    assert _events(alerting) == []


# -- the group wait ---------------------------------------------------------------------------


def test_a_runs_alerts_wait_the_group_wait_then_page_together(tmp_path):
    alerting = _alerting(tmp_path, group_wait_seconds=30)
    alerting.handle(RUN, [spike(step=10)], T0)
    alerting.handle(RunContext("r2"), [nan(step=5, run_id="r2")], T0 + 5)
    assert alerting.flush(T0 + 10) == 20.0  # r1's wait ends first
    alerting.handle(RUN, [divergence(11)], T0 + 20)  # joins r1's group, due with its first
    assert _events(alerting) == []
    assert alerting.flush(T0 + 30) == 5.0  # r1 due at its exact end; r2 in 5 s
    [note] = _sent(alerting)
    assert sorted(e.alertname for e in note.events) == ["TrainingDivergence", "TrainingLossSpike"]
    assert alerting.flush(T0 + 35) is None  # r2 paged; nothing left waiting
    assert [n.group for n in _sent(alerting)] == ["r1", "r2"]


# -- cooldown, repeat and resolve -------------------------------------------------------------


COOLDOWN_RULES = """
routes: {page: [console], chat: [console]}
rules:
  - name: Spike
    match: {types: [loss_spike]}
    severity: error
    cooldown: 10m
    resolve_after: 1m
    repeat_interval: 1h
"""


def test_an_alert_back_within_its_cooldown_fires_quietly_until_the_cooldown_ends(tmp_path):
    alerting = _alerting(tmp_path, rules=COOLDOWN_RULES)
    alerting.handle(RUN, [spike(step=1)], T0)
    alerting.flush(T0)
    alerting.tick(T0 + 60)  # quiet for resolve_after: resolved
    assert _said(alerting) == [("firing", "Spike", "first"), ("resolved", "Spike", "resolved")]
    alerting.handle(RUN, [spike(step=2)], T0 + 100)  # back 100 s after its page
    alerting.flush(T0 + 100)
    alert = _alert(alerting)
    assert (alert.state, alert.notified) == ("firing", None)
    assert _decisions(alerting)["cooldown"] == 1
    alerting.handle(RUN, [spike(step=3)], T0 + 590)
    alerting.tick(T0 + 599)
    assert len(_said(alerting)) == 2
    alerting.tick(T0 + 600)  # the cooldown is over, and it still fires: sent now
    assert _said(alerting)[2:] == [("firing", "Spike", "first")]
    assert _alert(alerting).notified_at == T0 + 600


def test_a_firing_alert_is_repeated_after_its_interval_and_resolves_when_quiet(tmp_path):
    alerting = _alerting(tmp_path, rules=COOLDOWN_RULES)
    alerting.handle(RUN, [spike(step=1)], T0)
    alerting.flush(T0)
    for k in range(1, 63):  # a spike every minute less a second: firing throughout
        alerting.handle(RUN, [spike(step=1 + k)], T0 + 59 * k)
        alerting.tick(T0 + 59 * k)
    assert _said(alerting) == [("firing", "Spike", "first"),
                               ("firing", "Spike", "repeat_elapsed")]
    last = T0 + 59 * 62
    assert _alert(alerting).notified_at == last  # the first tick an hour or more after
    alerting.tick(last + 59)
    assert _alert(alerting).state == "firing"
    alerting.tick(last + 60)  # a minute without a spike
    assert _said(alerting)[-1] == ("resolved", "Spike", "resolved")
    resolve = _events(alerting)[-1]
    assert (resolve.ends_at, resolve.summary) == (last + 60, "loss 4.2 is 2.0x its EMA")
    alert = _alert(alerting)
    assert (alert.resolved_at, alert.notified) == (last + 60, "resolved")  # and people know


def test_an_alert_silenced_throughout_resolves_without_a_word(tmp_path):
    alerting = _alerting(tmp_path, rules=COOLDOWN_RULES)
    alerting.add_silence(run_id="r1", duration=3600, comment="known")
    alerting.handle(RUN, [spike(step=1)], T0)
    alerting.flush(T0)
    alerting.tick(T0 + 60)
    assert _alert(alerting).state == "resolved"
    assert _events(alerting) == []
    assert _decisions(alerting)["resolved"] == 1


def test_alertmanager_hears_each_firing_alert_again_every_resend_interval(tmp_path):
    alerting = _alerting(tmp_path, alertmanager={"urls": ["http://am.test:9093"],
                                                 "resend_interval_seconds": 60})
    alerting.handle(RUN, [nan(step=1)], T0)
    alerting.handle(RunContext("r2"), [nan(step=1, run_id="r2")], T0)
    alerting.flush(T0)
    alerting.add_silence(run_id="r2", duration=3600, comment="known")
    alerting.handle(RUN, [nan(step=2)], T0 + 50)
    alerting.tick(T0 + 59)
    assert [(e.run_id, e.reason) for e in _events(alerting, "alertmanager")] == [
        ("r1", "first"), ("r2", "first")]
    alerting.tick(T0 + 60)
    refreshed = _events(alerting, "alertmanager")[2:]
    assert [(e.run_id, e.status, e.reason) for e in refreshed] == [("r1", "firing", "refresh")]
    assert [e.reason for e in _events(alerting)] == ["first", "first"]  # the console: not
    alerting.tick(T0 + 119)
    assert len(_events(alerting, "alertmanager")) == 3
    alerting.tick(T0 + 120)
    assert len(_events(alerting, "alertmanager")) == 4


def test_a_resolve_says_what_the_incident_cost_and_goes_out_without_it_if_costing_fails(
        tmp_path, caplog: pytest.LogCaptureFixture):
    alerting = _alerting(tmp_path, rules=COOLDOWN_RULES)
    asked = []

    def costs(run_id: str, type_: str, step: int, rolled_back: bool) -> str | None:
        asked.append((run_id, type_, step, rolled_back))
        if run_id == "r2":
            raise ValueError("no ledger")
        return "this spike cost 3 min x 8 GPUs = 0.4 GPU-hours"

    alerting.episodes.costs = costs
    alerting.handle(RUN, [spike(step=7)], T0)
    alerting.handle(RunContext("r2"), [spike(step=9, run_id="r2")], T0)
    alerting.flush(T0)
    alerting.tick(T0 + 60)
    assert sorted(asked) == [("r1", "loss_spike", 7, False), ("r2", "loss_spike", 9, False)]
    resolves = {e.run_id: e for e in _events(alerting) if e.status == "resolved"}
    assert resolves["r1"].summary == ("loss 4.2 is 2.0x its EMA; this spike cost 3 min x 8 "
                                      "GPUs = 0.4 GPU-hours")
    assert resolves["r1"].evidence["cost"] == "this spike cost 3 min x 8 GPUs = 0.4 GPU-hours"
    assert resolves["r2"].summary == "loss 4.2 is 2.0x its EMA"
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f"cannot cost the incident of alert {resolves['r2'].fingerprint}"]


def test_an_incident_closed_by_a_resume_is_costed_as_rolled_back(tmp_path):
    alerting = _alerting(tmp_path)
    asked = []
    alerting.episodes.costs = lambda *a: asked.append(a) or None
    alerting.handle(RUN, [nan(step=120)], T0)
    alerting.attempt_settled("r1", start_step=100, now=T0 + 5)
    assert asked == [("r1", "nan_inf", 120, True)]


def test_an_episode_another_sidecar_paged_and_resolved_closes_here_without_a_word(tmp_path):
    alerting = _alerting(tmp_path, rules=COOLDOWN_RULES)
    alerting.handle(RUN, [spike(step=5)], T0, told=True, closed=True)
    alerting.flush(T0)
    alert = _alert(alerting)
    assert (alert.state, alert.notified, alert.resolved_elsewhere) == ("firing", "firing", True)
    alerting.tick(T0 + 60)
    assert _alert(alerting).state == "resolved"
    assert _events(alerting) == []
    assert _decisions(alerting)["told_elsewhere"] == 1


def test_an_alert_whose_stored_finding_lost_its_step_is_not_taken_as_abandoned(tmp_path):
    alerting = _alerting(tmp_path)
    alerting.handle(RUN, [nan(step=5)], T0)
    alerting.flush(T0)
    with alerting.db.tx() as conn:  # written by another version, or damaged
        conn.execute("UPDATE alerts SET finding = ?", (wire.dumps({"message": "loss is NaN"}),))
    alerting.attempt_settled("r1", start_step=1, now=T0 + 5)
    assert _alert(alerting).state == "firing"


def test_a_stored_finding_without_evidence_is_not_taken_for_a_partial_view(tmp_path):
    alerting = _alerting(tmp_path)
    alerting.handle(RUN, [nan(step=5)], T0)
    with alerting.db.tx() as conn:  # written by another version, or damaged
        conn.execute("UPDATE alerts SET finding = ?", (wire.dumps({"message": "loss is NaN"}),))
    assert alerting.hand_over("r1", T0 + 1) == 0
    assert _alert(alerting).state == "pending"


# -- grouping under an open page --------------------------------------------------------------


GROUP_RULES = """
routes: {page: [console], chat: [console]}
rules:
  - name: Divergence
    match: {types: [divergence]}
    severity: error
  - name: SpikeCheckpoint
    match: {types: [loss_spike], labels: {save: "yes"}}
    severity: warning
    action: checkpoint
  - name: Spike
    match: {types: [loss_spike]}
    severity: warning
"""


def test_a_lesser_finding_after_a_page_is_counted_under_it_unless_its_rule_acts(tmp_path):
    alerting = _alerting(tmp_path, rules=GROUP_RULES)
    saving = RunContext("r2", labels={"save": "yes"})
    alerting.handle(RUN, [divergence(100)], T0)
    alerting.handle(saving, [divergence(100, run_id="r2")], T0)
    alerting.flush(T0)
    alerting.handle(RUN, [spike(step=101)], T0 + 1)
    alerting.handle(saving, [spike(step=101, run_id="r2")], T0 + 1)
    rules = {a.run_id: sorted(a.rule for a in alerting.store.alerts(run_id=a.run_id))
             for a in alerting.store.alerts()}
    assert rules == {"r1": ["Divergence"], "r2": ["Divergence", "SpikeCheckpoint"]}
    [page] = alerting.alerts_for_run("r1")
    assert page.related == 1
    assert _decisions(alerting)["grouped"] == 1


def test_a_completed_run_pages_what_waited_then_closes_it_saying_how_the_run_ended(tmp_path):
    alerting = _alerting(tmp_path, group_wait_seconds=30)
    alerting.handle(RUN, [nan(step=300)], T0)
    alerting.run_ended("r1", "completed", T0 + 1, step=400,
                       verdict="unhealthy: NaN since step 300")
    assert [(e.status, e.summary) for e in _events(alerting)] == [
        ("firing", "loss is NaN"),
        ("resolved", "run ended unhealthy: NaN since step 300 (closed with the run; last "
                     "finding: loss is NaN)")]
    assert _alert(alerting).resolved_at == T0 + 1


ACTING_RULES = """
routes: {page: [console], chat: [console]}
rules:
  - name: Spike
    match: {types: [loss_spike]}
    severity: error
    cooldown: 10m
    resolve_after: 1m
    action: checkpoint
"""


def test_an_alert_whose_rule_acted_is_paged_at_once_cooldown_or_not(tmp_path):
    alerting = _alerting(tmp_path, rules=ACTING_RULES)
    alerting.handle(RUN, [spike(step=1)], T0)
    alerting.flush(T0)
    alerting.tick(T0 + 60)
    alerting.handle(RUN, [spike(step=2)], T0 + 100)  # back within the cooldown
    alerting.flush(T0 + 100)
    assert _said(alerting)[2:] == [("firing", "Spike", "first")]
    assert _events(alerting)[-1].evidence["action"] == "checkpoint requested at step 2 by rule Spike"


def test_a_silenced_alert_gets_no_reminder_until_the_silence_ends(tmp_path):
    alerting = _alerting(tmp_path, rules=COOLDOWN_RULES)
    alerting.tick(T0)
    alerting.handle(RUN, [spike(step=1)], T0)
    alerting.tick(T0)  # the tick flushes what is due: paged
    silence = alerting.add_silence(run_id="r1", duration=7200, comment="known")
    for k in range(1, 63):  # firing throughout, silenced past its repeat interval
        alerting.handle(RUN, [spike(step=1 + k)], T0 + 59 * k)
        alerting.tick(T0 + 59 * k)
    assert _said(alerting) == [("firing", "Spike", "first")]
    alerting.expire_silence(silence.id)
    alerting.tick(T0 + 59 * 62 + 1)
    assert _said(alerting)[1:] == [("firing", "Spike", "repeat_elapsed")]


ROLLBACK_RULES = """
routes: {page: [console]}
rules:
  - name: RollbackOnNaN
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: [rank]
    action: rollback
"""


def test_a_run_whose_rollback_waits_for_a_saving_rank_is_paged_when_the_wait_ends(tmp_path):
    """Its page waits for the decision (at most the rollback's wait), to say what was done."""
    alerting = _alerting(tmp_path, rules=ROLLBACK_RULES)
    behind = RunContext("r1", clean_checkpoints=((100, "/c/100.pt"), (200, "/c/200.pt")),
                        rank_steps={0: 238, 1: 252}, checkpoint_ranks=(0,))
    assert alerting.handle(behind, [nan(step=241, rank=1)], T0) == []
    assert alerting.waiting("r1")
    assert alerting.flush(T0 + 1) == ROLLBACK_WAIT_SECONDS - 1
    assert _events(alerting) == [] and _alert(alerting).state == "pending"
    alerting.flush(T0 + ROLLBACK_WAIT_SECONDS)  # rank 0 quiet all along: the wait is over
    assert _said(alerting) == [("firing", "RollbackOnNaN", "first")]


def test_a_rollback_carried_out_closes_a_crash_of_the_steps_it_abandoned_too(tmp_path):
    """Only a resume that no action of ours took leaves a crash page for its relaunch."""
    alerting = _alerting(tmp_path, rules=ROLLBACK_RULES + """
  - name: Crashed
    match: {types: [crashed]}
    severity: error
""")
    run = RunContext("r1", clean_checkpoints=((100, "/c/100.pt"), (200, "/c/200.pt")),
                     rank_steps={0: 260, 1: 260}, checkpoint_ranks=(0,))
    alerting.handle(run, [crashed(260)], T0)
    [rollback] = alerting.handle(run, [nan(step=250, rank=1)], T0)
    assert rollback.action == "rollback"
    alerting.attempt_settled("r1", start_step=201, now=T0 + 60)
    assert {a.rule: a.state for a in alerting.store.alerts()} == {
        "Crashed": "resolved", "RollbackOnNaN": "resolved"}


def test_a_crash_page_held_back_by_an_alert_that_cannot_be_worded_still_closes_on_relaunch(
        tmp_path, caplog: pytest.LogCaptureFixture):
    alerting = _alerting(tmp_path, group_wait_seconds=30)
    alerting.handle(RUN, [divergence(90), crashed(100)], T0)
    with alerting.db.tx() as conn:  # the divergence's stored finding no longer parses
        conn.execute("UPDATE alerts SET finding = ? WHERE type = 'divergence'", (b"{not json",))
    assert alerting.relaunched("r1", "relaunched by torchrun", start_step=50, now=T0 + 1)
    assert {a.rule: a.state for a in alerting.store.alerts()} == {
        "TrainingDivergence": "pending", "TrainingCrashed": "resolved"}
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "cannot page run r1; its alerts stay pending"]


def test_a_resume_closes_the_abandoned_alerts_past_one_whose_stored_finding_is_damaged(
        tmp_path, caplog: pytest.LogCaptureFixture):
    alerting = _alerting(tmp_path, group_wait_seconds=30)
    alerting.handle(RUN, [divergence(90), nan(step=120)], T0)
    with alerting.db.tx() as conn:  # the divergence's stored finding no longer parses
        conn.execute("UPDATE alerts SET finding = ? WHERE type = 'divergence'", (b"{not json",))
    alerting.attempt_settled("r1", start_step=100, now=T0 + 1)
    assert {a.rule: a.state for a in alerting.store.alerts()} == {
        "TrainingDivergence": "pending", "TrainingNanInf": "resolved"}
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "cannot page run r1; its alerts stay pending"]


def test_a_damaged_finding_that_is_json_but_not_an_object_is_no_abandoned_step(tmp_path):
    alerting = _alerting(tmp_path, group_wait_seconds=30)
    alerting.handle(RUN, [nan(step=120)], T0)
    with alerting.db.tx() as conn:
        conn.execute("UPDATE alerts SET finding = ?", (b"[120]",))
    alerting.attempt_settled("r1", start_step=100, now=T0 + 1)
    assert _alert(alerting).state == "pending"


def test_a_resume_while_a_rollback_waits_closes_its_unpaged_alert_without_a_word(tmp_path):
    """The run went back on its own (a relaunch) while its page waited for the decision:
    the fault is of a history that no longer exists, and nobody heard of it yet."""
    alerting = _alerting(tmp_path, rules=ROLLBACK_RULES)
    behind = RunContext("r1", clean_checkpoints=((100, "/c/100.pt"), (200, "/c/200.pt")),
                        rank_steps={0: 238, 1: 252}, checkpoint_ranks=(0,))
    alerting.handle(behind, [nan(step=241, rank=1)], T0)
    alerting.attempt_settled("r1", start_step=201, now=T0 + 1)
    assert _alert(alerting).state == "resolved"
    alerting.flush(T0 + ROLLBACK_WAIT_SECONDS)
    assert _events(alerting) == []


def test_a_flush_pages_every_run_due_past_a_thousand_pending_alerts(tmp_path):
    """A flood of new runs: the oldest alert is due first, and not left for a later flush."""
    alerting = _alerting(tmp_path)
    for i in range(1001):
        alerting.handle(RunContext(f"r{i}"), [nan(step=1, run_id=f"r{i}")], T0 + i / 1000)
    alerting.flush(T0 + 2)
    assert alerting.store.alerts("pending", limit=-1) == []
