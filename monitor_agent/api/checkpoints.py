"""``GET /v1/runs/{run_id}/checkpoints``: the run's checkpoint ledger, each one judged.

The checkpoints the trainer reported (``checkpoint`` records, docs/format.md) of the run's
current history, oldest first, each ``clean`` or ``suspect`` with the reason, and the last
clean one: which save is safe to go back to, so the person paged at 3 AM need not work
it out. Judged on the engine thread from the run's findings as they stand now
(runs/checkpoint_ledger.py), so a fault found after a save can make it suspect later.

A run may report tens of thousands of checkpoints (one every few steps of a long run), so
the list is read as every list is (api/streamed_page.py): a page of at most ``limit``
checkpoints and ``read_page_bytes``, written a chunk at a time, then ``"next"``, the link
to the following page (``after=STEP:ATTEMPT``, the attempt's number), null once nothing
follows; ``last_clean`` is on every page. One unpaged answer of 20,000 checkpoints was
21.5 MB and held +70 MB while it was built.

``points=N`` asks instead for what a chart can draw (the run page's checkpoint marks):
the checkpoints of steps ``start``..``end`` thinned like the charts' series, at most one
per N-th of the range (``thin``), each with ``also``: how many others of its part it
stands for. tests/api/test_checkpoints.py reads it over real HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from fastapi.concurrency import run_in_threadpool

from monitor_agent.api.deps import QueriesDep, ReadSlotsDep, RunnerDep, ServicesDep, require_read
from monitor_agent.api.models import CheckpointsOut
from monitor_agent.api.streamed_page import SLOT_WAIT, Page, answered, streamed
from monitor_agent.reads.queries import checkpoint_key
from monitor_agent.records import wire
from monitor_agent.runs.checkpoint_ledger import Judged, LedgerEntry, judged_dict

router = APIRouter(tags=["runs"], dependencies=[Depends(require_read)])
AFTER = r"^-?[0-9]{1,19}:[0-9]{1,10}$"
MAX_POINTS = 2000


@router.get("/v1/runs/{run_id}/checkpoints", response_model=CheckpointsOut,
            summary="The run's checkpoints, each clean or suspect, and the last clean one")
async def get_checkpoints(
    run_id: str, queries: QueriesDep, runner: RunnerDep, services: ServicesDep,
    slots: ReadSlotsDep,
    limit: int = Query(1000, ge=1, le=10_000),
    after: str | None = Query(None, pattern=AFTER, description=(
        "Continue after this checkpoint (STEP:ATTEMPT), as the previous page's `next` says.")),
    points: int | None = Query(None, ge=1, le=MAX_POINTS, description=(
        "Thinned for a chart: at most this many (and the last clean one), each standing for "
        "the `also` others of its part of the range; the answer is whole (`next` null).")),
    start: int | None = Query(None, ge=-1, le=2**62, description=(
        "With `points`: the first step of the range (default: the first checkpoint).")),
    end: int | None = Query(None, ge=-1, le=2**62, description=(
        "With `points`: the last step of the range (default: the last checkpoint).")),
) -> Response:
    if points is not None:
        return await _thinned(run_id, queries, runner, slots, points, start, end)
    key = None
    if after is not None:
        step, attempt = after.split(":")
        key = (int(step), int(attempt))
        if not -1 <= key[0] <= 2**62:
            raise HTTPException(422, f"after: {after!r} is out of range; use the `next` link")
    first = await runner.call(queries.checkpoints, run_id, None, 0)
    if first is None:
        raise HTTPException(404, f"no run {run_id!r}")
    head = (b'{"run_id":' + wire.dumps(run_id) + b',"last_clean":'
            + wire.dumps(_last_clean(first[1])) + b',"checkpoints":[')

    async def fetch(after_key: Any, max_rows: int, max_bytes: int) -> Any:
        found = await runner.call(queries.checkpoints, run_id, after_key, max_rows)
        if found is None:
            return None
        return await run_in_threadpool(_rows, found[0], max_bytes)

    def link(last: tuple[int, int]) -> str:
        params = urlencode([("limit", limit), ("after", f"{last[0]}:{last[1]}")])
        return f"/v1/runs/{quote(run_id, safe='')}/checkpoints?{params}"

    page = Page(head, fetch, limit, services.settings.read_page_bytes, link)
    return await streamed(slots, page, key, f"no run {run_id!r}")


def _rows(judged: Sequence[Judged], max_bytes: int) -> list[tuple[tuple[int, int], bytes]]:
    """Checkpoints as a page's stored lines: at most ``max_bytes`` (but at least one)."""
    out: list[tuple[tuple[int, int], bytes]] = []
    size = 0
    for j in judged:
        body = wire.dumps(judged_dict(j))
        if out and size + len(body) > max_bytes:
            break
        out.append((checkpoint_key(j), body))
        size += len(body)
    return out


