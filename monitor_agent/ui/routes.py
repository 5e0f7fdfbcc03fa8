"""The web UI: the runs page, the run page, their static assets and the chart endpoints.

Pages are static HTML that fetch JSON from the API with the token the user typed (kept
in the tab's sessionStorage), so the page is exactly as protected as the API. History for
charts is read from the history database (``history.py``) on a read-only connection of
the request's own; live engine facts (status, progress) go through the engine thread.

``GET /v1/runs/gpt-7/series?points=800`` answers a run's per-step scalars in at most 800
buckets, and ``GET /v1/runs/gpt-7/matrix/grad_norm?points=400`` a per-layer statistic as a
layers x buckets matrix (``series.matrix``); tests/ui/test_series.py asks them over real
HTTP. The series answer is ``series_answer``, read here from a history of three steps::

    >>> from monitor_agent.ui.history import HistoryBuilder
    >>> db = open_history(":memory:")
    >>> builder = HistoryBuilder(db)
    >>> builder.add({"kind": "run", "run_id": "gpt-7", "config": {"total_steps": 100}})
    >>> for step in (1, 2, 3):
    ...     builder.add({"kind": "step", "run_id": "gpt-7", "step": step, "time": 1.0,
    ...                  "loss": 3.0 - step / 2})
    >>> builder.commit()
    >>> out = series_answer(db, "gpt-7", rank=0, start=None, end=None, points=800)
    >>> out.range, out.bucketed, out.series["loss"].mean, out.total_steps
    ([1, 3], False, [2.5, 2.0, 1.5], 100)
    >>> series_answer(db, "no-such-run", 0, None, None, 800) is None   # the route's 404
    True
    >>> db.close()
"""

from __future__ import annotations

from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from monitor_agent.api.deps import (
    AlertingDep,
    HistoryDep,
    QueriesDep,
    ReadSlotsDep,
    RunnerDep,
    ServicesDep,
    require_read,
)
from monitor_agent.api.streamed_page import SLOT_WAIT, answered, built_in_slot
from monitor_agent.detectors.settings import DetectorSettings
from monitor_agent.detectors.update_ratio import UpdateRatioSettings
from monitor_agent.storage.database import StorageError
from monitor_agent.ui import series as sr
from monitor_agent.ui.history import History, open_history
from monitor_agent.ui.models import (
    Band,
    BranchOut,
    Evals,
    MatrixOut,
    RankStepTimes,
    RunsOut,
    RunSummaryOut,
    SeriesOut,
    UserSeries,
)

STATIC = resources.files("monitor_agent.ui") / "static"
pages = APIRouter(include_in_schema=False)
api = APIRouter(tags=["ui"], dependencies=[Depends(require_read)])
Rank = Query(0, ge=0, le=2**31, description="Which rank's series.")
Points = Query(1000, ge=2, le=sr.MAX_POINTS, description="At most this many buckets.")


def _step(what: str) -> Any:
    # One Query object per parameter: FastAPI binds a shared one to a single name.
    return Query(None, ge=-1, le=2**62, description=f"{what} step of the range (default: "
                 f"the run's {what.lower()}).")


@pages.get("/", response_class=HTMLResponse)
def runs_page() -> HTMLResponse:
    return HTMLResponse((STATIC / "runs.html").read_text())


@pages.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(run_id: str) -> HTMLResponse:
    return HTMLResponse((STATIC / "run.html").read_text())


@pages.get("/compare", response_class=HTMLResponse)
def compare_page() -> HTMLResponse:
    return HTMLResponse((STATIC / "compare.html").read_text())


@pages.get("/ui/static/{path:path}")
def static(path: str) -> Response:
    target = STATIC.joinpath(*[p for p in path.split("/") if p not in ("", ".", "..")])
    if not target.is_file():
        raise HTTPException(404, f"no asset {path!r}")
    kind = {"js": "text/javascript", "css": "text/css", "png": "image/png"}.get(
        path.rsplit(".", 1)[-1], "application/octet-stream")
    return Response(target.read_bytes(), media_type=kind,
                    headers={"Cache-Control": "max-age=300"})


def _history(path: Path) -> History:
    try:
        if not path.is_file():
            raise StorageError(f"{path} does not exist yet")
        return open_history(path, readonly=True)
    except StorageError as exc:
        raise HTTPException(503, f"chart history not readable yet: {exc}; retry shortly",
                            headers={"Retry-After": "1"}) from exc


