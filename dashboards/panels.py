"""Builders for the Grafana dashboard JSON model, as plain dicts.

Only what our three dashboards use, with Grafana's defaults left out. Every panel queries
the provisioned Prometheus data source by uid (deploy/grafana/provisioning/datasources).

Example::

    grid = Grid()
    loss = timeseries("Loss", [target('training_loss{run_id="$run"}', "rank {{rank}}")],
                      unit="none", pos=grid.place(12, 8))
    board = dashboard("my-uid", "Title", [loss], variables=[], annotations=[])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "monitor-agent-prometheus"}
SCHEMA_VERSION = 39  # Grafana 11; newer versions migrate it on load
Json = dict[str, Any]


@dataclass
class Grid:
    """Places panels left to right on Grafana's 24-column grid, wrapping to a new line.

    Example::

        grid = Grid()
        grid.row("Loss")          # a full-width row header
        pos = grid.place(12, 8)   # {"x": 0, "y": 1, "w": 12, "h": 8}
    """

    x: int = 0
    y: int = 0
    line_height: int = 0

    def place(self, w: int, h: int) -> Json:
        if self.x + w > 24:
            self.newline()
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.line_height = max(self.line_height, h)
        return pos

    def newline(self) -> None:
        self.y += self.line_height
        self.x, self.line_height = 0, 0

    def row(self, title: str) -> Json:
        if self.x:
            self.newline()
        panel = {"type": "row", "title": title, "collapsed": False, "panels": [],
                 "gridPos": self.place(24, 1)}
        self.newline()
        return panel


def target(expr: str, legend: str = "", *, instant: bool = False, fmt: str = "time_series") -> Json:
    """One PromQL query of a panel; refIds are assigned by the panel builders."""
    return {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
        "format": fmt,
    }


def _panel(kind: str, title: str, targets: list[Json], pos: Json, unit: str,
           description: str, **defaults: Any) -> Json:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": pos,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit, **defaults}, "overrides": []},
        "options": {},
    }


def timeseries(title: str, targets: list[Json], *, unit: str, pos: Json, description: str = "",
               log: int = 0, band: list[tuple[str, float | None]] | None = None,
               overrides: list[Json] | None = None, min_: float | None = None,
               max_: float | None = None) -> Json:
    """A time series panel; ``band`` colours the background by threshold (healthy ranges)."""
    custom: Json = {"lineWidth": 1, "fillOpacity": 0, "spanNulls": False, "showPoints": "never"}
    if log:
        custom["scaleDistribution"] = {"type": "log", "log": log}
    defaults: Json = {"custom": custom}
    if band:
        defaults["thresholds"] = thresholds(band)
        custom["thresholdsStyle"] = {"mode": "area"}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    panel = _panel("timeseries", title, targets, pos, unit, description, **defaults)
    panel["fieldConfig"]["overrides"] = overrides or []
    panel["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    return panel


def stat(title: str, targets: list[Json], *, unit: str, pos: Json, description: str = "",
         text_mode: str = "auto", steps: list[tuple[str, float | None]] | None = None,
         no_value: str | None = None, mappings: list[Json] | None = None) -> Json:
    """A single-value panel coloured by ``steps`` (green unless told otherwise)."""
    defaults: Json = {"thresholds": thresholds(steps or [("green", None)]),
                      "mappings": mappings or []}
    if no_value is not None:
        defaults["noValue"] = no_value
    panel = _panel("stat", title, targets, pos, unit, description, **defaults)
    panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "textMode": text_mode, "colorMode": "value", "graphMode": "none"}
    return panel


def table(title: str, targets: list[Json], *, pos: Json, description: str = "",
          unit: str = "string", columns: dict[str, str] | None = None,
          hide: tuple[str, ...] = ("Time", "__name__", "job", "instance"),
          overrides: list[Json] | None = None) -> Json:
    """Instant queries shown as rows; ``columns`` renames (and orders) the columns kept."""
    for t in targets:
        t.update(instant=True, range=False, format="table")
    panel = _panel("table", title, targets, pos, unit, description)
    panel["fieldConfig"]["overrides"] = overrides or []
    organize: Json = {"excludeByName": dict.fromkeys(hide, True)}
    if columns:
        organize["renameByName"] = columns
        organize["indexByName"] = {name: i for i, name in enumerate(columns)}
    transforms = [{"id": "merge", "options": {}}] if len(targets) > 1 else []
    panel["transformations"] = [*transforms, {"id": "organize", "options": organize}]
    panel["options"] = {"showHeader": True, "cellHeight": "sm"}
    return panel


def heatmap(title: str, targets: list[Json], *, unit: str, pos: Json, description: str = "",
            scheme: str = "Spectral", y_unit: str = "short") -> Json:
    """Series already bucketed (histogram ``le`` or one row per layer), coloured by value."""
    panel = _panel("heatmap", title, targets, pos, unit, description)
    panel["options"] = {
        "calculate": False,
        "cellGap": 0,
        "color": {"mode": "scheme", "scheme": scheme, "steps": 64, "reverse": False},
        "yAxis": {"axisPlacement": "left", "unit": y_unit},
        "rowsFrame": {"layout": "auto"},
        "tooltip": {"mode": "single", "yHistogram": False},
        "legend": {"show": True},
        "showValue": "never",
    }
    return panel


def thresholds(steps: list[tuple[str, float | None]]) -> Json:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


def override(name: str, **props: Any) -> Json:
    """Field properties for the series or column called ``name`` (legend or "Value #B")."""
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": k.replace("__", "."), "value": v} for k, v in props.items()]}


def limit_line(name: str) -> Json:
    """Draws the series ``name`` as a red dashed line: a limit the others are read against."""
    return override(name, color={"mode": "fixed", "fixedColor": "red"},
                    custom__lineStyle={"fill": "dash", "dash": [10, 10]})


def regex_override(pattern: str, **props: Any) -> Json:
    return {"matcher": {"id": "byRegexp", "options": pattern},
            "properties": [{"id": k.replace("__", "."), "value": v} for k, v in props.items()]}
