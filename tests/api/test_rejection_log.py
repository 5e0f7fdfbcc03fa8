"""The 401 log (api/rejection_log.py): a misconfigured client shows as one line an
interval, counting what was held back, never one line per request."""

from __future__ import annotations

import logging

import pytest
from starlette.requests import Request

from monitor_agent.api.rejection_log import RejectionLog


def _request() -> Request:
    return Request({"type": "http", "method": "POST", "path": "/v1/records", "headers": [],
                    "client": ("10.0.0.7", 41234), "query_string": b""})


def test_one_line_an_interval_then_the_count_held_back(caplog: pytest.LogCaptureFixture):
    rejections = RejectionLog(interval=3600.0)
    with caplog.at_level(logging.WARNING, logger="monitor_agent.api.rejection_log"):
        for _ in range(4):
            rejections.rejected(_request(), "wrong bearer token")
        assert [r.getMessage() for r in caplog.records] == [
            "401 for POST /v1/records from 10.0.0.7: wrong bearer token"]
        rejections.interval = 0.0  # the interval has passed
        rejections.rejected(_request(), "no bearer token")
    assert caplog.records[-1].getMessage() == (
        "401 for POST /v1/records from 10.0.0.7: no bearer token "
        "(3 more since the last such line)")
    assert len(caplog.records) == 2
