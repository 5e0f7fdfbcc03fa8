"""``relaunched`` (detectors/relaunched.py): the engine says once that the job's launcher
ran it again after a crash, and only then: not after a clean end, not for a job whose
ranks did not say a launcher restarts them (the relaunch that ended a hang, or carried out
a restart, has its own page: tests/alerting/test_restart_sidecar.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.records import schemas
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store

TORCHRUN = {"name": "torchrun", "restarts": True, "restart_count": 0, "max_restarts": 3}


def _ingest(engine: Engine, records: list[dict], now: float) -> list[str]:
    result = engine.ingest([Incoming(i, *schemas.parse_for_store(r))
                            for i, r in enumerate(records)], now)
    return [f.message for f in result.findings if f.type == "relaunched"]


def _attempt(token: str, steps: range, launcher: dict | None = TORCHRUN,
             end: str | None = None) -> list[dict]:
    out: list[dict] = [{"kind": "run", "run_id": "r", "attempt": token, "time": 1.0,
                        **({"launcher": launcher} if launcher else {})}]
    out += [{"kind": "step", "run_id": "r", "step": s, "time": 100.0 + s, "loss": 2.0,
             "attempt": token} for s in steps]
    if end is not None:
        out.append({"kind": "end", "run_id": "r", "step": steps[-1], "time": 200.0,
                    "attempt": token, "status": end})
    return out


def _engine(tmp_path) -> Engine:
    return Engine(Settings(), Store(tmp_path / "m.sqlite"), SelfMetrics(CollectorRegistry()))


def test_a_crash_its_launcher_relaunched_is_said_once(tmp_path):
    engine = _engine(tmp_path)
    assert _ingest(engine, _attempt("a", range(1, 31)), now=10.0) == []
    [said] = _ingest(engine, _attempt("b", range(21, 41)), now=22.0)
    assert said == ("the job's launcher relaunched it after a crash: attempt 1 stopped at "
                    "step 30 with no end record (a rank's process died: killed, out of "
                    "memory, or crashed), and attempt 2 resumed at step 21, 12 s later; no "
                    "person acted")
    assert _ingest(engine, _attempt("b", range(41, 45))[1:], now=23.0) == []


def test_no_page_after_a_clean_end_or_for_a_relaunch_by_hand(tmp_path):
    engine = _engine(tmp_path)
    _ingest(engine, _attempt("a", range(1, 31), end="completed"), now=10.0)
    assert _ingest(engine, _attempt("b", range(21, 41)), now=20.0) == []
    other = _engine(tmp_path / "x")
    _ingest(other, _attempt("a", range(1, 31), launcher=None), now=10.0)
    assert _ingest(other, _attempt("b", range(21, 41), launcher=None), now=20.0) == []
