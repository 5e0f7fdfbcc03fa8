"""Findings that follow from an open page are grouped under it (alerting/related.py): one
page that counts them, not one alert per layer; through real Slack/PagerDuty receivers."""

from __future__ import annotations

from alert_harness import Harness, nan
from monitor_agent.alerting import RunContext
from monitor_agent.records.types import Finding, Severity


def divergence(step: int = 309) -> Finding:
    return Finding(type="divergence", severity=Severity.ERROR, run_id="r1", step=step,
                   message="loss rose 3 steps in a row")


def tails(first_step: int, layers: int = 11) -> list[Finding]:
    return [Finding(type="grad_distribution", severity=Severity.WARNING, run_id="r1",
                    step=first_step + k, message="gradient distribution heavy-tailed",
                    layer=f"h.{k}.weight", evidence={"kind": "heavy_tail"})
            for k in range(layers)]


def test_per_layer_warnings_after_a_page_are_counted_under_it(harness: Harness):
    harness.handle(divergence())
    harness.drain()
    for f in tails(320):
        harness.handle(f)
    harness.drain()
    alerts = harness.alerting.list_alerts(run_id="r1")
    assert [a.alertname for a in alerts] == ["TrainingDivergence"]
    (page,) = alerts
    assert page.related == 11
    assert page.related_summary == "+11 related findings (grad_distribution heavy_tail in 11 layers)"
    assert harness.decisions()["grouped"] == 11
    # The page's next message (here its resolve) carries the count in its summary.
    harness.tick(601)
    harness.drain()
    assert "+11 related findings (grad_distribution heavy_tail in 11 layers)" in \
        harness.slack.requests[-1].json["text"]
    # With the page resolved, the same warnings alert on their own again, one per layer.
    for f in tails(400, layers=3):
        harness.handle(f)
    # (pending or already firing: group_wait runs on the wall clock, not the harness's)
    alone = [a for a in harness.alerting.list_alerts(run_id="r1")
             if a.alertname == "TrainingGradientHealth" and a.state != "resolved"]
    assert len(alone) == 3


def test_a_replayed_finding_is_not_counted_twice(harness: Harness):
    harness.handle(divergence())
    (tail,) = tails(320, layers=1)
    harness.handle(tail)
    harness.restart()
    harness.handle(tail)  # recovery replays the stored tail through the detectors
    (page,) = harness.alerting.list_alerts(run_id="r1")
    assert page.related == 1


def test_a_silenced_page_does_not_swallow_what_follows(harness: Harness):
    harness.alerting.add_silence(run_id="r1", type="divergence", duration=3600)
    harness.handle(divergence())
    harness.handle(tails(320, layers=1)[0])
    alerts = {a.alertname: a for a in harness.alerting.list_alerts(run_id="r1")}
    assert sorted(alerts) == ["TrainingDivergence", "TrainingGradientHealth"]
    assert alerts["TrainingDivergence"].related == 0


def test_a_warning_from_before_a_previewed_page_alerts_on_its_own(harness: Harness):
    # A NaN step sent ahead of its backlog begins its page first; the backlog's older
    # steps are judged after it. What they found happened before the NaN: not its
    # consequence, so it alerts as it would have had the records come in order.
    run = RunContext("r1", project="proj", labels={"team": "nlp"})
    assert harness.alerting.preview(run, [nan(step=150)], harness.clock()) == 1
    (before,) = tails(50, layers=1)
    after = tails(160, layers=2)[1]  # another layer: not the open warning's episode
    harness.handle(before)
    harness.handle(nan(step=150))  # the NaN step's in-order copy
    harness.handle(after)
    harness.drain()
    alerts = {a.alertname: a for a in harness.alerting.list_alerts(run_id="r1")}
    assert sorted(alerts) == ["TrainingGradientHealth", "TrainingNanInf"]
    assert alerts["TrainingGradientHealth"].step == 50
    assert alerts["TrainingNanInf"].related == 1  # the warning at step 160
    assert harness.decisions()["grouped"] == 1
