"""The backtest report: one self-contained HTML file with the run page's charts and every
finding the trace judge found marked, so a rule change can be judged on a past run.

The page is the very run page the sidecar serves; instead of calling the API it reads the
answers embedded in the file (same shapes, built by the same functions). Scripts, styles
and data are inlined: the file opens from disk with the network off.

``monitor-agent replay TRACE --report report.html`` (cli.py) writes one. The report of a
run that hung after eight steps: its stall finding is embedded, and nothing is fetched::

    >>> import json, tempfile
    >>> from monitor_agent.pipeline.trace_judge import judge_traces
    >>> steps = [{"kind": "step", "run_id": "r1", "step": s, "time": 10.0 * s, "loss": 2.0}
    ...          for s in range(1, 9)]
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     trace, out = Path(tmp, "hung.jsonl"), Path(tmp, "report.html")
    ...     _ = trace.write_text("".join(json.dumps(step) + "\\n" for step in steps))
    ...     [run] = judge_traces([trace], Settings())
    ...     print(write_report(trace, run, out, Settings()))
    ...     html = out.read_text()
    r1
    >>> '"type":"stalled"' in html, "<script src=" in html, 'rel="stylesheet"' in html
    (True, False, False)
"""

from __future__ import annotations

import html
import logging
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from monitor_agent.api.charts import series_answer
from monitor_agent.history import series as sr
from monitor_agent.history.blocks import SCALARS
from monitor_agent.history.builder import HistoryBuilder
from monitor_agent.history.schema import History, open_history
from monitor_agent.pipeline.trace_judge import JudgedTrace
from monitor_agent.records import wire
from monitor_agent.settings import Settings

log = logging.getLogger(__name__)
STATIC = resources.files("monitor_agent.ui") / "static"
REPORT_POINTS = 4000        # the report cannot re-query: embed enough for a close zoom
MATRIX_POINTS = 1500
QUANTILE_LAYERS = 40        # the layers whose gradient quantiles are embedded, at most


def write_report(trace: Path, run: JudgedTrace, out: Path, settings: Settings) -> str:
    """Write the report of ``trace`` (already judged into ``run``); returns its run id."""
    db = open_history(":memory:")
    builder = HistoryBuilder(db, settings.detectors.ema_alpha,
                             settings.detectors.default_warmup_steps, settings.max_layers_exposed)
    status: dict[str, str] = {}
    for index, obj in enumerate(wire.iter_trace(trace)):
        if index in run.rejected_at:
            continue  # the trace judge rejected (and counted) it: the charts show what it judged
        try:
            builder.add(obj)
        except Exception as exc:  # a value the fold cannot take costs itself, not the page
            log.warning("%s: record %d left out of the report's charts: %s", trace, index, exc)
            continue
        if obj.get("kind") == "end":
            status[obj["run_id"]] = str(obj.get("status", "completed"))
    builder.commit()
    run_id = _main_run(db) or next(iter(sorted(run.run_ids)), "run")
    answers = _answers(db, run_id, run, status.get(run_id, "ended without an end record"),
                       settings)
    quantile_layers = answers.pop("_quantile_layers")
    data = {"run_id": run_id, "trace": trace.name, "answers": answers,
            "quantile_layers": quantile_layers}
    out.write_text(_html(data), encoding="utf-8")
    return run_id


def _main_run(db: History) -> str | None:
    row = db.execute("SELECT run_id FROM steps GROUP BY run_id ORDER BY COUNT(*) DESC "
                     "LIMIT 1").fetchone()
    return row[0] if row else None


