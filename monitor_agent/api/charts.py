"""``GET /v1/runs/{run_id}/series`` and ``/matrix/{stat}``: the charts' reads of the history.

A run's per-step scalars in at most ``points`` buckets, and a per-layer statistic as a
layers x buckets matrix, read from the chart history (``history/``) on a read-only
connection of the request's own; tests/api/test_charts.py asks them over real HTTP. The
series answer is ``series_answer`` (the report embeds the very same one), read here from a
history of three steps::

    >>> from monitor_agent.history.builder import HistoryBuilder
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

from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Response

from monitor_agent.api.chart_models import (
    Band,
    BranchOut,
    Evals,
    MatrixOut,
    RankStepTimes,
    SeriesOut,
    UserSeries,
)
from monitor_agent.api.deps import HistoryDep, ReadSlotsDep, ServicesDep, require_read
from monitor_agent.api.streamed_page import built_in_slot
from monitor_agent.detectors.settings import DetectorSettings
from monitor_agent.detectors.update_ratio import UpdateRatioSettings
from monitor_agent.history import series as sr
from monitor_agent.history.schema import History, open_history
from monitor_agent.storage.database import StorageError

router = APIRouter(tags=["ui"], dependencies=[Depends(require_read)])
Rank = Query(0, ge=0, le=2**31, description="Which rank's series.")
Points = Query(1000, ge=2, le=sr.MAX_POINTS, description="At most this many buckets.")


def _step(what: str) -> Any:
    # One Query object per parameter: FastAPI binds a shared one to a single name.
    return Query(None, ge=-1, le=2**62, description=f"{what} step of the range (default: "
                 f"the run's {what.lower()}).")


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


@router.get("/v1/runs/{run_id}/series", response_model=SeriesOut,
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


@router.get("/v1/runs/{run_id}/matrix/{stat}", response_model=MatrixOut,
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
