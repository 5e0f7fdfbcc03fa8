"""Fixtures: a fake clock and a Harness (Alerting + Slack/PagerDuty receivers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from alert_harness import FakeClock, Harness
from tests.receivers import Receiver


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def harness(tmp_path: Path, clock: FakeClock) -> Iterator[Harness]:
    with Receiver("slack") as slack, Receiver("pagerduty") as pd:
        h = Harness(tmp_path, clock, slack, pd)
        try:
            yield h
        finally:
            h.alerting.stop(timeout=5)
