"""Every metric name that dashboards and rules use is one the sidecar defines
(monitor_agent/metrics/names.py), one a rule records, or one Prometheus makes itself."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import DASHBOARDS, DEPLOY, RULE_FILES

from dashboards.queries import iter_queries, substitute
from monitor_agent.metrics import names

BUILTINS = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds", "scrape_samples_scraped"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan"}
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
BRACES = re.compile(r"\{[^}]*\}")
RANGES = re.compile(r"\[[^\]]*\]")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
# Numbers and durations first, so 1e-15 or 5m never leave an "e" or "m" behind.
TOKEN = re.compile(r"(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?[smhdwy]*)|(?P<id>[A-Za-z_:][A-Za-z0-9_:]*)")


def metric_names_in(expr: str) -> set[str]:
    """Metric names of a PromQL expression: identifiers that are not functions, keywords,
    label names (in braces or grouping clauses), durations or numbers."""
    text = STRINGS.sub('""', expr)
    text = BRACES.sub(" ", text)
    text = RANGES.sub(" ", text)
    text = GROUPING.sub(" ", text)
    found = set()
    for match in TOKEN.finditer(text):
        word = match["id"]
        if word is None or word.lower() in KEYWORDS or text[match.end():].lstrip().startswith("("):
            continue
        found.add(word)
    return found


def known() -> set[str]:
    defined = set()
    for metric in names.RUN_METRICS:
        if metric.type == "counter":
            defined.add(metric.name + "_total")
        elif metric.type == "histogram":
            defined |= {metric.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            defined.add(metric.name)
    for value in vars(names).values():
        if isinstance(value, str) and value.startswith(names.SELF_PREFIX) and value != names.SELF_PREFIX:
            defined |= {value, value + "_total"}
            defined |= {value + s for s in ("_bucket", "_sum", "_count")}
    return defined | BUILTINS


def rule_exprs() -> list[tuple[str, str]]:
    docs = [yaml.safe_load(p.read_text()) for p in RULE_FILES]
    return [(r.get("alert") or r["record"], r["expr"]) for d in docs for g in d["groups"]
            for r in g["rules"]]


def recorded() -> set[str]:
    return {name for name, _ in rule_exprs() if ":" in name}


def dashboard_exprs() -> list[tuple[str, str]]:
    values = {"project": "p", "run": "r", "rank": "0", "layer": "l"}
    builtins = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}
    return [(f"{p.name} {q.where}", substitute(q.expr, values, builtins))
            for p in DASHBOARDS for q in iter_queries(json.loads(p.read_text()))]


def test_the_parser_finds_names_and_skips_the_rest() -> None:
    expr = ('sum by (project, le) (rate(training_step_duration_seconds_bucket{rank=~"0|1",'
            ' x="a{b}"}[5m])) / on (run_id) group_left(pod) training_run_info > bool 0.5e3 '
            'and project_run:training_tokens_per_second:sum offset 5m')
    assert metric_names_in(expr) == {"training_step_duration_seconds_bucket", "training_run_info",
                                     "project_run:training_tokens_per_second:sum"}


@pytest.mark.parametrize("where,expr", rule_exprs() + dashboard_exprs())
def test_every_name_is_defined(where: str, expr: str) -> None:
    unknown = metric_names_in(expr) - known() - recorded()
    assert not unknown, f"{where}: {sorted(unknown)} not in monitor_agent/metrics/names.py"


def test_kubernetes_rules_use_the_same_names() -> None:
    rule = yaml.safe_load((DEPLOY / "kubernetes" / "prometheusrule.yaml").read_text())
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert not metric_names_in(r["expr"]) - known() - recorded()
