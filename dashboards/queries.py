"""Every PromQL expression a dashboard JSON holds, and Grafana's variable substitution.

Used by the tests that check each expression against a live Prometheus, and handy by hand:

    python -m dashboards.queries dashboards/fleet.json

Example::

    for q in iter_queries(json.loads(Path("dashboards/fleet.json").read_text())):
        expr = substitute(q.expr, {"project": ".*"}, {"__rate_interval": "1m"})
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<expr>.*),\s*)?(?P<label>\w+)\s*\)\s*$", re.S)
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


@dataclass(frozen=True, slots=True)
class Query:
    """One expression and where it sits: ``panel "Loss" target B``, ``variable run``, ..."""

    where: str
    expr: str
    kind: str  # panel | variable | annotation
    label: str = ""  # for label_values(expr, label) variables: the label asked for


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Panels in order, including those nested in collapsed rows."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))


def iter_queries(board: dict[str, Any]) -> Iterator[Query]:
    for panel in iter_panels(board.get("panels", [])):
        for t in panel.get("targets", []):
            if t.get("expr"):
                yield Query(f'panel "{panel["title"]}" target {t["refId"]}', t["expr"], "panel")
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            yield variable_query(var)
    for ann in board.get("annotations", {}).get("list", []):
        if ann.get("expr"):
            yield Query(f'annotation "{ann["name"]}"', ann["expr"], "annotation")


def variable_query(var: dict[str, Any]) -> Query:
    """``label_values(expr, label)`` becomes ``expr`` (series that carry ``label``)."""
    query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    match = LABEL_VALUES.match(query)
    if match is None:
        return Query(f"variable {var['name']}", query, "variable")
    expr = match["expr"] or "{__name__=~'.+'}"
    return Query(f"variable {var['name']}", expr, "variable", match["label"])


def variables_in(expr: str) -> set[str]:
    return {m[1] or m[2] for m in VARIABLE.finditer(expr)}


def substitute(expr: str, values: dict[str, str], builtins: dict[str, str]) -> str:
    """Replaces ``$name`` / ``${name}`` as Grafana would; unknown names raise KeyError."""
    merged = {**builtins, **values}
    return VARIABLE.sub(lambda m: merged[m[1] or m[2]], expr)


def main(argv: list[str]) -> int:
    for path in argv:
        for q in iter_queries(json.loads(Path(path).read_text())):
            print(f"{path}: {q.where}\n    {q.expr}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