def series_answer(db: History, run_id: str, rank: int, start: int | None,
                  end: int | None, points: int,
                  detectors: DetectorSettings | None = None) -> SeriesOut | None:
    """The whole series answer (the report embeds the very same one); ``detectors`` are the
    sidecar's detector settings (default: the defaults)."""
    detectors = detectors or DetectorSettings()
    meta = sr.run_meta(db, run_id)
    found = sr.scalars(db, run_id, rank, start, end, points)
    if (not found["steps"] and not meta["layers"] and sr.step_range(db, run_id, rank) is None
            and not sr.has_run(db, run_id)):
        return None
    lo, hi = found.get("range", [0, 0])
    user = sr.user_names(db, run_id)
    return SeriesOut(
        run_id=run_id, rank=rank, ranks=sr.ranks(db, run_id), range=[lo, hi],
        count=found.get("count", 0), bucketed=found["bucketed"], steps=found["steps"],
        series=found["series"], nonfinite_steps=found["nonfinite_steps"],
        skipped_steps=found["skipped_steps"],
        update_band=Band.model_validate(
            sr.update_band(found["steps"], meta["warmup"] or 0, meta["total_steps"])),
        evals=Evals.model_validate(sr.evals(db, run_id, rank, start, end, points)),
        rank_step_time=RankStepTimes.model_validate(
            sr.rank_step_times(db, run_id, lo, hi, points)),
        latest=sr.latest(db, run_id, rank),
        recent_tokens_per_second=sr.recent_throughput(db, run_id, rank),
        update_limits=[detectors.knobs(UpdateRatioSettings).update_ratio_min,
                       detectors.update_ratio_max],
        repeat_every_steps=detectors.repeat_every_steps, user_names=user,
        user_scalars={n: UserSeries.model_validate(v) for n, v in sr.user_series(
            db, run_id, rank, lo, hi, points, user[:sr.USER_CHARTS]).items()},
        warmup=meta["warmup"] or 0, total_steps=meta["total_steps"],
        layers=meta["layers"], modules=meta["modules"],
        branches=[BranchOut.model_validate(b) for b in sr.branches(db, run_id, rank, start, end)],
    )


@api.get("/v1/runs/{run_id}/series", response_model=SeriesOut,
         summary="Per-step scalars of a run, downsampled on the server for charts")
def get_series(run_id: str, history: HistoryDep, services: ServicesDep, slots: ReadSlotsDep,
               points: int = Points, rank: int = Rank, start: int | None = _step("First"),
               end: int | None = _step("Last")) -> Response:
    detectors = services.settings.detectors

    def build() -> bytes:
        db = _history(history)
        try:
            out = series_answer(db, run_id, rank, start, end, points, detectors)
        finally:
            db.close()
        if out is None:
            raise HTTPException(404, f"no run {run_id!r} in the chart history (yet)")
        return out.model_dump_json().encode()
    return built_in_slot(slots, build)


@api.get("/v1/runs/{run_id}/matrix/{stat}", response_model=MatrixOut,
         summary="A per-layer statistic as a layers x step-buckets matrix")
def get_matrix(
    run_id: str, history: HistoryDep, slots: ReadSlotsDep,
    stat: Literal["grad_norm", "update_ratio", "act_max_abs", "act_zero_frac", "grad_quantiles"],
    points: int = Query(400, ge=2, le=sr.MAX_POINTS), rank: int = Rank,
    start: int | None = _step("First"), end: int | None = _step("Last"),
    layer: str | None = Query(None, max_length=1000),
) -> Response:
    def build() -> bytes:
        db = _history(history)
        try:
            out = MatrixOut(**sr.matrix(db, run_id, stat, rank, start, end, points, layer))
        finally:
            db.close()
        return out.model_dump_json().encode()
    return built_in_slot(slots, build)


@api.get("/v1/ui/runs", response_model=RunsOut, summary="One line per run for the runs page")
async def get_runs(queries: QueriesDep, runner: RunnerDep, alerting: AlertingDep,
                   slots: ReadSlotsDep) -> Response:
    await run_in_threadpool(slots.take, SLOT_WAIT)  # a large read (api/streamed_page.py)
    try:
        firing: dict[str, int] = {}
        # The alert database has its own lock: read it in a worker, not on the event loop.
        for alert in await run_in_threadpool(alerting.list_alerts, state="firing",
                                             limit=10_000):
            firing[alert.run_id] = firing.get(alert.run_id, 0) + 1
        # Field by field, not asdict: the verdict stays a Verdict, as the model declares it.
        rows = [RunSummaryOut(**{f.name: getattr(s, f.name) for f in fields(s)},
                              firing_alerts=firing.get(s.run_id, 0))
                for s in await runner.call(queries.run_summaries)]
        body = await run_in_threadpool(lambda: RunsOut(runs=rows).model_dump_json().encode())
        return answered(slots, body)
    except BaseException:
        slots.give()
        raise
