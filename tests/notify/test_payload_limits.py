"""Every channel's payload within that channel's documented limits (issue 35, class 5).

A hang of 256 ranks, each stuck in a frame of its own, is the largest page the sidecar
makes: every rank named in the message (~200 KB) and a per-rank table with each rank's
frames and NCCL trace (~1.3 MB of evidence). PagerDuty refuses an event over 512 KB, and a
refused page is a lost page. The local receivers (tests/receivers.py) enforce each
service's documented limits; the page must be accepted by each, its evidence cut by the
rule that keeps the culprit: the odd rank's row is there, first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from monitor_agent.detectors import DetectorSettings, DetectorSuite
from monitor_agent.notify.alertmanager import MAX_ANNOTATION, AlertmanagerNotifier
from monitor_agent.notify.base import AlertEvent, Notification
from monitor_agent.notify.pagerduty import PagerDutyNotifier
from monitor_agent.notify.slack import SlackNotifier
from monitor_agent.notify.webhook import MAX_BODY_BYTES, WebhookNotifier
from monitor_agent.records import wire
from monitor_agent.records.schemas import parse_record
from monitor_agent.settings import load_settings
from tests.live_server import LiveServer
from tests.notify import sample_events
from tests.receivers import (
    PD_MAX_EVENT_BYTES,
    SLACK_MAX_BLOCK_TEXT,
    Receiver,
    pagerduty_errors,
    slack_block_text,
    slack_errors,
)

RANKS = 256
KEY = "0123456789abcdef0123456789abcdef"
RULES = """
routes: {page: [pagerduty, slack, webhook]}
rules:
  - name: TrainingHung
    match: {types: [hang]}
    severity: critical
    cooldown: 30m
    fingerprint: []
