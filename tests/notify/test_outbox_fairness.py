"""What a flood cannot do to the outbox (notify/fairness.py), on an injected clock against
real local receivers: severity first, established runs before new ones, round robin between
runs, new runs' news budgeted per source and summarised, room kept for real pages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from monitor_agent.alerting.db import open_alert_db
from monitor_agent.metrics.delivery import DeliveryMetrics
from monitor_agent.notify.base import Notification
from monitor_agent.notify.channel_settings import OutboxSettings
from monitor_agent.notify.fairness import (
    NewRunBudget,
    Queued,
    order_key,
    priority,
    summary_fingerprint,
    summary_note,
)
from monitor_agent.notify.outbox import Outbox
from monitor_agent.notify.pagerduty import PagerDutyNotifier
from monitor_agent.notify.slack import SlackNotifier
from monitor_agent.records import wire
from tests.notify.sample_events import T0, event
from tests.receivers import Receiver, Reply

KEY = "0123456789abcdef0123456789abcdef"
SOURCE = "10.0.0.66"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pd() -> Iterator[Receiver]:
    with Receiver("pagerduty") as r:
        yield r


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client() as c:
        yield c


def make(tmp: Path, notifier, clock: Clock, **limits) -> Outbox:
    settings = OutboxSettings(backoff_base_seconds=1, backoff_cap_seconds=8, **limits)
    return Outbox(open_alert_db(tmp / "a.sqlite"), {notifier.name: notifier}, settings,
                  DeliveryMetrics(CollectorRegistry(), [notifier.name]), clock,
                  rand=lambda: 0.5)


def page(run: str, severity: str = "critical", status: str = "firing", n: int = 0,
         reason: str = "first"):
    return event(status, fingerprint=f"{run}-{n}", run_id=run, severity=severity,
                 reason=reason)


def put(outbox: Outbox, channel: str, *events, source: str | None = None) -> list[bool]:
    with outbox.db.tx() as conn:
        return [outbox.enqueue(conn, channel, Notification(e.run_id, (e,), outbox.clock()),
                               outbox.clock(), source=source) for e in events]


def summarised(outbox: Outbox, channel: str = "pagerduty") -> float:
    """monitor_agent_notifications_total{channel, outcome="summarised"}."""
    return outbox.metrics.notifications.labels(channel=channel, outcome="summarised")._value.get()


def drain(outbox: Outbox, channel: str, client: httpx.Client, clock: Clock) -> None:
    while (wait := outbox.deliver_next(channel, client)) is not None:
        clock.now += wait


def runs_paged(receiver: Receiver) -> list[str]:
    """The run each PagerDuty event is about, in the order they arrived."""
    return [r.json["payload"]["custom_details"]["run_id"] if r.json["event_action"] == "trigger"
            else f"{r.json['event_action']}:{r.json['dedup_key'].removeprefix('monitor-agent-')}"
            for r in receiver.requests]


def test_critical_news_goes_before_queued_warnings_and_follow_ups(tmp_path, pd, client):
    """Warnings and resolves of other runs were queued first; a critical page jumps them,
    an error page comes next, and a critical *reminder* is no news: it waits its turn."""
    clock = Clock()
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock)
    put(outbox, "pagerduty", *[page(f"warn-{i}", "warning") for i in range(3)],
        page("old", "critical", "resolved"), page("nag", "critical", reason="repeat_elapsed"),
        page("err", "error"), page("real", "critical"))
    drain(outbox, "pagerduty", client, clock)
    assert runs_paged(pd)[:2] == ["real", "err"]
    assert sorted(runs_paged(pd)[2:]) == sorted(["warn-0", "warn-1", "warn-2", "nag",
                                                 "resolve:old-0"])


def test_an_established_runs_page_goes_before_new_runs_pages(tmp_path, client):
    """Slack sends one message a second: 30 pages of new runs were queued first, the
    established run's page is the next one out all the same."""
    with Receiver("slack") as slack:
        clock = Clock()
        outbox = make(tmp_path, SlackNotifier(slack.url, min_interval=1.0), clock,
                      new_run_burst=100)
        put(outbox, "slack", *[page(f"fake-{i}") for i in range(30)], source=SOURCE)
        put(outbox, "slack", page("real"))
        outbox.deliver_next("slack", client)
        clock.now += 1.0
        outbox.deliver_next("slack", client)
        assert "run real:" in slack.requests[0].json["text"]


