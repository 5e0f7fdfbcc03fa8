"""Precision and recall per detector over a labelled trace set (``detection.py`` prints it).

Per finding type, over the traces of one set:

* false pages per 10,000 healthy steps: page-severity findings (error/critical) on healthy
  runs, each finding once (detectors already repeat a persisting condition at most every
  ``repeat_every_steps``);
* false warnings per 10,000 healthy steps: warning findings on healthy runs whose type the
  label does not list in ``allowed`` (``allowed`` types carry a measured signal, see the
  labels' notes; they are counted apart as ``allowed``). Info findings are not alarms;
* healthy runs paged: healthy runs with at least one page;
* recall: expected findings whose first finding of that type lies in the window with the
  label's severity (the rule of ``tests/detectors/test_public_traces.py``), the mean
  delay in steps from the window's first step to that finding, and on traces that go
  non-finite the mean lead: steps from that finding to the first non-finite step (findings
  at or before it: one after it, a crash, leads nothing);
* faulty runs: unexplained findings (type neither expected nor allowed) and pages whose
  type no expected finding pages for (a warning-class fault must not page).

Example::

    table = precision(load_set(Path("tests/traces/corpus"), half="heldout"))
    print_precision("corpus held-out", table)
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from monitor_agent.detectors import FINDING_TYPES, DetectorSettings, DetectorSuite
from monitor_agent.records import schemas, wire
from monitor_agent.records.types import EndRecord, Finding, Record, Severity, StepRecord


@dataclass
class TypeScore:
    false_pages: int = 0
    false_warnings: int = 0
    allowed_warnings: int = 0
    runs_paged: set[str] = field(default_factory=set)
    expected: int = 0
    caught: int = 0
    delays: list[int] = field(default_factory=list)
    leads: list[int] = field(default_factory=list)
    fault_false: int = 0


@dataclass
class SetScore:
    healthy_steps: int = 0
    healthy_runs: int = 0
    paged_runs: set[str] = field(default_factory=set)
    paged_by: dict[str, dict[str, int]] = field(default_factory=dict)  # run: {type: pages}
    fault_runs: int = 0
    fault_runs_caught: int = 0  # every expected finding inside its window, right severity
    unexplained: list[str] = field(default_factory=list)  # one line per false alarm / miss
    per_type: dict[str, TypeScore] = field(default_factory=lambda: defaultdict(TypeScore))


def findings_of(path: Path, settings: DetectorSettings | None = None) -> tuple[list[Finding], int]:
    """The suite's findings on one trace (``replayed``) and its rank-0 step count."""
    records = [schemas.parse_record(obj) for obj in wire.iter_trace(path)]
    steps = sum(isinstance(rec, StepRecord) and rec.rank == 0 for rec in records)
    return replayed(records, settings), steps


def replayed(records: Iterable[Record], settings: DetectorSettings | None = None) -> list[Finding]:
    """The suite's findings on ``records`` driven as replay drives it: ticks at record time,
    a last tick a stall horizon after records with no end record."""
    settings = settings or DetectorSettings()
    suite, out, last, ended = DetectorSuite(settings), [], None, False
    for rec in records:
        if rec.time is not None:
            last = rec.time
            out += suite.tick(rec.time)
        out += suite.update(rec)
        ended |= isinstance(rec, EndRecord)
    if last is not None and not ended:
        out += suite.tick(last + settings.stall_horizon_seconds)
    return out


def load_set(directory: Path, half: str | None = None) -> list[tuple[dict, Path]]:
    labels = json.loads((directory / "labels.json").read_text())
    return [(lab, directory / lab["file"]) for lab in labels
            if half is None or lab.get("half") == half]


def score_trace(label: dict, findings: list[Finding], steps: int, total: SetScore) -> None:
    first: dict[str, Finding] = {}
    for f in sorted(findings, key=lambda f: f.step):
        if f.severity > Severity.INFO:  # an info finding (a note) is no detection of its type
            first.setdefault(f.type, f)
    # the nan_inf window closes at the first non-finite loss (AMP: overflows open it earlier)
    nan = next((e["last_step"] for e in label["expected"] if e["type"] == "nan_inf"), None)
    missed_before = len(total.unexplained)
    for e in label["expected"]:
        ts = total.per_type[e["type"]]
        ts.expected += 1
        f = first.get(e["type"])
        if f and e["first_step"] <= f.step <= e["last_step"] and \
                f.severity == Severity.parse(e["severity"]):
            ts.caught += 1
            ts.delays.append(f.step - e["first_step"])
            if nan is not None and e["type"] != "nan_inf" and f.step <= nan:
                ts.leads.append(nan - f.step)  # after the NaN (a crash) it led nothing
        else:
            got = f"first at {f.step} ({f.severity.label})" if f else "never"
            total.unexplained.append(f"{label['file']}: missed {e['type']} {e['severity']} "
                                     f"{e['first_step']}..{e['last_step']}, {got}")
    name = label["file"]
    if label["expected"]:
        total.fault_runs += 1
        total.fault_runs_caught += len(total.unexplained) == missed_before
    if label["healthy"]:
        total.healthy_steps += steps
        total.healthy_runs += 1
        for f in findings:
            ts = total.per_type[f.type]
            if f.severity.pages:
                ts.false_pages += 1
                ts.runs_paged.add(name)
                total.paged_runs.add(name)
                by = total.paged_by.setdefault(name, {})
                by[f.type] = by.get(f.type, 0) + 1
                total.unexplained.append(f"{name}: PAGE {f.type} @{f.step}: {f.message}")
            elif f.severity == Severity.WARNING:
                if f.type in label["allowed"]:
                    ts.allowed_warnings += 1
                else:
                    ts.false_warnings += 1
                    total.unexplained.append(f"{name}: warning {f.type} @{f.step}: {f.message}")
        return
    paging = {e["type"] for e in label["expected"] if Severity.parse(e["severity"]).pages}
    exp = {e["type"] for e in label["expected"]}
    for f in findings:
        if f.severity <= Severity.INFO:
            continue
        if (f.type not in exp and f.type not in label["allowed"]) or (
                f.severity.pages and f.type not in paging and not paging):
            total.per_type[f.type].fault_false += 1
            total.unexplained.append(f"{name}: unexplained {f.severity.label} {f.type} "
                                     f"@{f.step}: {f.message}")


