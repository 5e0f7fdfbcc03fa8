"""``labels.json`` of the precision corpus, from what each recording measurably did.

Same schema as ``tests/traces/public/labels.json``, plus ``half`` (``tune`` or ``heldout``:
the first hex digit of sha1(file name) even or odd, a rule fixed before any tuning).
Nothing here runs a detector: every window and every ``allowed`` type comes from the
recorded numbers, with the number in ``evidence``/``notes``.

Fault windows:

* ``nan_inf`` (critical): the first step whose loss or grad norm is non-finite, exactly.
* ``loss_spike`` (warning, ``bad_batch``): the bad batch's step to 2 steps later, when its
  loss is at least 3x the median of the 50 steps before (else no loss_spike is expected).
* ``grad_explosion`` (error, ``lr_spike``): when the grad norm stays >= 5x its pre-fault
  median (50 steps) on 3 consecutive steps within 50 steps of the fault (it persists: the
  LR stays high); window from the fault to 5 steps after the third such step, capped at
  the first non-finite step.
* ``divergence`` (error, ``lr_spike``): when the median loss of the 20 steps after the
  fault (or up to the first non-finite step) is >= 1.5x the pre-fault median and the
  last 20 finite steps stay above it (it holds, not recovers); window from the fault to 30
  steps after it, capped at the first non-finite step.

Healthy runs expect nothing; ``allowed`` lists warnings whose signal is measurably present
(the rule is in ``_allowed``). Run: ``python bench/record_traces.py --labels``.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from pathlib import Path


def half(file: str) -> str:
    return "tune" if int(hashlib.sha1(file.encode()).hexdigest()[0], 16) % 2 == 0 else "heldout"


def _finite(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _read(path: Path) -> list[dict]:
    """The records, with the top-level non-finite markers ("NaN", ...) as floats."""
    from monitor_agent import wire

    return [{k: NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in obj.items()}
            for obj in wire.iter_trace(path)]


def _med(values) -> float:
    values = [v for v in values if _finite(v)]
    return statistics.median(values) if values else math.nan


def _first_nonfinite(steps: list[dict]) -> int | None:
    return next((r["step"] for r in steps
                 if not _finite(r.get("loss")) or not _finite(r.get("grad_norm"))), None)


def _fault_expected(run: dict, steps: list[dict]) -> tuple[list[dict], list[str], list[str]]:
    fault, kind = run.get("fault_step"), run["scenario"]
    expected, why, allowed = [], [], []
    nan = _first_nonfinite(steps)
    pre = [r for r in steps if fault - 50 <= r["step"] < fault]
    pre_loss, pre_grad = _med(r["loss"] for r in pre), _med(r["grad_norm"] for r in pre)
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
        why.append(f"loss {pre_loss:.3g} (median of 50 steps before) -> {hit['loss']:.3g} at "
                   f"step {fault} ({ratio:.0f}x); grad norm {pre_grad:.3g} -> "
                   f"{hit['grad_norm']:.3g}")
        back = next((r["step"] for r in after[1:] if r["loss"] <= 1.5 * pre_loss), None)
        why.append(f"back within 1.5x of it at step {back}")
        if ratio >= 3:
            expected.append({"type": "loss_spike", "severity": "warning",
                             "first_step": fault, "last_step": fault + 2})
    if kind == "lr_spike":
        run_len = 0
        for r in after[:50]:
            run_len = run_len + 1 if _finite(r["grad_norm"]) and r["grad_norm"] >= 5 * pre_grad \
                else 0
            if run_len == 3:
                expected.append({"type": "grad_explosion", "severity": "error",
                                 "first_step": fault, "last_step": min(r["step"] + 5, cap)})
                why.append(f"grad norm >= 5x its pre-fault median {pre_grad:.3g} on 3 steps "
                           f"in a row by step {r['step']}")
                break
        else:
            peak = max((r["grad_norm"] for r in after[:50] if _finite(r["grad_norm"])),
                       default=math.nan)
            why.append(f"grad norm peak {peak / pre_grad:.1f}x its pre-fault median "
                       f"{pre_grad:.3g} in the 50 steps after the fault (not 5x for 3 steps)")
        early = [r["loss"] for r in after[:20] if _finite(r["loss"])]
        tail = [r["loss"] for r in after if _finite(r["loss"])][-20:]
        if early and _med(early) >= 1.5 * pre_loss and min(tail) > 1.5 * pre_loss:
            expected.append({"type": "divergence", "severity": "error", "first_step": fault,
                             "last_step": min(fault + 30, cap)})
        why.append(f"loss {pre_loss:.3g} before the fault; median of the 20 steps after "
                   f"{_med(early):.3g}; the last 20 finite steps {min(tail):.3g}.."
                   f"{max(tail):.3g}")
    return expected, why, allowed


def _windows(values: list[float], n: int):
    for i in range(0, max(len(values) - n + 1, 0), max(n // 5, 1)):
        yield values[i:i + n]


def _allowed(run: dict, steps: list[dict], evals: list[dict]) -> dict[str, str]:
    """Warnings whose signal the recording measurably carries, each with its number."""
    out: dict[str, str] = {}
    losses = [r["loss"] for r in steps]
    clip = run.get("grad_clip")
    if clip:
        worst = max((sum(g > clip for g in w if _finite(g)) / len(w)
                     for w in _windows([r["grad_norm"] for r in steps], 50)), default=0)
        if worst >= 0.8:
            out["clip_saturation"] = f"grad_norm above clip on up to {worst:.0%} of a 50-step window"
    # A real single-batch blip: >= 2x the median of the 50 steps before it.
    blips = [(losses[i] / _med(losses[i - 50:i]), steps[i]["step"])
             for i in range(50, len(losses)) if _finite(losses[i])]
    top = max(blips, default=(0, 0))
    if top[0] >= 2:
        out["loss_spike"] = f"loss up to {top[0]:.1f}x the median of the 50 steps before " \
                            f"(step {top[1]})"
    vals = [(e["step"], e["val_loss"]) for e in evals if _finite(e.get("val_loss"))]
    if len(vals) >= 3:
        best = min(vals, key=lambda v: v[1])
        if vals[-1][1] >= 1.1 * best[1]:
            out["overfitting"] = f"val loss min {best[1]:.3g} at step {best[0]}, last " \
                                 f"{vals[-1][1]:.3g}"
    if len(losses) >= 400:
        old, new = _med(losses[-300:-200]), _med(losses[-100:])
        if new > 0.98 * old:
            out["plateau"] = f"loss median {old:.3g} -> {new:.3g} over the last 300 steps"
    speed = [r["tokens_per_second"] for r in steps if _finite(r.get("tokens_per_second"))]
    base = _med(speed)
    worst = min((_med(w) for w in _windows(speed, 50)), default=base)
    if base and worst < 0.6 * base:
        out["throughput_drop"] = f"a 50-step median tokens/s {worst / base:.2f}x the run's " \
                                 f"median (machine shared with other jobs)"
    return out


def label(path: Path) -> dict:
    records = _read(path)
    run = records[0]["config"]
    steps = [r for r in records if r["kind"] == "step" and r.get("rank", 0) == 0]
    evals = [r for r in records if r["kind"] == "eval"]
    end = next((r for r in records if r["kind"] == "end"), {})
    expected, why, allowed = ([], [], []) if run["fault_step"] is None else \
        _fault_expected(run, steps)
    measured = _allowed(run, steps, evals)
    exp_types = {e["type"] for e in expected}
    allowed = sorted(set(allowed) | set(measured) - exp_types)
    grads = [r["grad_norm"] for r in steps if _finite(r.get("grad_norm"))]
    evidence = (f"{len(steps)} steps from step {steps[0]['step']}, loss {steps[0]['loss']:.3g} -> "
                f"{steps[-1]['loss']:.3g}; grad_norm median {_med(grads):.3g}")
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
