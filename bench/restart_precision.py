"""No healthy run is ever restarted: every trace of the corpora replayed through the
detectors, and each finding the packaged rules would restart (or leave a node out) for,
counted per corpus and per healthy / faulty run.

    python -m bench.restart_precision            # every corpus under tests/traces

A finding counts when a packaged rule with ``action: restart`` or ``exclude`` matches it
(default_rules.yaml: a hang past its limit or a rank gone, a hard GPU error): what a job
whose launcher restarts it would be restarted for, budgets and phases aside (the traces'
clients predate the launcher declaration, so a live sidecar would only page them). The
goal: 0 on every healthy run. The replay drives the detectors as ``monitor-agent replay``
does (ticks at record time, one last tick a stall horizon after a trace with no end record,
bench/precision.py ``replayed``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

from monitor_agent.alerting.rules import first_match, load_rules
from monitor_agent.detectors import DetectorSettings, DetectorSuite
from monitor_agent.records import schemas, wire
from monitor_agent.records.actions import RESTART_ACTIONS
from monitor_agent.records.types import EndRecord, Finding, Record

TRACES = Path(__file__).resolve().parents[1] / "tests" / "traces"
CORPORA = ("", "public", "corpus", "classes", "shapes")


def records(path: Path) -> list[Record]:
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt") as src:
        for line in src:
            if line.strip():
                try:
                    out.append(schemas.parse_record(wire.loads(line)))
                except (schemas.RecordError, ValueError):
                    continue
    return out


def findings(recs: list[Record], settings: DetectorSettings) -> list[Finding]:
    suite, out, last, ended = DetectorSuite(settings), [], None, False
    for rec in recs:
        if rec.time is not None:
            last = rec.time
            out += suite.tick(rec.time)
        out += suite.update(rec)
        ended |= isinstance(rec, EndRecord)
    if last is not None and not ended:
        out += suite.tick(last + settings.stall_horizon_seconds)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, default=TRACES)
    args = ap.parse_args(argv)
    rules = load_rules()
    settings = DetectorSettings()
    print("| corpus | healthy runs | restarts on them | faulty runs | restarts on them (by type) |")
    print("|---|---|---|---|---|")
    bad = 0
    for name in CORPORA:
        directory = args.traces / name
        labels_file = directory / "labels.json"
        if not labels_file.exists():
            continue
        healthy = faulty = healthy_hits = 0
        faulty_hits: Counter[str] = Counter()
        for label in json.loads(labels_file.read_text()):
            path = directory / label["file"]
            if not path.exists():
                continue
            recs = records(path)
            labels = {}
            hits = [f for f in findings(recs, settings)
                    if (rule := first_match(rules, f, labels)) is not None
                    and rule.action in RESTART_ACTIONS]
            if label.get("healthy"):
                healthy += 1
                healthy_hits += len(hits)
                for f in hits:
                    print(f"  healthy {label['file']}: {f.type} at step {f.step}: "
                          f"{f.message[:120]}", file=sys.stderr)
            else:
                faulty += 1
                faulty_hits.update(f.type for f in hits)
        bad += healthy_hits
        by_type = ", ".join(f"{t} {n}" for t, n in sorted(faulty_hits.items())) or "0"
        print(f"| {name or 'top'} | {healthy} | {healthy_hits} | {faulty} | {by_type} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