def test_runs_take_turns(tmp_path, pd, client):
    """Run a queued three pages (one per alert), run b one after them: b's goes second."""
    clock = Clock()
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock)
    put(outbox, "pagerduty", *[page("a", n=n) for n in range(3)], page("b"))
    drain(outbox, "pagerduty", client, clock)
    assert runs_paged(pd) == ["a", "b", "a", "a"]


def test_new_runs_past_the_budget_are_one_summary_and_their_follow_ups_stay_quiet(
        tmp_path, pd, client):
    """Two pages of new runs per window from one source go out one by one; the other 38 are
    one summary naming them, each alert's delivery says so, and their resolves are not
    sent (nobody heard of them one by one). Another source has a budget of its own."""
    clock = Clock()
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock, new_run_burst=2)
    flood = [page(f"fake-{i:02d}") for i in range(40)]
    put(outbox, "pagerduty", *flood, source=SOURCE)
    put(outbox, "pagerduty", page("elsewhere"), source="10.0.0.99")
    assert outbox.pending == 4  # 2 pages, the summary, the other source's page
    drain(outbox, "pagerduty", client, clock)
    triggers = [r.json for r in pd.requests]
    assert [t["payload"]["custom_details"]["run_id"] for t in triggers] == [
        "fake-00", "fake-01", f"new runs from {SOURCE}", "elsewhere"]
    summary = triggers[2]["payload"]
    assert summary["severity"] == "critical"
    assert "38 new runs paged" in summary["summary"] and "fake-02" in summary["summary"]
    states = outbox.delivery_states()
    assert states["fake-17-0"]["pagerduty"] == {"state": "sent", "attempts": 0,
                                               "last_error": None, "done_at": clock.now,
                                               "summarised": True}
    assert "summarised" not in states["fake-00-0"]["pagerduty"]
    put(outbox, "pagerduty", *[page(e.run_id, status="resolved") for e in flood])
    drain(outbox, "pagerduty", client, clock)
    assert runs_paged(pd)[4:] == ["resolve:fake-00-0", "resolve:fake-01-0"]


def test_a_summary_takes_the_priority_of_the_most_severe_news_it_holds(tmp_path, pd, client):
    """A new run's error page opened the source's summary; a critical page of another new run
    joined it: the summary is critical news now and goes before an established run's error
    page that was queued first (a summary keeping its first priority would wait behind it)."""
    clock = Clock()
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock, new_run_burst=0)
    put(outbox, "pagerduty", page("established", "error"))
    put(outbox, "pagerduty", page("fake-e", "error"), source=SOURCE)
    put(outbox, "pagerduty", page("fake-c", "critical"), source=SOURCE)
    assert outbox.pending == 2  # the established run's page and one summary of both
    drain(outbox, "pagerduty", client, clock)
    assert runs_paged(pd) == [f"new runs from {SOURCE}", "established"]
    summary = pd.requests[0].json["payload"]["summary"]
    assert "fake-e" in summary and "fake-c" in summary, summary


def test_a_summary_is_closed_at_its_first_attempt(tmp_path, pd, client):
    """What arrives after a summary's first attempt (here a 500) opens the next summary,
    due a window later; the first is retried with what it had."""
    clock = Clock()
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock, new_run_burst=0,
                  new_run_window_seconds=60)
    pd.script(Reply(500))
    put(outbox, "pagerduty", *[page(f"a-{i}") for i in range(3)], source=SOURCE)
    outbox.deliver_next("pagerduty", client)  # sealed with 3, then failed
    put(outbox, "pagerduty", *[page(f"b-{i}") for i in range(2)], source=SOURCE)
    drain(outbox, "pagerduty", client, clock)
    summaries = [r.json["payload"]["summary"] for r in pd.accepted()]
    assert len(summaries) == 2
    assert "3 new runs" in summaries[0] and "a-2" in summaries[0] and "b-0" not in summaries[0]
    assert "2 new runs" in summaries[1] and "b-1" in summaries[1]
    assert pd.accepted()[1].at >= pd.accepted()[0].at  # the second came after the retry


