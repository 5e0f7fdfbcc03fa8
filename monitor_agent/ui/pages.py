"""The web UI's pages: the runs page, the run page, the compare page and their static files.

Pages are static HTML that fetch JSON from the API with the token the user typed (kept in
the tab's sessionStorage), so a page is exactly as protected as the API: the charts read
``/v1/runs/{id}/series`` and ``/matrix/{stat}`` (api/charts.py), the runs page
``/v1/ui/runs`` (api/runs_page.py). The pages themselves hold no data and ask no token.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, HTTPException, Response
from fastapi.responses import HTMLResponse

STATIC = resources.files("monitor_agent.ui") / "static"
router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
def runs_page() -> HTMLResponse:
    return HTMLResponse((STATIC / "runs.html").read_text())


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(run_id: str) -> HTMLResponse:
    return HTMLResponse((STATIC / "run.html").read_text())


@router.get("/compare", response_class=HTMLResponse)
def compare_page() -> HTMLResponse:
    return HTMLResponse((STATIC / "compare.html").read_text())


@router.get("/ui/static/{path:path}")
def static(path: str) -> Response:
    target = STATIC.joinpath(*[p for p in path.split("/") if p not in ("", ".", "..")])
    if not target.is_file():
        raise HTTPException(404, f"no asset {path!r}")
    kind = {"js": "text/javascript", "css": "text/css", "png": "image/png"}.get(
        path.rsplit(".", 1)[-1], "application/octet-stream")
    return Response(target.read_bytes(), media_type=kind,
                    headers={"Cache-Control": "max-age=300"})
