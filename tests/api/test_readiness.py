"""Readiness: what /readyz reports and ingest is gated on, and its gauge."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from monitor_agent.api.readiness import Readiness
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.storage.database import StorageError


def test_readiness_is_exported_as_a_gauge():
    registry = CollectorRegistry()
    readiness = Readiness(SelfMetrics(registry, "test"))
    readiness.set("storage: disk full")
    assert not readiness.ready
    assert registry.get_sample_value("monitor_agent_ready") == 0
    readiness.set(None)
    assert readiness.ready and registry.get_sample_value("monitor_agent_ready") == 1


def test_a_full_disk_blocks_ingest_until_a_write_succeeds_again():
    readiness = Readiness(SelfMetrics(CollectorRegistry(), "test"))
    readiness.set(None)
    readiness.failed(StorageError("database or disk is full"))
    assert not readiness.ready
    assert readiness.problems() == ["storage: database or disk is full"]
    readiness.set(None)  # what the tick does once a write succeeds
    assert readiness.ready and readiness.problems() == []


def test_a_corrupt_database_stays_not_ready_past_a_successful_write():
    readiness = Readiness(SelfMetrics(CollectorRegistry(), "test"))
    readiness.set(None)
    readiness.failed(StorageError("malformed", source="alert storage", corrupt=True))
    readiness.set(None)
    assert not readiness.ready
    assert readiness.problems() == ["alert storage is corrupt: malformed"]


def test_a_corrupt_derived_database_is_repaired_and_never_blocks_ingest():
    readiness = Readiness(SelfMetrics(CollectorRegistry(), "test"))
    readiness.set(None)
    repaired: list[str] = []
    readiness.repairs["chart history"] = lambda: repaired.append("rebuild")
    readiness.failed(StorageError("malformed", source="chart history", corrupt=True))
    assert repaired == ["rebuild"]
    assert readiness.ready and readiness.problems() == []


def test_every_watched_part_is_reported_after_storage():
    readiness = Readiness(SelfMetrics(CollectorRegistry(), "test"))
    readiness.watch(lambda: None)
    readiness.watch(lambda: "alerting: flusher thread died")
    assert readiness.problems() == ["starting", "alerting: flusher thread died"]
    readiness.set(None)
    assert readiness.ready  # a broken part is reported, yet records are still taken
    assert readiness.problems() == ["alerting: flusher thread died"]