def test_the_last_places_are_kept_for_established_runs_pages(tmp_path, pd):
    """max_pending 10 with a fifth reserved: warnings and new runs' pages stop at 8; an
    established run's critical and error pages still fit, then nothing does."""
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), Clock(), max_pending=10,
                  reserved_for_pages=0.2, new_run_burst=100)
    assert put(outbox, "pagerduty", *[page(f"w-{i}", "warning") for i in range(8)]) == [True] * 8
    assert put(outbox, "pagerduty", page("w-8", "warning")) == [False]
    assert put(outbox, "pagerduty", page("fake"), source=SOURCE) == [False]
    assert put(outbox, "pagerduty", page("real"), page("real2", "error")) == [True, True]
    assert put(outbox, "pagerduty", page("real3")) == [False]
    states = outbox.delivery_states()
    assert states["w-8-0"]["pagerduty"]["last_error"] == (
        "outbox full (8 pending), max_pending=10; the last 2 places are kept for pages of "
        "established runs")
    assert states["real3-0"]["pagerduty"]["last_error"] == "outbox full (10 pending), max_pending=10"
    assert states["real-0"]["pagerduty"]["state"] == "pending"


def test_news_and_follow_ups():
    assert priority(Notification("r", (page("r"),), T0)) == 0
    assert priority(Notification("r", (page("r", "error"),), T0)) == 1
    for follow_up in (page("r", status="resolved"), page("r", reason="repeat_elapsed"),
                      page("r", reason="refresh"), page("r", status="acknowledged")):
        assert priority(Notification("r", (follow_up,), T0)) == 2


def test_new_runs_warnings_are_not_budgeted_only_ordered(tmp_path, pd):
    """The budget is for pages: a new run's warning is queued alone whatever the budget
    (rules 1 and 2 already send it after every page)."""
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), Clock(), new_run_burst=0)
    put(outbox, "pagerduty", page("fake-w", "warning"), source=SOURCE)
    put(outbox, "pagerduty", page("fake-c"), source=SOURCE)
    rows = outbox.db.query("SELECT run_id, summary FROM outbox ORDER BY id")
    assert [(r["run_id"], r["summary"]) for r in rows] == [
        ("fake-w", 0), (f"new runs from {SOURCE}", 1)]


def test_alerting_marks_a_new_runs_episodes_and_budgets_their_pages(tmp_path):
    """Through alerting: a run first seen a minute ago is new (its source rides on its
    messages), one first seen an hour ago is not; 12 new runs of one source page 10 times
    alone and once as a summary, the established run alone."""
    from monitor_agent.alerting import Alerting, AlertingSettings
    from monitor_agent.alerting.alerts import RunContext
    from monitor_agent.records.types import Finding, Severity

    settings = AlertingSettings(console={"enabled": True})
    alerting = Alerting(settings, tmp_path / "a.sqlite", CollectorRegistry(), clock=lambda: T0)
    now = T0
    for i in range(12):
        run = RunContext(f"fake-{i}", first_seen=now - 60, source=SOURCE)
        alerting.handle(run, [Finding("nan_inf", Severity.CRITICAL, run.run_id, step=1, message="NaN")], now)
    real = RunContext("real", first_seen=now - 3600, source=SOURCE)
    alerting.handle(real, [Finding("nan_inf", Severity.CRITICAL, "real", step=900, message="NaN")], now)
    alerting.flush(now + 1)
    assert {a.run_id: a.newcomer for a in alerting.store.alerts(limit=100)} == {
        **{f"fake-{i}": SOURCE for i in range(12)}, "real": None}
    rows = alerting.db.query("SELECT run_id, source, summary FROM outbox ORDER BY id")
    alone = {r["run_id"] for r in rows if r["summary"] == 0}
    assert "real" in alone and len(alone) == 11  # the flush takes runs in no set order
    assert [r["run_id"] for r in rows if r["summary"]] == [f"new runs from {SOURCE}"]
    assert next(r["source"] for r in rows if r["run_id"] == "real") is None
    states = alerting.delivery_states()
    folded = [a for a in alerting.store.alerts(limit=100) if a.run_id not in alone]
    assert len(folded) == 2
    assert all(states[a.fingerprint]["console"]["summarised"] is True for a in folded)


