"""Slack 429s, PagerDuty 500s, timeouts and refused connections: ingest carries on, every
alert is delivered once after recovery, and a filling outbox is bounded, counted and logged."""

from __future__ import annotations

import pytest

from tests.reliability.notify_outage import notify_outage


@pytest.mark.slow
def test_failing_receivers_delay_nothing_and_lose_nothing(tmp_path):
    report = notify_outage(tmp_path, outage_seconds=6, runs=4)
    assert report.failed_attempts >= 8, report.summary()  # the outage really was hit
    assert report.max_pending >= 4, report.summary()  # both channels queued while down
    assert len(report.outage_ms) > 4  # every ingest during the outage answered 200
    assert len(report.pages) == 4 and report.duplicated == 0, report.summary()
    assert report.slack_firing == 4 and report.not_delivered == 0, report.summary()


@pytest.mark.slow
def test_a_full_outbox_is_bounded_counted_and_logged(tmp_path):
    report = notify_outage(tmp_path, outage_seconds=3, runs=4,
                           extra_config="  outbox: {max_pending: 3}\n")
    assert report.max_pending <= 3, report.summary()
    assert "outbox full (3 pending)" in report.log
    assert len(report.pages) + report.slack_firing < 8  # what did not fit was dropped...
    assert report.duplicated == 0  # ...and what did fit went out once
