"""The reference pages of docs/reference/, generated from the code they describe.

``api.md`` (the app's OpenAPI), ``metrics.md`` (every family ``/metrics`` exposes),
``configuration.md`` (every settings key) and ``detectors.md`` (the detector catalogue and
each detector's knobs) are written from the objects the sidecar runs on, so a page cannot
drift from the code: ``python -m monitor_agent.tools.reference_docs`` writes them and
``--check`` exits 1 naming each page that differs from what the code produces now
(tests/tools/test_reference_docs.py runs it). Pages are deterministic: sorted, with no
timestamp, version or temporary path in them.

A settings key as configuration.md lists it, with its environment variable::

    >>> row = next(r for r in configuration_rows() if r.key == "alerting.outbox.max_pending")
    >>> row.env, row.default
    ('MONITOR_AGENT_ALERTING__OUTBOX__MAX_PENDING', '10000')
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeGuard, get_args, get_origin

from prometheus_client import CollectorRegistry
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from monitor_agent.detectors.catalogue import DETECTOR_CLASSES
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.metrics import names as metric_names
from monitor_agent.metrics.alerting import AlertingMetrics
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.notify.channels import ALL_CHANNELS
from monitor_agent.reads import exposition
from monitor_agent.serving.app import create_app
from monitor_agent.settings import Settings, load_settings

REFRESH = "python -m monitor_agent.tools.reference_docs"
NO_DESCRIPTION = "(no description in the code)"
REFERENCE_DIR = Path(__file__).resolve().parents[2] / "docs" / "reference"
MiB = 1024 * 1024


def _header(title: str, source: str) -> list[str]:
    return [f"# {title}", "",
            f"Generated from {source} by `{REFRESH}`; do not edit by hand "
            "(tests/tools/test_reference_docs.py fails when this page is stale).", ""]


def _cell(text: str) -> str:
    """One Markdown table cell: no line breaks, and a literal ``|`` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def _markdown(rst: str) -> str:
    """A docstring's ``literal`` as Markdown's `literal`."""
    return rst.replace("``", "`")


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


# --- api.md -----------------------------------------------------------------------------


def openapi() -> dict[str, Any]:
    """The sidecar's OpenAPI document, from the app built with default settings (nothing
    is opened: the databases open only when the app starts serving)."""
    with tempfile.TemporaryDirectory() as tmp:
        return create_app(load_settings(data_dir=Path(tmp))).openapi()


def _schema(schema: dict[str, Any]) -> str:
    """A schema as a reader names it: a model's name, ``list of X``, or its JSON type."""
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return " or ".join(_schema(s) for s in schema[union])
    if schema.get("type") == "array":
        return "list of " + _schema(schema.get("items", {}))
    if schema.get("type") == "object" and "properties" in schema:
        return "object with " + ", ".join(
            f"`{name}`: {_schema(sub)}" for name, sub in sorted(schema["properties"].items()))
    if "enum" in schema:
        return "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    return str(schema.get("type", "any"))


def api_page() -> str:
    doc = openapi()
    lines = _header("HTTP API", "the FastAPI app's OpenAPI document "
                    "(`create_app` in monitor_agent/serving/app.py)")
    lines += ["Every route, sorted by path; the running sidecar serves the same document at "
              "`/openapi.json` and an interactive page at `/docs`. Models are described in "
              "`components.schemas` of that document.", ""]
    for path in sorted(doc["paths"]):
        for method in sorted(doc["paths"][path]):
            lines += _operation(method, path, doc["paths"][path][method])
    return "\n".join(lines).rstrip() + "\n"


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    lines = [f"## `{method.upper()} {path}`", "", op.get("summary") or NO_DESCRIPTION, ""]
    if op.get("description"):
        lines += [" ".join(op["description"].split()), ""]
    params = sorted(op.get("parameters", []), key=lambda p: (p["in"], p["name"]))
    if params:
        lines += _table(("parameter", "in", "type", "required", "default", "description"), [
            (f"`{p['name']}`", p["in"], _schema(p.get("schema", {})),
             "yes" if p.get("required") else "no",
             f"`{p['schema']['default']}`" if "default" in p.get("schema", {}) else "",
             p.get("description") or p.get("schema", {}).get("description") or NO_DESCRIPTION)
            for p in params])
    body = op.get("requestBody")
    if body:
        lines += _table(("request body", "schema"), [
            (f"`{media}`", _schema(content.get("schema", {})))
            for media, content in sorted(body.get("content", {}).items())])
    responses = op.get("responses", {})
    lines += _table(("status", "description", "model"), [
        (code, answer.get("description") or NO_DESCRIPTION,
         ", ".join(_schema(c.get("schema", {})) for _, c in sorted(answer.get("content", {}).items())
                   if c.get("schema")))
        for code, answer in sorted(responses.items())])
    return lines