def test_a_summary_says_how_many_runs_which_alerts_and_names_the_first_twenty():
    """What a summary page says: runs counted once, alerts by count (most first), the first
    twenty run ids and how many more, the source's budget; its severity the worst folded,
    its identity one per channel, source and summary."""
    rows = [(f"fake-{i:02d}", "TrainingNanInf", "error") for i in range(22)]
    rows += [("fake-00", "TrainingLossSpike", "warning"),
             ("fake-03", "TrainingNanInf", "critical")]
    note = summary_note(SOURCE, rows, "id-1", created_at=T0, now=T0 + 42.4, burst=2,
                        window=600.0)
    [e] = note.events
    shown = ", ".join(f"fake-{i:02d}" for i in range(20)) + " and 2 more"
    assert e.summary == (
        f"22 new runs paged within 42 s (TrainingNanInf x23, TrainingLossSpike x1): {shown}. "
        f"New runs from {SOURCE} sent more than 2 pages in 600 s, so the rest are summarised "
        "here; GET /v1/alerts lists each")
    assert (note.group, e.run_id, e.alertname, e.severity, e.status, e.count, e.reason) == (
        f"new runs from {SOURCE}", f"new runs from {SOURCE}", "NewRunsPaging", "critical",
        "firing", 24, "summary")
    assert e.evidence == {"new_runs": 22, "alerts": "TrainingNanInf x23, TrainingLossSpike x1",
                          "runs": shown, "source": SOURCE}
    assert e.labels == {"source": SOURCE} and e.started_at == T0 and e.fingerprint == "id-1"
    # A clock that went back says 0 s, never a negative span; only warnings: a warning.
    [w] = summary_note(SOURCE, [("a", "X", "warning"), ("b", "X", "warning")], "id-2",
                       created_at=T0, now=T0 - 5, burst=0, window=60.0).events
    assert w.severity == "warning"
    assert w.summary.startswith("2 new runs paged within 0 s (X x2): a, b."), w.summary
    ids = {summary_fingerprint(c, s, i) for c, s, i in (
        ("slack", SOURCE, "1"), ("pagerduty", SOURCE, "1"), ("slack", "10.0.0.99", "1"),
        ("slack", SOURCE, "2"))}
    assert len(ids) == 4 and all(len(i) == 24 for i in ids)


def test_each_summary_is_an_incident_of_its_own_and_each_source_has_its_own_window(
        tmp_path, pd, client):
    """Two sources flood at the same moment: each source's summary is due at once (one
    source's window does not delay the other's), and each summary, like the next window's
    of the first source, is its own PagerDuty incident: a shared dedup key would fold them
    into one page. The summary states the budget it enforces."""
    clock = Clock()
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock, new_run_burst=0,
                  new_run_window_seconds=60)
    assert put(outbox, "pagerduty", page("a-0"), source=SOURCE) == [True]  # folded: taken
    put(outbox, "pagerduty", page("b-0"), source="10.0.0.99")
    assert summarised(outbox) == 2
    assert outbox.deliver_next("pagerduty", client) == 0.0
    assert outbox.deliver_next("pagerduty", client) == 0.0  # the other source's: due too
    assert runs_paged(pd) == [f"new runs from {SOURCE}", "new runs from 10.0.0.99"]
    put(outbox, "pagerduty", page("a-1"), source=SOURCE)  # the first summary is closed
    drain(outbox, "pagerduty", client, clock)
    assert clock.now == T0 + 60  # a window after the source's previous summary
    keys = [r.json["dedup_key"] for r in pd.requests]
    assert len(keys) == 3 and len(set(keys)) == 3, keys
    summaries = [r.json["payload"]["summary"] for r in pd.requests]
    assert all("sent more than 0 pages in 60 s" in s for s in summaries), summaries
    assert {r.json["payload"]["class"] for r in pd.requests} == {"new_runs"}