def _answers(db: History, run_id: str, run: JudgedTrace, status: str,
             settings: Settings) -> dict[str, Any]:
    base = "/v1/runs/" + quote(run_id, safe="")
    findings = [f.to_dict() for f in run.findings if f.run_id == run_id]
    series = series_answer(db, run_id, 0, None, None, REPORT_POINTS, settings.detectors)
    answers: dict[str, Any] = {
        base: _detail(db, run_id, findings, status),
        base + "/findings": {"run_id": run_id, "findings": findings[::-1]},
    }
    if series is not None:
        answers[base + "/series"] = wire.loads(series.model_dump_json())
    for stat in ("grad_norm", "update_ratio", "act_max_abs", "act_zero_frac"):
        answers[f"{base}/matrix/{stat}"] = sr.matrix(db, run_id, stat, points=MATRIX_POINTS)
    named = [f["layer"] for f in findings if f["type"] == "grad_distribution" and f["layer"]]
    layers = list(dict.fromkeys(named[::-1] + sr.run_meta(db, run_id)["layers"]))
    kept = []
    for layer in layers[:QUANTILE_LAYERS]:
        m = sr.matrix(db, run_id, "grad_quantiles", points=MATRIX_POINTS, layer=layer)
        if m["steps"]:
            answers[f"{base}/matrix/grad_quantiles?layer={layer}"] = m
            kept.append(layer)
    if kept:
        answers[f"{base}/matrix/grad_quantiles"] = answers[
            f"{base}/matrix/grad_quantiles?layer={kept[0]}"]
    answers["_quantile_layers"] = kept
    return answers


def _detail(db: History, run_id: str, findings: list[dict[str, Any]],
            status: str) -> dict[str, Any]:
    """What the run page's header shows, in /v1/runs/{id}'s shape: the last stored step."""
    row = db.execute(f"SELECT step, {', '.join(SCALARS)} FROM steps WHERE run_id=? AND rank=0 "
                     "ORDER BY step DESC LIMIT 1", (run_id,)).fetchone()
    ev = db.execute("SELECT val_loss FROM evals WHERE run_id=? AND rank=0 ORDER BY step DESC "
                    "LIMIT 1", (run_id,)).fetchone()
    latest = dict(zip(SCALARS, row[1:], strict=True)) if row else {}
    rank = {"last_step": row[0] if row else None, "latest": latest,
            "loss_ema": latest.get("loss_ema"), "val_loss": ev[0] if ev else None}
    return {"run_id": run_id, "status": status, "active": False,
            "last_step": row[0] if row else None, "ranks": {"0": rank}, "alerts": [],
            "findings": {"by_type": dict(Counter(f["type"] for f in findings))}}


def _html(data: dict[str, Any]) -> str:
    page = (STATIC / "run.html").read_text()
    css = "".join((STATIC / p).read_text() for p in ("vendor/uPlot.min.css", "ui.css"))
    scripts = [(STATIC / p).read_text() for p in
               ("vendor/uPlot.iife.min.js", "common.js", "heatmap.js", "plotview.js", "charts.js",
                "run.js")]
    embedded = script_json(data)
    safe = [s.replace("</script", "<\\/script") for s in scripts]
    inline = f"<script>window.MONITOR_REPORT = {embedded};</script>\n" + "\n".join(
        f"<script>{s}</script>" for s in safe)
    page = _swap(page, "STYLE", f"<style>{css}</style>")
    page = _swap(page, "SCRIPT", inline)
    return page.replace("<title>monitor-agent · run</title>",
                        f"<title>backtest report · {html.escape(data['trace'])}</title>")


_SCRIPT_UNSAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                                "\u2028": "\\u2028", "\u2029": "\\u2029"})


def script_json(data: Any) -> str:
    """JSON that is inert inside an HTML ``<script>``, whatever strings it holds.

    The HTML parser ends a script at ``</script`` and changes state at ``<!--`` (a layer
    named ``<!--<script>`` blanked the whole report), so every ``<``, ``>`` and ``&`` is
    written as a JSON escape: they can only occur inside JSON strings, where the escape
    means the same character. U+2028/2029 too, for older JavaScript parsers::

        >>> script_json({"layer": "<!--<script>", "note": "</script>\\u2028"})
        '{"layer":"\\\\u003c!--\\\\u003cscript\\\\u003e","note":"\\\\u003c/script\\\\u003e\\\\u2028"}'
    """
    return wire.dumps(data).decode().translate(_SCRIPT_UNSAFE)


def _swap(page: str, mark: str, content: str) -> str:
    start, end = page.index(f"<!--{mark}-->"), page.index(f"<!--/{mark}-->") + len(mark) + 8
    return page[:start] + content + page[end:]
