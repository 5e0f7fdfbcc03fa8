"""The services seam: before the databases open, what needs them answers 503 (the storage
gate answers first; the typed accessors refuse the same way rather than hand out None)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import HTTPException
from prometheus_client import CollectorRegistry

from monitor_agent.api.readiness import Readiness
from monitor_agent.api.services import Services
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.runner import EngineRunner
from monitor_agent.settings import load_settings


def test_backends_are_refused_with_a_503_until_open(tmp_path: Path):
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry, "test")
    runner = EngineRunner()
    try:
        services = Services(load_settings(data_dir=tmp_path), registry, metrics, runner,
                            Readiness(metrics))
        assert not services.open and services.readiness.reason == "starting"
        for name in ("engine", "alerting", "exposition"):
            with pytest.raises(HTTPException) as info:
                getattr(services, name)
            assert info.value.status_code == 503
            assert "not ready: starting" in info.value.detail
        assert services.history_db == tmp_path / "history.sqlite"
    finally:
        runner.close()