def test_a_summary_that_finds_the_outbox_full_is_refused_and_says_so(tmp_path, pd, caplog):
    """The outbox is full of established runs' pages: a new run's news past the budget
    opens no summary. The notification is stored failed (its alerts show why, each of
    them), the caller hears False, and the ERROR line names the channel and the run."""
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), Clock(), max_pending=2,
                  new_run_burst=0)
    assert put(outbox, "pagerduty", page("real-1"), page("real-2")) == [True, True]
    news = Notification("fake", (page("fake", n=0), page("fake", n=1)), T0)
    with outbox.db.tx() as conn:
        assert outbox.enqueue(conn, "pagerduty", news, T0, source=SOURCE) is False
    assert outbox.pending == 2
    states = outbox.delivery_states()
    for fp in ("fake-0", "fake-1"):
        assert states[fp]["pagerduty"] == {
            "state": "failed", "attempts": 0, "done_at": T0,
            "last_error": "outbox full (2 pending), max_pending=2"}
    [(body,)] = outbox.db.query("SELECT body FROM outbox WHERE state = 'failed'")
    kept = Notification.from_dict(wire.loads(body))  # kept, not lost
    assert (kept.group, [e.fingerprint for e in kept.events]) == ("fake", ["fake-0", "fake-1"])
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "outbox full (2 pending), max_pending=2: NOT QUEUED, a pagerduty notification "
        "for fake"]


def test_a_summary_of_twenty_runs_names_them_all_and_of_many_alerts_counts_the_top_five():
    """Exactly twenty runs: all named, none "more"; seven alert names: the five most
    frequent counted. The message is dated when it is worded (a webhook's createdAt)."""
    names = [f"Alert{k}" for k in range(7)]
    rows = [(f"fake-{i:02d}", names[min(i, 6)], "critical") for i in range(20)]
    note = summary_note(SOURCE, rows, "id-1", created_at=T0, now=T0 + 7, burst=2,
                        window=60.0)
    [e] = note.events
    assert e.evidence["runs"] == ", ".join(f"fake-{i:02d}" for i in range(20))
    assert " and 0 more" not in e.summary, e.summary
    assert e.evidence["alerts"] == "Alert6 x14, Alert0 x1, Alert1 x1, Alert2 x1, Alert3 x1"
    assert note.created_at == T0 + 7


def test_a_sources_budget_is_a_sliding_window_that_many_sources_cannot_break():
    """A send leaves the budget exactly a window later. 10,000 sources and one more: the
    budget forgets only sources whose sends all left the window; one that spent its burst
    within the window still has none."""
    budget = NewRunBudget(burst=1, window=60.0)
    assert budget.take("slack", SOURCE, 0.0) is True
    assert budget.take("slack", SOURCE, 59.0) is False
    assert budget.take("slack", SOURCE, 60.0) is True  # the send at 0 is out of (0, 60]
    for i in range(10_000):
        assert budget.take("slack", f"10.1.{i // 256}.{i % 256}", 100.0)
    assert budget.take("slack", "10.9.9.9", 130.0) is True  # past 10,000: forgets some
    assert budget.take("slack", SOURCE, 130.0) is True  # its send at 60 left the window
    assert budget.take("slack", "10.1.0.0", 130.0) is False  # its send at 100 has not


def test_a_message_queued_without_its_run_takes_the_turn_of_the_runless():
    """Rows queued by an older version carry no run: they share one turn, and a run never
    served goes before them once one of them went out."""
    rows = [Queued(1, 0.0, 0, 0.0, "a", 0, None), Queued(2, 0.0, 0, 0.0, "b", 0, "run-b")]
    assert [r.id for r in sorted(rows, key=lambda r: order_key(r, {"": T0}))] == [2, 1]


