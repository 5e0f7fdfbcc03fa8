"""Runs that end or go silent leave /metrics and memory after their TTL; the store keeps
their history. bench/chaos.py runs the same with thousands of runs and prints RSS."""

from __future__ import annotations

import pytest

from tests.reliability.churn import churn, churn_env
from tests.sidecar_process import SidecarProcess


@pytest.mark.slow
def test_expired_runs_leave_metrics_and_memory(tmp_path):
    with SidecarProcess(tmp_path / "churn", env=churn_env(ttl=1.0)) as sc:
        report = churn(sc.url, sc.proc.pid, runs=300, ttl=1.0, batch=50)
    assert report.peak_runs_on_metrics > 0, report.line()
    assert report.runs_on_metrics_after == 0 and report.active_after == 0, report.line()
    assert report.stored_runs == 300, report.line()