"""


def _frames(rank: int) -> list[dict[str, Any]]:
    """Three frames at the name budget (256 characters), distinct for every rank."""
    return [{"file": "train.py", "line": 88, "function": "main", "user": True},
            {"file": f"train_{rank}.py".ljust(250, "_"), "line": 40 + rank,
             "function": "load_" + "f" * 245, "user": True},
            {"file": f"site-packages/lib_{rank}/ops.py".ljust(256, "_"), "line": 3252,
             "function": f"wait_{rank}".ljust(256, "_")}]


def _records(run_id: str, now: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"kind": "run", "run_id": run_id, "time": now - 60,
                                  "hardware": {"world_size": RANKS}}]
    out += [{"kind": "step", "run_id": run_id, "rank": r, "step": s, "time": now - 60 + s,
             "loss": 1.0} for s in range(1, 4) for r in range(RANKS)]
    out += [{"kind": "hang", "run_id": run_id, "rank": r, "step": 3, "time": now,
             "stuck_seconds": 37.0, "limit_seconds": 30.0, "phase": "backward",
             "nccl_trace": f"rank {r}: " + "T" * 4000,
             "threads": [{"name": "MainThread", "training": True, "frames": _frames(r)}]}
            for r in range(RANKS)]
    return out


def _hang_event() -> AlertEvent:
    """The page of the hang, from the real detector."""
    suite = DetectorSuite(DetectorSettings(hang_settle_seconds=0))
    for record in _records("g", 100.0):
        suite.update(parse_record(record))
    [finding] = [f for f in suite.tick(now=101.0) if f.type == "hang"]
    assert len(wire.dumps(finding.evidence)) > 1_000_000  # the evidence the page cuts
    return AlertEvent("ab12", "g", "TrainingHung", "hang", "critical", "firing",
                      finding.message, 100.0, step=finding.step, rank=finding.rank,
                      value=finding.value, suggestions=tuple(finding.suggestions),
                      evidence=finding.evidence,
                      dashboard_url="http://grafana:3000/d/x?var-run=g")


def _culprit_kept(evidence: dict[str, Any], rank: int) -> None:
    """The rank the page is about keeps its row, first, whole; what was cut is said."""
    assert next(iter(evidence["ranks"])) == str(rank)
    row = evidence["ranks"][str(rank)]
    assert row["state"] == "hung" and row["stuck_in"].startswith(f"site-packages/lib_{rank}/")
    assert row["nccl_trace"].startswith(f"rank {rank}: ")
    assert f"of {RANKS} entries" in evidence["cut"] and "/v1/runs/g/findings" in evidence["cut"]


def test_each_channels_payload_of_a_256_rank_hang_is_within_its_limits():
    event = _hang_event()
    note = Notification("g", (event,), 101.0)

    pd = PagerDutyNotifier(KEY, "http://pd").payload(event)
    size = len(wire.dumps(pd))
    assert size <= PD_MAX_EVENT_BYTES and pagerduty_errors(pd, size) == []
    _culprit_kept(pd["payload"]["custom_details"]["evidence"], event.rank or 0)
    assert pd["payload"]["summary"].startswith(
        f"CRITICAL TrainingHung (run g, step 3, rank {event.rank}): rank {event.rank} stuck")

    slack = SlackNotifier("http://slack").payload(note)
    assert slack_errors(slack["blocks"]) == []
    assert slack_block_text(slack["blocks"]) <= SLACK_MAX_BLOCK_TEXT
    section = slack["blocks"][1]["text"]["text"]
    # The summary is cut, not what follows it: where, and what to try.
    assert f"rank {event.rank} stuck" in section and "*Where:*" in section
    assert "*What to try:*" in section and "chars]" in section

    [alert] = AlertmanagerNotifier(["http://am"]).payload(note, now=101.0)
    assert all(len(v) <= MAX_ANNOTATION for v in alert["annotations"].values())

    hook = WebhookNotifier.payload(note)
    assert len(wire.dumps(hook)) <= MAX_BODY_BYTES
    _culprit_kept(hook["alerts"][0]["evidence"], event.rank or 0)

    # An alert that fits is sent as it is.
    small = sample_events.event()
    pd = PagerDutyNotifier(KEY, "http://pd").payload(small)
    assert "cut" not in pd["payload"]["custom_details"]["evidence"]
    hook = WebhookNotifier.payload(sample_events.note(small))
    assert wire.dumps(hook["alerts"][0]["evidence"]) == wire.dumps(small.evidence)


def test_the_page_of_a_256_rank_hang_is_accepted_by_every_channel(tmp_path: Path):
    """Over real HTTP: the sidecar's own page, to receivers that refuse what each service
    refuses (before: PagerDuty answered 400 to a 1.28 MB event, a lost page)."""
    (tmp_path / "rules.yaml").write_text(RULES)
    with Receiver("pagerduty") as pd, Receiver("slack") as slack, \
            Receiver("webhook") as hook:
        settings = load_settings(
            data_dir=tmp_path / "d", tick_interval_seconds=0.2,
            detectors={"hang_settle_seconds": 0},
            alerting={"rules_file": tmp_path / "rules.yaml", "group_wait_seconds": 0.05,
                      "pagerduty": {"routing_key": KEY, "url": pd.url + "/v2/enqueue"},
                      "slack": {"webhook_url": slack.url + "/services/T/B/X",
                                "min_interval_seconds": 0},
                      "webhook": {"url": hook.url + "/hook"}})
        with LiveServer(settings) as srv:
            records = _records("g", time.time())
            for i in range(0, len(records), 200):
                res = httpx.post(srv.url + "/v1/records", json={"records": records[i:i + 200]},
                                 timeout=60)
                assert res.status_code == 200, res.text
            [pd_got] = pd.wait_for(1, timeout=60)
            [slack_got] = slack.wait_for(1, timeout=60)
            [hook_got] = hook.wait_for(1, timeout=60)
    assert pd_got.status == 202, (len(pd_got.body), pd_got.json)
    assert slack_got.status == 200, (slack_got.json, slack.block_errors)
    assert hook_got.status == 200, len(hook_got.body)
    evidence = pd_got.json["payload"]["custom_details"]["evidence"]
    culprit = int(next(iter(evidence["ranks"])))
    assert f"rank {culprit} stuck" in pd_got.json["payload"]["summary"]
    _culprit_kept(evidence, culprit)
    _culprit_kept(hook_got.json["alerts"][0]["evidence"], culprit)
