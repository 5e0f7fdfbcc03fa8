"""From stored alerts to what channels receive: events, Grafana links, grouped messages.

``to_event`` turns a ``StoredAlert`` into the ``AlertEvent`` channels see; the dashboard
link shows the half hour before the finding and ten minutes after; and ``notifications``
puts the events of one run in one message per channel, or one per alert where the channel
keys on alerts (PagerDuty)::

    >>> dashboard_url("http://grafana:3000/", "gpt 7", at=1_700_000_000.0).split("?")
    ['http://grafana:3000/d/monitor-agent-training-run/monitor-agent-training-run',
     'var-run=gpt%207&from=1699998200000&to=1700000600000']

A time that is no wall-clock second (a record's ``time`` may be any float) gets the link
without a range, never an error: the link is built while the alert is stored::

    >>> dashboard_url("http://grafana:3000", "r", at=1e308).endswith("?var-run=r")
    True
    >>> from monitor_agent.notify.console import ConsoleNotifier
    >>> from monitor_agent.notify.pagerduty import PagerDutyNotifier
    >>> pd = PagerDutyNotifier("k" * 32, "https://events.pagerduty.com/v2/enqueue")
    >>> notifiers = {"console": ConsoleNotifier(), "pagerduty": pd}
    >>> events = [AlertEvent(fp, "gpt-7", name, "nan_inf", "critical", "firing", "NaN", 1000.0)
    ...           for fp, name in (("ab12", "TrainingNanInf"), ("cd34", "TrainingDivergence"))]
    >>> found = notifications([(e, ("pagerduty", "console")) for e in events], notifiers, 1001.0)
    >>> [(channel, [e.alertname for e in note.events]) for channel, note in found]
    [('pagerduty', ['TrainingNanInf']), ('pagerduty', ['TrainingDivergence']),
     ('console', ['TrainingNanInf', 'TrainingDivergence'])]
"""

from __future__ import annotations

from collections import defaultdict
from urllib.parse import quote

from monitor_agent.alerting.alerts import StoredAlert
from monitor_agent.alerting.related import RelatedFindings
from monitor_agent.notify.base import AlertEvent, Notification, Notifier
from monitor_agent.records import wire

DASHBOARD_UID = "monitor-agent-training-run"
BEFORE_S, AFTER_S = 30 * 60, 10 * 60  # the range shows how the run got there
LAST_EPOCH_S = 253_402_300_799.0  # 9999-12-31T23:59:59Z, the last second Grafana can show


def dashboard_url(grafana_url: str | None, run_id: str, at: float) -> str | None:
    """The training-run dashboard with the run selected and the time range around ``at``."""
    if not grafana_url:
        return None
    link = (f"{grafana_url.rstrip('/')}/d/{DASHBOARD_UID}/{DASHBOARD_UID}"
            f"?var-run={quote(run_id, safe='')}")
    # NaN, inf, 1e308 and huge ints are data a record may carry; millisecond arithmetic on
    # them overflows, so only a time Grafana can show gets a range (else its default).
    if not (isinstance(at, int | float) and 0.0 <= at <= LAST_EPOCH_S):
        return link
    start, end = int((at - BEFORE_S) * 1000), int((at + AFTER_S) * 1000)
    return f"{link}&from={start}&to={end}"


def to_event(alert: StoredAlert, status: str, reason: str, now: float,
             ended: str | None = None, closed: str = "closed with the run",
             cost: str | None = None) -> AlertEvent:
    """What channels are told of ``alert`` (its latest finding, the action a rule took).

    ``ended``: the alert closes because its run ended ("run ended unhealthy: NaN since
    step 300", or "run rolled back to step 250"); the summary leads with it, then ``closed``
    says why it closed, so a resolve does not read as a recovery, then what was done and
    what it cost, before the last finding (long ones, a hang's, are cut from the end).
    ``cost``: what its incident cost the run (runs/goodput.py)."""
    finding = alert.finding_data()
    message, evidence = finding.get("message", ""), finding.get("evidence") or {}
    if alert.action:  # the page says what the run already did about it
        evidence = {**evidence, "action": alert.action}
    if alert.checkpoint:  # which save is safe, so the reader need not work it out
        evidence = {**evidence, "checkpoint": alert.checkpoint}
    if cost:
        evidence = {**evidence, "cost": cost}
    said = "".join(f"; {x}" for x in (alert.action, alert.checkpoint) if x)
    if ended:  # what was done and what it cost first: a long last finding is cut from its end
        done = "".join(f"; {x}" for x in (alert.action, cost) if x)
        last = "".join(f"; {x}" for x in (alert.checkpoint,) if x)
        summary = f"{ended} ({closed}{done}; last finding: {message}{last})"
    else:
        summary = f"{message}{said}"
    if related := RelatedFindings.from_json(alert.related).summary():
        summary = f"{summary}; {related}"  # the findings that follow from it, grouped here
    if cost and not ended:
        summary = f"{summary}; {cost}"
    return AlertEvent(
        fingerprint=alert.fingerprint, run_id=alert.run_id, alertname=alert.rule,
        type=alert.type, severity=alert.severity, status=status,
        summary=summary, started_at=alert.started_at, reason=reason,
        project=alert.project, step=finding.get("step", alert.last_step), layer=alert.layer,
        rank=alert.rank, value=wire.nonfinite_to_float(finding.get("value")),
        threshold=wire.nonfinite_to_float(finding.get("threshold")),
        suggestions=tuple(finding.get("suggestions") or ()),
        evidence=evidence, labels=dict(alert.labels),
        # count 0: an alert begun by a preview, whose one finding is not counted yet.
        identity=dict(alert.identity), count=max(alert.count, 1),
        ends_at=now if status == "resolved" else None,
        dashboard_url=alert.dashboard_url, acked_by=alert.acked_by,
    )


def notifications(
    items: list[tuple[AlertEvent, tuple[str, ...]]],
    notifiers: dict[str, Notifier],
    now: float,
) -> list[tuple[str, Notification]]:
    """Group events by run and status, then per channel: one message, or one per alert."""
    per_channel: dict[tuple[str, str, str], list[AlertEvent]] = defaultdict(list)
    for event, channels in items:
        for channel in channels:
            notifier = notifiers.get(channel)
            if notifier is None or event.status not in notifier.statuses:
                continue
            per_channel[(channel, event.run_id, event.status)].append(event)
    out: list[tuple[str, Notification]] = []
    for (channel, run_id, _), events in per_channel.items():
        groups = [events] if notifiers[channel].grouped else [[e] for e in events]
        out.extend((channel, Notification(run_id, tuple(g), now)) for g in groups)
    return out