# --- metrics.md -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricRow:
    name: str  # as exposed: a counter's name ends in _total
    type: str
    labels: tuple[str, ...]
    help: str


def run_metric_rows() -> list[MetricRow]:
    """Every run family /metrics exposes (``exposition.FAMILIES``), with the labels of its
    own that ``metrics/names.py`` declares."""
    declared = {m.name: m for m in metric_names.RUN_METRICS}
    rows = []
    for fam in exposition.FAMILIES:
        base = fam.name.removesuffix("_total") if fam.type == "counter" else fam.name
        rows.append(MetricRow(fam.name, fam.type, declared[base].extra_labels, fam.help))
    return sorted(rows, key=lambda r: r.name)


def self_metric_rows() -> list[MetricRow]:
    """Every self-metric family, from a registry built as the app builds its own: the
    sidecar's (``SelfMetrics``) and alerting's (``AlertingMetrics``, every channel). Their
    label names are read off the series each creates up front."""
    registry = CollectorRegistry()
    SelfMetrics(registry, "")
    AlertingMetrics(registry, ALL_CHANNELS)
    rows = []
    for family in registry.collect():
        labels = dict.fromkeys(k for s in family.samples for k in s.labels if k != "le")
        name = family.name + "_total" if family.type == "counter" else family.name
        rows.append(MetricRow(name, family.type, tuple(labels), family.documentation))
    return sorted(rows, key=lambda r: r.name)


def metrics_page() -> str:
    run_labels = ", ".join(f"`{label}`" for label in metric_names.RUN_LABELS)
    lines = _header("Prometheus metrics", "monitor_agent/metrics/names.py, the exposition's "
                    "families (monitor_agent/reads/exposition.py) and the self-metrics "
                    "registries (monitor_agent/metrics/sidecar.py, alerting.py, delivery.py)")
    lines += [_markdown(_first_paragraph(metric_names.__doc__.split("\n\n", 1)[1])), "",
              "## Run metrics", "",
              f"Besides the labels listed, each family carries the run's labels ({run_labels}: "
              "`RUN_LABELS` in names.py; a family about the run as a whole, not one rank, "
              "has no `rank`).", ""]
    lines += _metric_table(run_metric_rows())
    lines += ["## Self-metrics", "", "The sidecar's own health: ingest, storage, detection, "
              "rendering, delivery and the link to run leaders.", ""]
    lines += _metric_table(self_metric_rows())
    return "\n".join(lines).rstrip() + "\n"


def _metric_table(rows: list[MetricRow]) -> list[str]:
    return _table(("metric", "type", "labels", "help"), [
        (f"`{r.name}`", r.type, ", ".join(f"`{label}`" for label in r.labels),
         r.help or NO_DESCRIPTION) for r in rows])


# --- configuration.md -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SettingRow:
    key: str  # dotted, as in YAML
    env: str
    type: str
    default: str
    description: str


def _sections(model: type[BaseModel], prefix: tuple[str, ...] = ()
              ) -> Iterator[tuple[tuple[str, ...], type[BaseModel]]]:
    yield prefix, model
    for name, field in sorted(model.model_fields.items()):
        if _is_model(field.annotation):
            yield from _sections(field.annotation, (*prefix, name))


