"""A flood of made-up runs, each paging a NaN, neither buries nor drops the real page
(issue 35, class 4): a real sidecar process, real SQLite, local Slack and PagerDuty
receivers. Order and outcome are asserted, not durations (bench/chaos.py --sections flood
has the figures)."""

from __future__ import annotations

import pytest

from tests.reliability.page_flood import page_flood


@pytest.mark.slow
def test_a_flood_of_new_runs_does_not_bury_the_real_page(tmp_path):
    """120 made-up runs page NaN before the real run does, Slack sends one message in 0.2 s:
    the real page is the next message on each channel (at most the one in flight before
    it), not the 121st; the made-up runs' pages went into summaries, each alert says so."""
    report = page_flood(tmp_path, runs=120, slack_interval=0.2, age=1.5, wait=40,
                        outbox="new_run_seconds: 1")
    for name, channel in report.channels.items():
        assert channel.latency_s is not None, (name, report.line())
        assert channel.ahead <= 1, (name, report.line())
        assert channel.state == "sent", (name, report.line())
    # Every made-up alert (one per run and channel) has a delivery state; all but the first
    # few of each channel (new_run_burst, 5) were folded into a summary.
    assert sum(report.fake_states.values()) == 240, report.fake_states
    summarised = sum(n for key, n in report.fake_states.items() if "summarised" in key)
    assert summarised >= 200, report.fake_states


@pytest.mark.slow
def test_a_flood_of_new_runs_cannot_fill_the_outbox_ahead_of_the_real_page(tmp_path):
    """250 made-up runs on an outbox of 100 places, shared by both channels (Slack holds
    its messages, one a second): the real page is queued and delivered on each, not
    refused at once as "outbox full"."""
    report = page_flood(tmp_path, runs=250, slack_interval=1.0, age=1.5, wait=30,
                        outbox="max_pending: 100, new_run_seconds: 1")
    for name, channel in report.channels.items():
        assert channel.state == "sent", (name, report.line())
        assert channel.latency_s is not None and channel.ahead <= 1, (name, report.line())
    assert "outbox full" not in report.log
