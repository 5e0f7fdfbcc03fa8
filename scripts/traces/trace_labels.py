"""``labels.json`` for the recorded activation traces, from each recording's numbers.

Windows (see ``record_traces.py``): dead units from the first reading after the fault with
a dead fraction >= 0.5 to 5 readings later; activation blow-up from the first reading
after the fault whose max-abs is >= 10x that module's pre-fault median, to the first
non-finite step (or, without one, to 5 readings later); category shift from the first
eval after the fault at which that category's eval loss is 10% above its pre-fault best,
to 3 evals later. ``allowed`` lists the other finding types the full detector suite raises
on the trace, each backed by a measured number in ``notes``.

Example::

    write_labels(Path("tests/traces/labels.json"), {"dead_relu_mlp": records, ...})
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

NEW_TYPES = ("dead_units", "activation_blowup", "category_divergence", "grad_distribution")
READINGS_TO_REPORT = 5  # a persisting condition should be reported within 5 readings


def _steps(records: list[dict]) -> list[dict]:
    return [r for r in records if r["kind"] == "step"]


def _acts(records: list[dict]) -> list[dict]:
    return [r for r in _steps(records) if r.get("activations")]


def _finite(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def dead_window(records: list[dict], fault: int, every: int) -> tuple[list[int], str]:
    for r in _acts(records):
        worst = max((a["dead_frac"] for a in r["activations"].values()
                     if a.get("dead_frac") is not None), default=0.0)
        if r["step"] >= fault and worst >= 0.5:
            first = r["step"]
            pre = [max((a["dead_frac"] or 0.0) for a in q["activations"].values())
                   for q in _acts(records) if q["step"] < fault]
            return [first, first + READINGS_TO_REPORT * every], (
                f"max dead_frac before the fault {max(pre):.2f} (median "
                f"{statistics.median(pre):.2f}); {worst:.2f} at step {first}")
    raise ValueError("no dead reading after the fault")


def blowup_window(records: list[dict], fault: int, every: int) -> tuple[list[int], str]:
    acts = _acts(records)
    names = list(acts[0]["activations"])
    med = {n: statistics.median(r["activations"][n]["max_abs"] for r in acts
                                if r["step"] < fault) for n in names}
    nan_step = next((r["step"] for r in _steps(records) if not _finite(r.get("loss")) or any(
        (a.get("nonfinite") or 0) > 0 for a in (r.get("activations") or {}).values())), None)
    for r in acts:
        hit = [n for n in names if r["step"] >= fault
               and r["activations"][n]["max_abs"] >= 10 * med[n]]
        if hit:
            last = nan_step if nan_step is not None else r["step"] + READINGS_TO_REPORT * every
            ratio = r["activations"][hit[0]]["max_abs"] / med[hit[0]]
            return [r["step"], last], (
                f"{hit[0]} max_abs {ratio:.0f}x its pre-fault median {med[hit[0]]:.3g} at step "
                f"{r['step']}; first non-finite step {nan_step}")
    raise ValueError("no growth after the fault")


def category_window(records: list[dict], fault: int, category: str,
                    evals: int = 3) -> tuple[list[int], str]:
    """From the first eval after the fault where the category's loss is 10% above its
    pre-fault best, to ``evals`` evals later."""
    key = f"loss/{category}"
    seen = [(r["step"], r["metrics"][key]) for r in records
            if r["kind"] == "eval" and key in (r.get("metrics") or {})]
    best = min(v for step, v in seen if step < fault)
    others = [r for r in records if r["kind"] == "eval" and r["step"] < fault]
    every = seen[1][0] - seen[0][0]
    for step, value in seen:
        if step >= fault and value >= 1.1 * best:
            rest = {k: round(v, 3) for k, v in others[-1]["metrics"].items() if k != key}
            return [step, step + evals * every], (
                f"{key} best before the fault {best:.3g}; {value:.3g} at step {step} "
                f"({value / best - 1:+.0%}); the other categories before the fault: {rest}")
    raise ValueError("the category never rose after the fault")


def collapse_window(records: list[dict], fault: int, every: int,
                    ratio: float = 0.05) -> tuple[list[int], str] | None:
    """First hist reading after the fault where some parameter's gradient p1..p99 spread is
    below ``ratio`` of its pre-fault median on two readings in a row; to 5 readings later."""
    hists = [r for r in _steps(records) if r.get("grad_hist")]
    def spread(r: dict, name: str) -> float:
        q = r["grad_hist"][name]["quantiles"]
        return q[6] - q[1]
    names = list(hists[0]["grad_hist"])
    base = {n: statistics.median(spread(r, n) for r in hists if r["step"] < fault)
            for n in names}
    low_before: set[str] = set()
    for r in hists:
        if r["step"] < fault:
            continue
        low = {n for n in names if n in r["grad_hist"] and base[n] > 0
               and spread(r, n) < ratio * base[n]}
        both = sorted(low & low_before)
        if both:
            name = both[0]
            return [r["step"], r["step"] + READINGS_TO_REPORT * every], (
                f"gradient p1..p99 spread of {name} {spread(r, name):.3g} vs "
                f"{base[name]:.3g} before the fault at step {r['step']} (and the reading "
                f"before)")
        low_before = low
    return None


def _fired(records: list[dict]) -> dict[str, tuple[int, str]]:
    """First finding of each type the full suite raises (for ``allowed`` and the notes)."""
    from monitor_agent.detectors import DetectorSettings, DetectorSuite
    from monitor_agent.records import schemas

    suite, first = DetectorSuite(DetectorSettings()), {}
    for obj in records:
        rec = schemas.parse_record(obj)
        for f in suite.update(rec):
            first.setdefault(f.type, (f.step, f"{f.severity.label}: {f.message}"))
    return first


def label(name: str, records: list[dict]) -> dict:
    run = records[0]["config"]
    fault, every = run.get("fault_step"), run.get("activation_every", 5)
    steps = _steps(records)
    expected, evidence = [], f"{len(steps)} steps, loss {steps[0]['loss']:.3g} -> {steps[-1]['loss']:.3g}"
    if run["scenario"] == "dead_units":
        window, why = dead_window(records, fault, every)
        expected.append({"type": "dead_units", "severity": "warning", "first_step": window[0],
                         "last_step": window[1]})
        evidence += "; " + why
        # Dead units pass no gradient to the weights they feed: a collapsed distribution.
        window, why = collapse_window(records, fault, run.get("hist_every", every))
        expected.append({"type": "grad_distribution", "severity": "warning",
                         "first_step": window[0], "last_step": window[1]})
        evidence += "; " + why
    elif run["scenario"] == "activation_blowup":
        window, why = blowup_window(records, fault, every)
        expected.append({"type": "activation_blowup", "severity": "error",
                         "first_step": window[0], "last_step": window[1]})
        nan = next((r["step"] for r in steps if not _finite(r.get("loss"))), None)
        if nan is not None:
            expected.append({"type": "nan_inf", "severity": "critical", "first_step": nan,
                             "last_step": nan})
        evidence += "; " + why
    elif run["scenario"] == "category_shift":
        window, why = category_window(records, fault, run["fault_params"]["category"])
        expected.append({"type": "category_divergence", "severity": "warning",
                         "first_step": window[0], "last_step": window[1]})
        evidence += "; " + why
    fired = _fired(records)
    exp_types = {e["type"] for e in expected}
    allowed = sorted(t for t in fired if t not in exp_types and t not in NEW_TYPES)
    notes = "; ".join(f"{t} first at step {fired[t][0]} ({fired[t][1]})" for t in allowed)
    collapse = None if fault is None or "grad_distribution" in exp_types else collapse_window(
        records, fault, run.get("hist_every", every))
    if collapse is not None:  # a measured consequence of the fault, not a false alarm
        allowed = sorted([*allowed, "grad_distribution"])
        notes = "; ".join(filter(None, [notes, "grad_distribution: " + collapse[1]]))
    return {"file": f"{name}.jsonl.gz", "scenario": run["scenario"], "healthy": fault is None,
            "fault_step": fault, "fault": run.get("fault") or "none",
            "fault_params": run.get("fault_params", {}), "steps_recorded": len(steps),
            "end_status": records[-1].get("status"), "expected": expected, "allowed": allowed,
            "evidence": evidence,
            "notes": ("Other types the full suite raises on this recording, with the measured "
                      "signal behind each: " + notes) if notes else "No other finding."}


def write_labels(path: Path, recorded: dict[str, list[dict]]) -> None:
    labels = [label(name, records) for name, records in recorded.items()]
    path.write_text(json.dumps(labels, indent=1) + "\n")