def _is_model(annotation: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def configuration_rows() -> list[SettingRow]:
    """Every leaf key of ``Settings`` and its nested sections, sorted within each section."""
    rows = []
    for prefix, model in _sections(Settings):
        for name, field in sorted(model.model_fields.items()):
            if _is_model(field.annotation):
                continue
            path = (*prefix, name)
            rows.append(SettingRow(
                ".".join(path), "MONITOR_AGENT_" + "__".join(path).upper(),
                _type(field), _default(name, field), field.description or NO_DESCRIPTION))
    return rows


def _type(field: FieldInfo) -> str:
    text = _annotation(field.annotation)
    bounds = [f"{sign} {getattr(m, attr)}" for m in field.metadata
              for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
              if getattr(m, attr, None) is not None]
    return f"{text}, {', '.join(bounds)}" if bounds else text


def _annotation(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if annotation is SecretStr:
        return "secret string"
    if annotation is Path:
        return "path"
    if isinstance(annotation, type):
        return annotation.__name__
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if get_origin(annotation) in (list, set, tuple):
        return f"list of {_annotation(args[0])}" if args else "list"
    if args:
        return " or ".join(_annotation(a) for a in args)
    return str(annotation)


def _default(name: str, field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, set | list | tuple):
        return "[" + ", ".join(str(v) for v in sorted(value)) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    if name.endswith("_bytes") and isinstance(value, int) and value % MiB == 0:
        return f"{value} ({value // MiB} MiB)"
    return str(value)


def configuration_page() -> str:
    doc = sys.modules[Settings.__module__].__doc__ or ""
    lines = _header("Sidecar configuration", "the settings schema (`Settings` in "
                    "monitor_agent/settings.py and its nested sections)")
    for part in doc.split("\n\n")[:2]:
        lines += [_markdown(" ".join(part.split())), ""]
    lines += ["Each key below is written in YAML as its dotted path (`alerting.slack."
              "webhook_url` is `webhook_url` under `slack:` under `alerting:`) or set by its "
              "environment variable. The detectors' knobs are also listed detector by "
              "detector in [detectors.md](detectors.md).", ""]
    by_section: dict[str, list[SettingRow]] = {}
    for row in configuration_rows():
        by_section.setdefault(row.key.rpartition(".")[0], []).append(row)
    for section, rows in by_section.items():
        lines += [f"## `{section}`" if section else "## Top level", ""]
        lines += _table(("key", "environment variable", "type", "default", "description"), [
            (f"`{r.key}`", f"`{r.env}`", r.type, f"`{r.default}`", r.description)
            for r in rows])
    return "\n".join(lines).rstrip() + "\n"


# --- detectors.md -----------------------------------------------------------------------


UNITS = {"_seconds": "seconds", "_steps": "steps"}


def _unit(name: str) -> str:
    return next((unit for suffix, unit in UNITS.items() if name.endswith(suffix)), "")


def _knob_rows(fields: dict[str, FieldInfo]) -> list[tuple[str, ...]]:
    return [(f"`{name}`", f"`{_default(name, field)}`", _unit(name),
             _type(field).partition(", ")[2], field.description or NO_DESCRIPTION)
            for name, field in fields.items()]


def detectors_page() -> str:
    lines = _header("Detectors", "the detector catalogue (`DETECTOR_CLASSES` in "
                    "monitor_agent/detectors/catalogue.py) and each detector's settings model")
    lines += ["Every finding type, sorted by name: its usual severity, where it is judged "
              "(`rank`: on the sidecar a rank reports to; `run`: ranks against each other, on "
              "a multi-node run's leader), what it detects (its module's docstring) and its "
              "knobs. Knobs are set flat under `detectors:` in the sidecar's configuration "
              "([configuration.md](configuration.md)); the unit is the one the knob's name "
              "states (`_seconds`, `_steps`), else what its description says.", "",
              "## Knobs every detector shares", ""]
    knob_head = ("knob", "default", "unit", "limits", "description")
    lines += _table(knob_head, _knob_rows(dict(SharedSettings.model_fields)))
    shared = set(SharedSettings.model_fields)
    for cls in sorted(DETECTOR_CLASSES, key=lambda c: c.type):
        module = sys.modules[cls.__module__]
        what = _first_paragraph(module.__doc__).removeprefix(f"``{cls.type}``: ")
        lines += [f"## `{cls.type}`", "",
                  f"Severity: {cls.severity.label}. Judged per: {cls.scope}. "
                  f"Source: `{cls.__module__.replace('.', '/')}.py`.", "",
                  _markdown(what[:1].upper() + what[1:]) or NO_DESCRIPTION, ""]
        own = {k: f for k, f in cls.settings_model.model_fields.items() if k not in shared}
        lines += _table(knob_head, _knob_rows(own)) if own else ["No knobs of its own.", ""]
    return "\n".join(lines).rstrip() + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "api.md": api_page,
    "configuration.md": configuration_page,
    "detectors.md": detectors_page,
    "metrics.md": metrics_page,
}
"""Every generated page, by file name under docs/reference/."""


def stale(directory: Path) -> list[str]:
    """The pages under ``directory`` that differ from what the code produces now."""
    return [name for name, page in PAGES.items()
            if not (directory / name).is_file()
            or (directory / name).read_text(encoding="utf-8") != page()]


def write(directory: Path) -> list[str]:
    """Write every page under ``directory``; returns the names of those that changed."""
    directory.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, page in PAGES.items():
        text, target = page(), directory / name
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            changed.append(name)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REFRESH, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each page that is stale")
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR,
                        help="the directory of the pages (default: docs/reference/)")
    args = parser.parse_args(argv)
    if args.check:
        found = stale(args.out)
        for name in found:
            print(f"{args.out / name} is stale; run `{REFRESH}`", file=sys.stderr)
        return 1 if found else 0
    for name in write(args.out):
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
