"""Engine housekeeping on a live sidecar: retention runs a slice per tick and keeps the
newest ``retention_steps`` steps of every run and rank; evals and other kinds stay. And the
engine's one seam to alerting, ``AlertSink``: what it is told, and that none is needed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from monitor_agent.alerting.alerts import RunContext
from monitor_agent.alerting.sink import AlertSink
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.records import schemas
from monitor_agent.records.actions import Action
from monitor_agent.records.types import Finding
from monitor_agent.settings import load_settings
from monitor_agent.storage.store import Store
from tests.eventually import eventually
from tests.live_server import LiveServer


def _stored_steps(url: str, run: str, rank: int = 0) -> list[int]:
    body = httpx.get(f"{url}/v1/runs/{run}/records", params={"limit": 10_000}).json()
    return [r["step"] for r in body["records"] if r["kind"] == "step" and r["rank"] == rank]


def test_retention_keeps_the_newest_steps_of_every_rank(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, retention_steps=100, tick_interval_seconds=0.05)
    with LiveServer(settings) as srv:
        for run in ("a", "b"):
            records = [{"kind": "step", "run_id": run, "step": s, "rank": rank,
                        "time": 1000.0 + s, "loss": 1.0}
                       for s in range(1, 201) for rank in (0, 1)]
            records.append({"kind": "eval", "run_id": run, "step": 10, "time": 1010.5,
                            "val_loss": 1.0})
            assert httpx.post(srv.url + "/v1/records", json={"records": records}).is_success
        eventually(lambda: len(_stored_steps(srv.url, "b", 1)) <= 100, timeout=20,
                   what="retention trimmed run b")
        for run in ("a", "b"):
            for rank in (0, 1):
                assert _stored_steps(srv.url, run, rank) == list(range(101, 201))
        evals = httpx.get(f"{srv.url}/v1/runs/a/records", params={"kind": "eval"}).json()
        assert [r["step"] for r in evals["records"]] == [10]


class RecordingSink:
    """An ``AlertSink`` that remembers what the engine told it and asks for one action."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def handle(self, run: RunContext, findings: list[Finding], now: float) -> list[Action]:
        self.calls.append(("handle", run, [f.type for f in findings]))
        return [_stop(run.run_id)]

    def preview(self, run: RunContext, findings: list[Finding], now: float) -> int:
        self.calls.append(("preview", run, [f.type for f in findings]))
        return len(findings)

    def run_ended(self, run_id: str, status: str, now: float, step: int | None = None,
                  verdict: str | None = None) -> None:
        self.calls.append(("run_ended", run_id, status, step))

    def tick(self, now: float) -> None:
        self.calls.append(("tick", now))

    def attempt_settled(self, run_id: str, start_step: int, now: float,
                        started: float | None = None) -> None:
        self.calls.append(("attempt_settled", run_id, start_step))

    def cost_with(self, costs: object) -> None:
        self.costs = costs

    def open_actions(self, run_id: str) -> list[Action]:
        return []

    def took_action(self, run_id: str, action_id: int, action: str) -> bool:
        return action == "stop"  # the one action it asks for

    def waiting(self, run_id: str) -> bool:
        return False

    def retry(self, run: RunContext, now: float) -> list[Action]:
        return []


def _stop(run_id: str) -> Action:
    return Action(id=1, run_id=run_id, action="stop", rule="Stop", type="nan_inf", step=1,
                  message="stop requested", created_at=0.0)


def _items(objs: list[dict]) -> list[Incoming]:
    return [Incoming(i, *schemas.parse_for_store(o)) for i, o in enumerate(objs)]


def _engine(tmp_path: Path, alerts: AlertSink | None = None) -> Engine:
    settings = load_settings(data_dir=tmp_path)
    return Engine(settings, Store(":memory:"), SelfMetrics(CollectorRegistry()), alerts)


def test_the_engine_tells_its_alert_sink_about_findings_ends_and_ticks(tmp_path: Path):
    sink = RecordingSink()
    engine = _engine(tmp_path, sink)
    run = {"kind": "run", "run_id": "r", "labels": {"team": "nlp"},
           "config": {"project": "gpt"}}
    nan = {"kind": "step", "run_id": "r", "step": 1, "time": 1.0, "loss": "NaN"}
    result = engine.ingest(_items([run, nan]), now=5.0)
    assert result.accepted == 2
    assert result.actions == [_stop("r")]
    kind, context, types = sink.calls[0]
    assert (kind, context.run_id, context.project, context.labels) == (
        "handle", "r", "gpt", {"team": "nlp"})
    assert "nan_inf" in types
    ahead = {"kind": "step", "run_id": "r", "step": 2, "time": 2.0, "loss": "Infinity"}
    assert engine.preview(_items([ahead]), now=6.0).begun >= 1
    assert sink.calls[-1][0] == "preview"
    engine.ingest(_items([{"kind": "end", "run_id": "r", "step": 2, "time": 3.0,
                           "status": "stopped"}]), now=7.0)
    assert sink.calls[-1] == ("run_ended", "r", "stopped", 2)
    engine.tick(now=8.0)
    assert ("tick", 8.0) in sink.calls


def test_without_a_sink_findings_are_still_stored_and_nothing_pages(tmp_path: Path):
    engine = _engine(tmp_path)
    nan = {"kind": "step", "run_id": "r", "step": 1, "time": 1.0, "loss": "NaN"}
    result = engine.ingest(_items([nan]), now=5.0)
    assert [f.type for f in result.findings] == ["nan_inf"] and result.actions == []
    assert engine.store.finding_counts("r") == {"nan_inf": 1}
    previewed = engine.preview(_items([nan]), now=6.0)
    assert previewed.begun == 0 and previewed.unknown_run == []


class FailingOnceSink(RecordingSink):
    """A sink whose first ``handle`` raises something other than a storage error."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def handle(self, run: RunContext, findings: list[Finding], now: float) -> list[dict]:
        if not self.failed:
            self.failed = True
            raise OverflowError("cannot convert float infinity to integer")
        return super().handle(run, findings, now)


def test_any_failure_after_the_commit_analyses_the_run_again_on_the_retry(tmp_path: Path):
    """The records are stored, their alert state is not: the retry is all duplicates, and
    still the NaN reaches the sink (the run was judged again from the store)."""
    sink = FailingOnceSink()
    engine = _engine(tmp_path, sink)
    ok = [{"kind": "step", "run_id": "r", "step": s, "time": float(s), "loss": 1.0}
          for s in (1, 2)]
    engine.ingest(_items(ok), now=3.0)
    nan = _items([{"kind": "step", "run_id": "r", "step": 3, "time": 3.0, "loss": "NaN"}])
    with pytest.raises(OverflowError):  # reaches the caller: the record is not acked
        engine.ingest(nan, now=4.0)
    assert engine.ingest(nan, now=5.0).duplicates == 1
    assert [c[2] for c in sink.calls if c[0] == "handle"] == [["nan_inf"]]
