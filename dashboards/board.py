"""The dashboard envelope: variables, annotations, links, and panel ids.

Example::

    project = query_variable("project", "label_values(training_run_info, project)", all_=True)
    board = dashboard("monitor-agent-fleet", "Fleet", panels, [project], annotations=[])
"""

from __future__ import annotations

from dashboards.panels import DATASOURCE, SCHEMA_VERSION, Json

TAGS = ["monitor-agent", "training"]


def query_variable(name: str, query: str, *, label: str = "", multi: bool = False,
                   all_: bool = False, regex: str = "") -> Json:
    """A variable filled from Prometheus (``label_values(...)``), refreshed with the time range.

    ``all_`` adds "All" as ``.*``, which also matches series without the label (an empty
    project), so selectors use ``=~`` for such variables.
    """
    var: Json = {
        "type": "query",
        "name": name,
        "label": label or name,
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-variable"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": all_,
        "regex": regex,
        "current": {},
        "options": [],
        "hide": 0,
    }
    if all_:
        var["allValue"] = ".*"
        var["current"] = {"text": "All", "value": "$__all"}
    return var


def annotation(name: str, expr: str, *, title: str, text: str, color: str) -> Json:
    """Marks on every time series panel where ``expr`` has a sample."""
    return {
        "name": name,
        "datasource": DATASOURCE,
        "enable": True,
        "hide": False,
        "iconColor": color,
        "expr": expr,
        "step": "1m",
        "titleFormat": title,
        "textFormat": text,
        "tagKeys": "severity",
        "useValueForTime": False,
    }


def dashboard(uid: str, title: str, panels: list[Json], variables: list[Json], *,
              annotations: list[Json], description: str = "") -> Json:
    """The whole dashboard; panel ids are numbered in layout order so they stay stable."""
    for i, panel in enumerate(panels, start=1):
        panel["id"] = i
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": TAGS,
        "editable": False,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "links": [{"type": "dashboards", "tags": ["monitor-agent"], "asDropdown": False,
                   "includeVars": True, "keepTime": True, "title": "monitor-agent"}],
        "annotations": {"list": [_builtin_annotation(), *annotations]},
        "templating": {"list": variables},
        "panels": panels,
    }


def _builtin_annotation() -> Json:
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