def precision(traces: list[tuple[dict, Path]]) -> SetScore:
    total = SetScore()
    for label, path in traces:
        findings, steps = findings_of(path)
        score_trace(label, findings, steps, total)
    return total


def print_precision(title: str, s: SetScore, details: bool = False) -> None:
    per10k = 1e4 / max(s.healthy_steps, 1)
    print(f"\n{title}: {s.healthy_runs} healthy runs, {s.healthy_steps} healthy steps; "
          f"healthy runs paged: {len(s.paged_runs)} {sorted(s.paged_runs) or ''}")
    print(f"{'type':22}{'pages/10k':>10}{'warn/10k':>10}{'allowed':>9}{'runs paged':>11}"
          f"{'recall':>9}{'delay':>7}{'lead':>6}{'fault fp':>9}")
    tot_p = tot_w = tot_exp = tot_caught = 0
    for t in FINDING_TYPES:
        ts = s.per_type.get(t)
        if ts is None:
            continue
        tot_p, tot_w = tot_p + ts.false_pages, tot_w + ts.false_warnings
        tot_exp, tot_caught = tot_exp + ts.expected, tot_caught + ts.caught
        recall = f"{ts.caught}/{ts.expected}" if ts.expected else "-"
        delay = f"{sum(ts.delays) / len(ts.delays):.1f}" if ts.delays else "-"
        lead = f"{sum(ts.leads) / len(ts.leads):.1f}" if ts.leads else "-"
        print(f"{t:22}{ts.false_pages * per10k:>10.2f}{ts.false_warnings * per10k:>10.2f}"
              f"{ts.allowed_warnings:>9}{len(ts.runs_paged):>11}{recall:>9}{delay:>7}"
              f"{lead:>6}{ts.fault_false:>9}")
    print(f"{'all':22}{tot_p * per10k:>10.2f}{tot_w * per10k:>10.2f}{'':>9}"
          f"{len(s.paged_runs):>11}{f'{tot_caught}/{tot_exp}':>9}")
    if s.fault_runs:
        print(f"faulty runs with every expected finding caught: {s.fault_runs_caught}/"
              f"{s.fault_runs}")
    for run, by in sorted(s.paged_by.items()):
        print(f"  paged: {run.split('.')[0]}: " + ", ".join(f"{t} x{n}" for t, n in
                                                           sorted(by.items())))
    for line in s.unexplained if details else ():
        print("  " + line[:200])


CLASSES = ("loss_spike", "divergence", "grad_explosion")


@dataclass
class ClassScore:
    expected: int = 0
    caught: int = 0
    false: list[str] = field(default_factory=list)  # raised where the label neither expects
    missed: list[str] = field(default_factory=list)  # nor allows it / expected, not in window
    delays: list[int] = field(default_factory=list)


def class_scores(traces: list[tuple[dict, Path]]) -> dict[str, ClassScore]:
    """Per class (spike, divergence, explosion) over fault runs: caught (first finding of
    the type inside its expected window), false (raised on a run whose label neither
    expects nor allows it) and the delay from the window's first step."""
    out = {c: ClassScore() for c in CLASSES}
    for label, path in traces:
        findings, _ = findings_of(path)
        first: dict[str, Finding] = {}
        for f in sorted(findings, key=lambda f: f.step):
            if f.severity > Severity.INFO:  # an info finding raises no alarm of its class
                first.setdefault(f.type, f)
        name = label["file"].split(".")[0]
        exp = {e["type"]: e for e in label["expected"]}
        for c in CLASSES:
            cs, f = out[c], first.get(c)
            if c in exp:
                cs.expected += 1
                if f is not None and exp[c]["first_step"] <= f.step <= exp[c]["last_step"]:
                    cs.caught += 1
                    cs.delays.append(f.step - exp[c]["first_step"])
                else:
                    cs.missed.append(f"{name} ({f.step if f else 'never'})")
            elif f is not None and c not in label["allowed"]:
                cs.false.append(f"{name} @{f.step}")
    return out


def print_class_scores(title: str, scores: dict[str, ClassScore], details: bool = False
                       ) -> None:
    print(f"\n{title}")
    print(f"{'class':16}{'precision':>10}{'recall':>9}{'false':>7}{'delay':>7}{'max delay':>10}")
    for c, cs in scores.items():
        raised = cs.caught + len(cs.false)
        prec = f"{cs.caught / raised:.0%}" if raised else "-"
        rec = f"{cs.caught}/{cs.expected}" if cs.expected else "-"
        delay = f"{sum(cs.delays) / len(cs.delays):.1f}" if cs.delays else "-"
        worst = str(max(cs.delays)) if cs.delays else "-"
        print(f"{c:16}{prec:>10}{rec:>9}{len(cs.false):>7}{delay:>7}{worst:>10}")
        if details:
            for line in cs.false:
                print(f"  false {c}: {line}")
            for line in cs.missed:
                print(f"  missed {c}: {line}")
