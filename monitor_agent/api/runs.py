"""``/v1/runs``: what the sidecar knows about each run, and its stored history."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from monitor_agent import wire
from monitor_agent.api.deps import require_read
from monitor_agent.engine import Engine
from monitor_agent.progress import run_progress
from monitor_agent.run_state import RankState, RunState

router = APIRouter(tags=["runs"], dependencies=[Depends(require_read)])

_LATEST = (
    "loss", "lr", "grad_norm", "clip_threshold", "param_norm", "update_norm", "update_ratio",
    "tokens_per_second", "mfu", "loss_scale", "step_time", "data_time",
)


@router.get("/v1/runs", summary="Every run the sidecar has stored, newest last")
async def list_runs(request: Request) -> dict[str, Any]:
    engine: Engine = request.app.state.engine
    rows = await request.app.state.runner.call(engine.store.runs)
    out = []
    for row in rows:
        live = engine.runs.get(row.run_id)
        out.append({
            "run_id": row.run_id,
            "status": live.status if live else row.status,
            "active": live is not None,
            "last_step": live.last_step if live else None,
            "first_seen": row.first_seen,
            "last_seen": row.last_seen,
            "findings": sum(live.findings.values()) if live else None,
        })
    return {"runs": out}


@router.get("/v1/runs/{run_id}", summary="Status, latest values, findings and alerts of a run")
async def get_run(run_id: str, request: Request) -> Response:
    app = request.app.state
    return _json(await app.runner.call(_run_detail, app.engine, app.alerting, run_id))


def _run_detail(engine: Engine, alerting: Any, run_id: str) -> dict[str, Any]:
    row = engine.store.run_row(run_id)
    if row is None:
        raise HTTPException(404, f"no run {run_id!r}")
    live = engine.runs.get(run_id)
    recent = [wire.loads(b) for b in engine.store.findings(run_id, limit=20)]
    detail: dict[str, Any] = {
        "run_id": run_id,
        "status": live.status if live else row.status,
        "active": live is not None,
        "first_seen": row.first_seen,
        "last_seen": row.last_seen,
        "ended_at": row.ended_at,
        "run": wire.loads(row.run_record) if row.run_record else None,
        "findings": {"by_type": engine.store.finding_counts(run_id), "recent": recent},
        "alerts": [_alert_view(a) for a in alerting.alerts_for_run(run_id)],
    }
    if live is not None:
        detail["last_step"] = live.last_step
        detail["ranks"] = {str(r): _rank_view(live, s) for r, s in sorted(live.ranks.items())}
    return detail


def _rank_view(run: RunState, state: RankState) -> dict[str, Any]:
    rec, ev = state.last, state.last_eval
    latest = {k: getattr(rec, k) for k in _LATEST} if rec is not None else {}
    if rec is not None:  # of the latest step with an update norm, not only the last step
        latest["effective_lr"] = state.last_effective_lr
    view: dict[str, Any] = {
        "last_step": state.last_step,
        "steps_total": state.steps_total,
        "tokens_total": state.tokens_total,
        "loss_ema": state.loss_ema,
        "latest": latest,
        "val_loss": ev.val_loss if ev else None,
        "eval_metrics": dict(ev.metrics) if ev else {},
    }
    found = run_progress(run, state)
    if found is not None:
        view["progress_ratio"], view["progress_basis"] = found.ratio, found.basis
        if found.eta_seconds is not None:
            view["eta_seconds"] = found.eta_seconds
    return view


def _alert_view(alert: Any) -> dict[str, Any]:
    if hasattr(alert, "to_dict"):
        return alert.to_dict()
    from dataclasses import asdict

    return asdict(alert)


@router.get("/v1/runs/{run_id}/records", summary="Stored records of a run, oldest first")
async def get_records(
    run_id: str,
    request: Request,
    since_step: int = Query(0, ge=-1, le=2**62,  # SQLite integers are 64-bit
                            description="First step to return (-1 includes the run record)."),
    limit: int = Query(1000, ge=1, le=10_000),
    kind: list[str] = Query(default_factory=list, description="Only these kinds."),
) -> dict[str, Any]:
    app = request.app.state
    bad = [k for k in kind if k not in ("run", "step", "eval", "end")]
    if bad:
        raise HTTPException(422, f"kind: unknown kind(s) {bad}; use run, step, eval, end")
    bodies = await app.runner.call(app.engine.store.records, run_id, since_step, limit, kind)
    if not bodies and await app.runner.call(app.engine.store.run_row, run_id) is None:
        raise HTTPException(404, f"no run {run_id!r}")
    # Stored lines may hold bare NaN tokens; answer with docs/format.md's string spelling.
    return _json({"run_id": run_id, "records": [wire.loads(b) for b in bodies]})


def _json(obj: Any) -> Response:
    return Response(wire.dumps(obj), media_type="application/json")


@router.get("/v1/runs/{run_id}/findings", summary="Findings of a run, newest first")
async def get_findings(
    run_id: str, request: Request, limit: int = Query(100, ge=1, le=10_000)
) -> dict[str, Any]:
    app = request.app.state
    bodies = await app.runner.call(app.engine.store.findings, run_id, limit)
    return _json({"run_id": run_id, "findings": [wire.loads(b) for b in bodies]})