def test_ten_thousand_made_up_sources_and_one_more_are_each_summarised(tmp_path, pd):
    """Made-up sources each open a summary; past 10,000 of them the outbox forgets the
    schedule of those already due, and the next source's summary is queued all the same."""
    clock = Clock()
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock, new_run_burst=0,
                  max_pending=20_000)
    news = [page(f"fake-{i}") for i in range(10_001)]
    with outbox.db.tx() as conn:
        taken = [outbox.enqueue(conn, "pagerduty", Notification(e.run_id, (e,), T0), T0,
                                source=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
                 for i, e in enumerate(news)]
    assert all(taken) and outbox.pending == 10_001
    assert outbox.delivery_states()["fake-10000-0"]["pagerduty"]["summarised"] is True


def test_a_message_of_several_alerts_drops_only_the_follow_ups_nobody_heard_of_alone(
        tmp_path, pd, client):
    """A new run's first page went out alone, two more were summarised. One message
    resolving all three sends the first one's resolve only; one resolving only the two
    summarised is taken and sends nothing (counted as summarised)."""
    clock = Clock()
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock, new_run_burst=1)
    put(outbox, "pagerduty", *[page(f"fake-{i}") for i in range(3)], source=SOURCE)
    drain(outbox, "pagerduty", client, clock)
    assert runs_paged(pd) == ["fake-0", f"new runs from {SOURCE}"]
    resolves = [page(f"fake-{i}", status="resolved") for i in range(3)]
    with outbox.db.tx() as conn:
        assert outbox.enqueue(conn, "pagerduty", Notification("fake", tuple(resolves), T0),
                              T0) is True
    drain(outbox, "pagerduty", client, clock)
    assert runs_paged(pd)[2:] == ["resolve:fake-0-0"]
    taken = summarised(outbox)
    with outbox.db.tx() as conn:
        assert outbox.enqueue(conn, "pagerduty", Notification("fake", tuple(resolves[1:]), T0),
                              T0) is True
    assert summarised(outbox) == taken + 1 and outbox.pending == 0
    # A message about two alerts at once shows on each of them.
    with outbox.db.tx() as conn:
        outbox.enqueue(conn, "pagerduty", Notification(
            "real", (page("real", n=0), page("real", n=1)), T0), T0)
    states = outbox.delivery_states()
    assert states["real-0"]["pagerduty"]["state"] == states["real-1"]["pagerduty"]["state"] == "pending"


def test_a_summary_whose_alerts_were_all_told_one_by_one_since_is_not_sent(
        tmp_path, pd, client):
    """A source's next summary holds one alert; before it is due, that alert's news goes
    out on its own (its run is established now), which takes it out of the summary. At
    its time the summary has nothing left to say: no empty "0 new runs" page goes out,
    and nothing stays pending."""
    clock = Clock()
    outbox = make(tmp_path, PagerDutyNotifier(KEY, pd.url), clock, new_run_burst=0,
                  new_run_window_seconds=60)
    put(outbox, "pagerduty", page("a-0"), source=SOURCE)
    assert outbox.deliver_next("pagerduty", client) == 0.0  # the first summary, at once
    put(outbox, "pagerduty", page("a-1"), source=SOURCE)  # the next one, due in 60 s
    put(outbox, "pagerduty", page("a-1"))  # its news, told one by one
    assert outbox.deliver_next("pagerduty", client) == 0.0  # the news
    clock.now += outbox.deliver_next("pagerduty", client) or 0.0  # the summary's time
    assert clock.now == T0 + 60
    # The emptied summary is taken out, and the sender looks again at once.
    assert outbox.deliver_next("pagerduty", client) == 0.0
    assert outbox.deliver_next("pagerduty", client) is None
    assert runs_paged(pd) == [f"new runs from {SOURCE}", "a-1"], runs_paged(pd)
    assert outbox.pending == 0
