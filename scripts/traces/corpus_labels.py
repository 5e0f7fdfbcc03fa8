"""``labels.json`` of the precision corpus, from what each recording measurably did.

Same schema as ``tests/traces/public/labels.json``, plus ``half`` (``tune`` or ``heldout``:
the first hex digit of sha1(file name) even or odd, a rule fixed before any tuning).
Nothing here runs a detector: every window and every ``allowed`` type comes from the
recorded numbers, with the number in ``evidence``/``notes``.

Fault windows:

* ``nan_inf`` (critical): the first step whose loss or grad norm is non-finite, exactly.
* ``loss_spike`` (warning, ``bad_batch``): the bad batch's step to 2 steps later, when its
  loss is at least 3x the median of the 50 steps before (else no loss_spike is expected).
* ``grad_explosion`` (error, ``lr_spike``): when the grad norm is >= 3x its pre-fault
  median (50 steps) on 3 consecutive steps, one of them >= 5x, within 50 steps of the
  fault (it persists: the LR stays high); window from the fault to 5 steps after the
  third such step, capped at the first non-finite step.
* ``divergence`` (error, ``lr_spike``): when the median loss of the 20 steps after the
  fault (or up to the first non-finite step) is >= 1.3x the pre-fault median (the rise
  holds for 20 steps); window from the fault to 30 steps after it, capped at the first
  non-finite step. ``loss_spike``, ``update_ratio_high`` and ``clip_saturation`` are
  allowed there: a persistent LR jump makes all three true.
* ``lr_jump`` (warning, ``lr_spike``): at the fault step exactly, when the recorded lr
  there is >= 5x the lr of the step before.

Healthy runs expect nothing; ``allowed`` lists warnings whose signal is measurably present
(the rule is in ``allowed_warnings``). Run: ``python -m scripts.traces.record_traces --labels``.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path


def half(file: str) -> str:
    return "tune" if int(hashlib.sha1(file.encode()).hexdigest()[0], 16) % 2 == 0 else "heldout"


def finite(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def read_records(path: Path) -> list[dict]:
    """The records, with the top-level non-finite markers ("NaN", ...) as floats."""
    from monitor_agent.records import wire

    return [{k: NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in obj.items()}
            for obj in wire.iter_trace(path)]


def median_of(values) -> float:
    values = [v for v in values if finite(v)]
    return statistics.median(values) if values else math.nan


def first_nonfinite(steps: list[dict]) -> int | None:
    return next((r["step"] for r in steps
                 if not finite(r.get("loss")) or not finite(r.get("grad_norm"))), None)


def _fault_expected(run: dict, steps: list[dict]) -> tuple[list[dict], list[str], list[str]]:
    fault, kind = run.get("fault_step"), run["scenario"]
    expected, why, allowed = [], [], []
    nan = first_nonfinite(steps)
    pre = [r for r in steps if fault - 50 <= r["step"] < fault]
    pre_loss, pre_grad = median_of(r["loss"] for r in pre), median_of(r["grad_norm"] for r in pre)
    after = [r for r in steps if r["step"] >= fault]
    if nan is not None:
        expected.append({"type": "nan_inf", "severity": "critical", "first_step": nan,
                         "last_step": nan})
        why.append(f"first non-finite loss/grad at step {nan}")
        # Everything after a NaN is NaN: the other loss/gradient findings may follow it.
        allowed += ["divergence", "grad_explosion", "loss_spike", "plateau",
                    "update_ratio_high", "dead_layer", "grad_vanishing", "gain_drift"]
    cap = nan if nan is not None else math.inf
    if kind == "bad_batch":
        hit = steps[[r["step"] for r in steps].index(fault)]
        ratio = hit["loss"] / pre_loss
        first = _first_spike(steps, fault)
        why.append(f"loss {pre_loss:.3g} (median of 50 steps before) -> {hit['loss']:.3g} at "
                   f"step {fault} ({ratio:.0f}x); grad norm {pre_grad:.3g} -> "
                   f"{hit['grad_norm']:.3g}")
        back = next((r["step"] for r in after[1:] if r["loss"] <= 1.5 * pre_loss), None)
        why.append(f"back within 1.5x of it at step {back}")
        if first is not None and first[0] < fault:
            why.append(f"a spike of its own before the fault: loss {first[1]:.0f}x the median "
                       f"of the 50 steps before at step {first[0]}")
        if ratio >= 3:
            start = first[0] if first is not None else fault
            expected.append({"type": "loss_spike", "severity": "warning",
                             "first_step": start, "last_step": start + 2})
    if kind == "lr_spike":
        ratios = [r["grad_norm"] / pre_grad if finite(r["grad_norm"]) else math.inf
                  for r in after[:50]]
        hit = next((i for i in range(2, len(ratios)) if min(ratios[i - 2:i + 1]) >= 3
                    and max(ratios[i - 2:i + 1]) >= 5), None)
        if hit is not None:
            step = after[hit]["step"]
            expected.append({"type": "grad_explosion", "severity": "error",
                             "first_step": fault, "last_step": min(step + 5, cap)})
            why.append(f"grad norm >= 3x its pre-fault median {pre_grad:.3g} on 3 steps in a "
                       f"row, one of them >= 5x, by step {step}")
        else:
            why.append(f"grad norm ratios to its pre-fault median {pre_grad:.3g} in the 10 "
                       f"steps after the fault: {', '.join(f'{x:.1f}' for x in ratios[:10])}")
        early = [r["loss"] for r in after[:20] if finite(r["loss"])]
        if early and median_of(early) >= 1.3 * pre_loss:
            expected.append({"type": "divergence", "severity": "error", "first_step": fault,
                             "last_step": min(fault + 30, cap)})
        lr_before = next((r.get("lr") for r in reversed(steps) if r["step"] < fault), None)
        lr_at = after[0].get("lr") if after else None
        if finite(lr_before) and finite(lr_at) and lr_before > 0 and lr_at >= 5 * lr_before:
            expected.append({"type": "lr_jump", "severity": "warning", "first_step": fault,
                             "last_step": fault})
            why.append(f"recorded lr x{lr_at / lr_before:.3g} at step {fault}")
        allowed += ["loss_spike", "update_ratio_high", "clip_saturation"]
        if early and median_of(early) >= 1.3 * pre_loss:  # the weights were thrown: per-layer
            allowed += ["dead_layer", "grad_vanishing", "gain_drift"]  # findings follow
        why.append(f"loss {pre_loss:.3g} before the fault; median of the 20 steps after "
                   f"{median_of(early):.3g}")
    return expected, why, allowed


def _first_spike(steps: list[dict], until: int) -> tuple[int, float] | None:
    """The first step (after 50) whose loss is >= 10x the median of the 50 before it (an
    order of magnitude: at loss 0.001 a CNN's single batches reach 3x every few steps)."""
    losses = [r["loss"] for r in steps]
    for i in range(50, len(steps)):
        if steps[i]["step"] > until:
            return None
        ratio = losses[i] / median_of(losses[i - 50:i])
        if ratio >= 10:
            return steps[i]["step"], ratio
    return None


def _flat_stretch(steps: list[dict]) -> str | None:
    """A 200-step stretch whose last 50-step median is within 1% of its first, at a loss
    within 2% of the run's start (the run had not learnt yet, or started converged)."""
    losses = [r["loss"] for r in steps if finite(r["loss"])]
    start = median_of(losses[:20])
    for i in range(0, len(losses) - 199, 10):
        a, b = median_of(losses[i:i + 50]), median_of(losses[i + 150:i + 200])
        if a - b < 0.01 * abs(a) and start - b < 0.02 * abs(start):
            return (f"loss median {a:.3g} -> {b:.3g} over steps {steps[i]['step']}.."
                    f"{steps[i + 199]['step']}, {start:.3g} at the start")
    return None


def _vanishing(steps: list[dict], order: list[str]) -> str | None:
    """Early parameters (first quarter of ``layer_order``) get < 1% of the late ones'
    (last quarter) median gradient norm, as a median over 10 recorded steps."""
    rows = [r["layers"] for r in steps if r.get("layers")]
    if not rows or len(order) < 4:
        return None
    q = len(order) // 4
    ratios = []
    for layers in rows:
        early = median_of(layers[n]["grad_norm"] for n in order[:q] if n in layers)
        late = median_of(layers[n]["grad_norm"] for n in order[-q:] if n in layers)
        ratios.append(early / late if late > 0 else math.nan)
    worst = min((median_of(ratios[i:i + 10]) for i in range(max(len(ratios) - 9, 0))),
                default=math.nan)
    if worst < 0.01:
        return f"early/late parameter grad norm down to {worst:.2g} (10-step median)"
    return None


def _dead_params(steps: list[dict]) -> str | None:
    """Parameters with a zero gradient or zero update at every layer-statistics step over
    20 steps: from the first such reading to the latest, in steps, not readings (the
    statistics come every ``layer_stats_every`` steps; those between say nothing)."""
    since: dict[str, int] = {}
    dead = set()
    for r in steps:
        for name, row in (r.get("layers") or {}).items():
            if not (row.get("grad_norm") == 0 or row.get("update_norm") == 0):
                since.pop(name, None)
                continue
            first = since.setdefault(name, r["step"])
            if r["step"] - first + 1 >= 20:
                dead.add(name)
    return f"zero gradient or update for 20+ steps on {', '.join(sorted(dead)[:4])}" \
        if dead else None


def _windows(values: list[float], n: int):
    for i in range(0, max(len(values) - n + 1, 0), max(n // 5, 1)):
        yield values[i:i + n]


def allowed_warnings(run: dict, steps: list[dict], evals: list[dict]) -> dict[str, str]:
    """Warnings whose signal the recording measurably carries, each with its number."""
    out: dict[str, str] = {}
    losses = [r["loss"] for r in steps]
    clip = run.get("grad_clip")
    if clip:
        worst = max((sum(g > clip for g in w if finite(g)) / len(w)
                     for w in _windows([r["grad_norm"] for r in steps], 50)), default=0)
        if worst >= 0.8:
            out["clip_saturation"] = f"grad_norm above clip on up to {worst:.0%} of a 50-step window"
    # A real single-batch blip: >= 2x the median of the 50 steps before it.
    blips = [(losses[i] / median_of(losses[i - 50:i]), steps[i]["step"])
             for i in range(50, len(losses)) if finite(losses[i])]
    top = max(blips, default=(0, 0))
    if top[0] >= 2:
        out["loss_spike"] = f"loss up to {top[0]:.1f}x the median of the 50 steps before " \
                            f"(step {top[1]})"
    vals = [(e["step"], e["val_loss"]) for e in evals if finite(e.get("val_loss"))]
    if len(vals) >= 3:
        best = min(vals, key=lambda v: v[1])
        train = median_of(r["loss"] for r in steps if vals[-1][0] - 50 < r["step"] <= vals[-1][0])
        gap = (vals[-1][1] - train) / train if train > 0 else 0.0
        if vals[-1][1] >= 1.05 * best[1] or (gap >= 0.3 and best[0] < vals[-2][0]):
            out["overfitting"] = f"val loss min {best[1]:.3g} at step {best[0]}, last " \
                                 f"{vals[-1][1]:.3g}; train-val gap {gap:.0%} at the end"
    flat = _flat_stretch(steps)
    if flat:
        out["plateau"] = flat
    dead = _dead_params(steps)
    if dead:
        out["dead_layer"] = dead
    vanish = _vanishing(steps, run.get("layer_order") or [])
    if vanish:
        out["grad_vanishing"] = vanish
    speed = [r["tokens_per_second"] for r in steps if finite(r.get("tokens_per_second"))]
    worst = min((median_of(speed[i:i + 50]) / median_of(speed[max(i - 200, 0):i])
                 for i in range(100, len(speed) - 49, 10)), default=1.0)
    if worst < 0.6:
        out["throughput_drop"] = f"a 50-step median tokens/s {worst:.2f}x the median of the " \
                                 f"200 steps before it (machine shared with other jobs)"
    ratios = [r["update_norm"] / r["param_norm"] for r in steps
              if finite(r.get("update_norm")) and finite(r.get("param_norm")) and r["param_norm"]]
    top = max((median_of(ratios[i:i + 5]) for i in range(len(ratios) - 4)), default=0.0)
    if top > 0.1:
        out["update_ratio_high"] = f"update/param 5-step median up to {top:.3g}"
    return out


def crash_expected(end: dict) -> list[dict]:
    """A recording that ended ``failed`` (its script died of an exception) expects a
    ``crashed`` page at its end record's step (the last step it logged)."""
    if end.get("status") != "failed":
        return []
    return [{"type": "crashed", "severity": "error", "first_step": end["step"],
             "last_step": end["step"]}]


def label(path: Path) -> dict:
    records = read_records(path)
    run = records[0]["config"]
    steps = [r for r in records if r["kind"] == "step" and r.get("rank", 0) == 0]
    evals = [r for r in records if r["kind"] == "eval"]
    end = next((r for r in records if r["kind"] == "end"), {})
    expected, why, allowed = ([], [], []) if run["fault_step"] is None else \
        _fault_expected(run, steps)
    expected += crash_expected(end)
    measured = allowed_warnings({**run, "layer_order": (records[0].get("model") or {}).get(
        "layer_order")}, steps, evals)
    exp_types = {e["type"] for e in expected}
    allowed = sorted(set(allowed) | set(measured) - exp_types)
    grads = [r["grad_norm"] for r in steps if finite(r.get("grad_norm"))]
    evidence = (f"{len(steps)} steps from step {steps[0]['step']}, loss {steps[0]['loss']:.3g} -> "
                f"{steps[-1]['loss']:.3g}; grad_norm median {median_of(grads):.3g}")
    return {"file": path.name, "scenario": run["scenario"], "healthy": run["fault_step"] is None,
            "half": half(path.name), "fault_step": run["fault_step"],
            "fault": run.get("fault") or "none", "fault_params": run.get("fault_params", {}),
            "model": f"{run['arch']} {run.get('model_kw') or ''}".strip() + f", {run['optimizer']}"
                     f" lr {run['lr']:g} {run['schedule']}, warmup {run['warmup_steps']}, "
                     f"batch {run['batch_ramp'] or run['batch_size']} x accum "
                     f"{run['accum_steps']}, clip {run.get('grad_clip')}",
            "steps_recorded": len(steps), "end_status": end.get("status"),
            "expected": expected, "allowed": allowed,
            "evidence": "; ".join([evidence, *why]),
            "notes": "; ".join(f"{t}: {measured[t]}" for t in sorted(measured)) or "none"}


def write_corpus_labels(directory: Path) -> None:
    labels = [label(p) for p in sorted(directory.glob("*.jsonl.gz"))]
    (directory / "labels.json").write_text(json.dumps(labels, indent=1) + "\n")