def _last_clean(entry: LedgerEntry | None) -> dict[str, Any] | None:
    return None if entry is None else {"step": entry.step, "path": entry.path}


async def _thinned(run_id: str, queries: Any, runner: Any, slots: Any, points: int,
                   start: int | None, end: int | None) -> Response:
    # At most MAX_POINTS + 1 checkpoints of at most ~4.4 KB (path and tag budgets): a read
    # answer built whole, in a read slot like the charts (api/streamed_page.py).
    await run_in_threadpool(slots.take, SLOT_WAIT)
    try:
        found = await runner.call(queries.checkpoints, run_id, None, None, start, end)
        if found is None:
            raise HTTPException(404, f"no run {run_id!r}")
        inside, last = found

        def build() -> bytes:
            return wire.dumps({"run_id": run_id, "last_clean": _last_clean(last),
                               "checkpoints": thin(inside, points, last), "next": None})
        return answered(slots, await run_in_threadpool(build))
    except BaseException:
        slots.give()
        raise


def thin(judged: Sequence[Judged], points: int,
         last_clean: LedgerEntry | None = None) -> list[dict[str, Any]]:
    """At most ``points`` of these checkpoints (oldest first), plus the last clean one.

    The steps they span are cut into ``points`` equal parts; each part with checkpoints
    shows one: its first suspect one (where the trouble it saved began), else its newest;
    and the last clean checkpoint (what a rollback goes back to) is always shown. Each
    carries ``also``: the others of its part that it stands for. Fewer than ``points``
    are shown as they are::

        >>> from monitor_agent.runs.checkpoint_ledger import judge, Fault
        >>> ledger = judge([LedgerEntry(s, f"/c/{s}", 0, None, 1) for s in range(10, 101, 10)],
        ...                [Fault("nan_inf", rank=0, onset=75, step=75)])
        >>> [(c["step"], c["status"], c["also"]) for c in thin(ledger, 2, ledger[6].entry)]
        [(50, 'clean', 4), (70, 'clean', 0), (80, 'suspect', 3)]
    """
    if len(judged) <= points:
        return [{**judged_dict(j), "also": 0} for j in judged]
    first, last = judged[0].entry.step, judged[-1].entry.step
    span = (last - first) / points or 1.0
    parts: dict[int, list[Judged]] = {}
    for j in judged:
        parts.setdefault(min(int((j.entry.step - first) / span), points - 1), []).append(j)
    rollback = None if last_clean is None else (last_clean.step, last_clean.attempt)
    shown: list[tuple[Judged, int]] = []
    for part in parts.values():
        keep = [j for j in part if checkpoint_key(j) == rollback]
        pick = next((j for j in part if j.status == "suspect"), part[-1])
        if pick not in keep:
            keep.append(pick)
        shown.extend((j, len(part) - len(keep) if j is pick else 0) for j in keep)
    shown.sort(key=lambda item: checkpoint_key(item[0]))
    return [{**judged_dict(j), "also": also} for j, also in shown]
