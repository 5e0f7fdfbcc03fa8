"""``labels.json`` of the shape recordings (``shapes_runs.py``), from what each one measurably did.

Same schema as ``tests/traces/classes/labels.json`` (``half`` from the seed: seed 1
``tune``, seeds 2 and 3 ``heldout``), plus ``shape`` (the run kind: ``ac``, ``dqn``, ...)
and ``end_status``. Nothing here runs a detector; every window comes from the recorded
numbers, with the number in ``evidence``:

* healthy runs expect nothing. ``allowed`` lists the warnings whose signal the recording
  carries by the corpus's rules (``corpus_labels.allowed_warnings``), except where the rule reads a
  loss the shape makes meaningless: on losses noisy by design (actor-critic, DQN, one
  diffusion timestep per batch) a 2x single-step ratio is the design, not a spike, so
  ``loss_spike`` is not allowed; on a loss that crosses zero (actor-critic) neither ratios
  nor a "flat" stretch mean anything, so ``loss_spike`` and ``plateau`` are not allowed.
  The dropped measurement stays in ``notes``.
* ``recur`` (inputs x30 on single batches every 35-70 steps): ``grad_explosion`` (error)
  when at least 3 of those batches have a grad norm >= 4x the median of the 50 steps
  before the first; window from the first x30 batch to 10 steps after the third such one.
  ``loss_spike`` is allowed (each such batch is also a loss spike); ``divergence`` only
  when the loss of the other steps after the first fault has a median >= 1.1x the
  pre-fault one (it never has: the level stays).
* ``burst`` (6 random-label batches under bf16, then clean data): ``loss_spike``
  (warning) from the burst's first step to 2 steps after its last when its highest loss is
  >= 1.5x the pre-fault median. ``grad_explosion`` and ``divergence`` are never allowed:
  the data came back and so did the loss (``returned_step``: first step after the burst
  within 1.5x of the pre-fault median).
* ``kept`` (LR x30 or x100 kept): ``divergence`` (error), window from the fault to 60
  steps after it, capped at the first non-finite step, when the loss leaves its band and
  stays out: on a loss that crosses zero the band is the 5th..95th percentile of the 200
  steps before the fault, of width w, and the median of steps fault+20..fault+59 (or of
  the finite steps up to the first non-finite one) must lie outside [p5 - w, p95 + w]
  (outside [p5, p95] only: allowed); on other losses it is ``classes_labels``'s rule
  (>= 1.3x the pre-fault median; 1.1x..1.3x allowed). ``grad_explosion`` (error) as in
  ``classes_labels``: at least 3 of the 50 steps after the fault with a grad norm >= 4x
  the pre-fault median; window from the fault to 10 steps after the third. ``plateau`` and
  the per-layer findings are allowed after it (the weights were thrown).
* ``nan_inf`` (critical): the first non-finite loss or grad norm, exactly; after it every
  loss/gradient type is allowed.

Run: ``python -m scripts.traces.record_traces --shapes --labels`` (only the labels) or
``python -m scripts.traces.record_traces --shapes`` (record, then label).
"""

from __future__ import annotations

import json
from pathlib import Path

from scripts.traces.classes_labels import GRAD_SPIKE, GRAD_SPIKES, GRAD_WINDOW
from scripts.traces.corpus_labels import (
    allowed_warnings,
    crash_expected,
    finite,
    first_nonfinite,
    median_of,
    read_records,
)
from scripts.traces.shapes_runs import half_of

SPIKE_RATIO = 1.5
PERSIST_RATIO, BORDER_RATIO, PERSIST_FROM, PERSIST_TO = 1.3, 1.1, 20, 60
BAND_STEPS = 200
AFTER_NAN = ["divergence", "grad_explosion", "loss_spike", "plateau", "update_ratio_high",
             "dead_layer", "grad_vanishing", "gain_drift"]


def _pct(values: list[float], q: float) -> float:
    v = sorted(x for x in values if finite(x))
    return v[round(q * (len(v) - 1))]


def _recur(run, steps, pre_loss, pre_grad, expected, why, allowed) -> None:
    hits = run["fault_params"]["steps"]
    by_step = {r["step"]: r for r in steps}
    ratios = [(s, by_step[s]["grad_norm"] / pre_grad) for s in hits if s in by_step]
    big = [s for s, g in ratios if not finite(g) or g >= GRAD_SPIKE]
    why.append("x30 batches at " + ", ".join(f"{s} (grad {g:.0f}x, loss "
                                             f"{by_step[s]['loss'] / pre_loss:.0f}x)"
                                             for s, g in ratios))
    if len(big) >= GRAD_SPIKES:
        expected.append({"type": "grad_explosion", "severity": "error", "first_step": hits[0],
                         "last_step": big[GRAD_SPIKES - 1] + 10})
    rest = [r["loss"] for r in steps if r["step"] > hits[0] and r["step"] not in hits]
    level = median_of(rest)
    why.append(f"median loss of the other steps after {hits[0]}: {level:.3g} "
               f"({level / pre_loss:.2f}x)")
    if level >= BORDER_RATIO * pre_loss:
        allowed.append("divergence")
    allowed += ["loss_spike", "update_ratio_high", "clip_saturation"]


def _burst(run, steps, pre_loss, spikes, expected, why, allowed, extra) -> list[str]:
    fault, n = run["fault_step"], run["fault_params"]["burst"]
    after = [r for r in steps if r["step"] >= fault]
    peak = max(r["loss"] for r in after[:n])
    back = next((r["step"] for r in after[n:] if r["loss"] <= SPIKE_RATIO * pre_loss), None)
    extra["returned_step"] = back
    why.append(f"{n} random-label batches from step {fault}: loss up to {peak:.3g} "
               f"({peak / pre_loss:.1f}x), back within {SPIKE_RATIO:g}x at step {back}")
    if peak >= SPIKE_RATIO * pre_loss:
        expected.append({"type": "loss_spike", "severity": "warning", "first_step": fault,
                         "last_step": fault + n + 1})
    return ["grad_explosion", "divergence"]  # the wrong classes: never allowed


def _kept(run, steps, nan, spikes, expected, why, allowed) -> None:
    fault = run["fault_step"]
    cap = nan if nan is not None else 10**9
    after = [r for r in steps if r["step"] >= fault]
    later = [r["loss"] for r in after[PERSIST_FROM:PERSIST_TO] if finite(r["loss"])
             and r["step"] < cap]
    if not later:  # gone non-finite before fault+20: the finite steps up to it
        later = [r["loss"] for r in after if finite(r["loss"]) and r["step"] < cap]
    level = median_of(later)
    if run.get("loss_crosses_zero"):
        band = [r["loss"] for r in steps if fault - BAND_STEPS <= r["step"] < fault]
        lo, hi = _pct(band, 0.05), _pct(band, 0.95)
        w = hi - lo
        why.append(f"LR x{run['fault_params']['factor']:g} kept from step {fault}: loss band "
                   f"(p5..p95 of the {BAND_STEPS} steps before) {lo:.3g}..{hi:.3g}, median of "
                   f"the steps after it used {level:.3g} ({(level - hi) / w:+.3g} band widths "
                   f"above p95)")
        out, border = not lo - w <= level <= hi + w, not lo <= level <= hi
    else:
        pre = median_of(r["loss"] for r in steps if fault - 50 <= r["step"] < fault)
        why.append(f"LR x{run['fault_params']['factor']:g} kept from step {fault}: median loss "
                   f"of steps {fault + PERSIST_FROM}..{fault + PERSIST_TO - 1} {level:.3g} "
                   f"({level / pre:.2f}x the pre-fault median {pre:.3g})")
        out, border = level >= PERSIST_RATIO * pre, level >= BORDER_RATIO * pre
    if out or (nan is not None and nan > fault):
        expected.append({"type": "divergence", "severity": "error", "first_step": fault,
                         "last_step": min(fault + PERSIST_TO, cap)})
    elif border:
        allowed.append("divergence")
    if len(spikes) >= GRAD_SPIKES:
        expected.append({"type": "grad_explosion", "severity": "error", "first_step": fault,
                         "last_step": min(spikes[GRAD_SPIKES - 1] + 10, cap)})
    # the weights were thrown: per-layer findings follow, and a collapsed policy stops
    # learning (a plateau after it is true)
    allowed += ["lr_jump", "loss_spike", "update_ratio_high", "clip_saturation", "dead_layer",
                "grad_vanishing", "gain_drift", "plateau"]


def _fault(run, steps, extra) -> tuple[list[dict], list[str], list[str], list[str]]:
    fault, kind = run["fault_step"], run["scenario"]
    pre = [r for r in steps if fault - 50 <= r["step"] < fault]
    pre_loss, pre_grad = median_of(r["loss"] for r in pre), median_of(r["grad_norm"] for r in pre)
    after = [r for r in steps if r["step"] >= fault]
    nan = first_nonfinite(steps)
    expected, why, allowed, never = [], [], [], []
    if nan is not None:
        expected.append({"type": "nan_inf", "severity": "critical", "first_step": nan,
                         "last_step": nan})
        allowed += AFTER_NAN
        why.append(f"first non-finite loss/grad at step {nan}")
    spikes = [r["step"] for r in after[:GRAD_WINDOW]
              if not finite(r["grad_norm"]) or r["grad_norm"] >= GRAD_SPIKE * pre_grad]
    why.append(f"loss {pre_loss:.3g}, grad norm {pre_grad:.3g} (medians of the 50 steps before "
               f"the fault); {len(spikes)} of the {GRAD_WINDOW} steps after it >= "
               f"{GRAD_SPIKE:g}x that grad norm")
    if kind == "recur":
        _recur(run, steps, pre_loss, pre_grad, expected, why, allowed)
    elif kind == "burst":
        never = _burst(run, steps, pre_loss, spikes, expected, why, allowed, extra)
    elif kind == "kept":
        _kept(run, steps, nan, spikes, expected, why, allowed)
    return expected, why, allowed, never


def label(path: Path) -> dict:
    records = read_records(path)
    run = records[0]["config"]
    steps = [r for r in records if r["kind"] == "step" and r.get("rank", 0) == 0]
    for r in steps:  # an expert that got no input this step: no gradient, counted as zero
        for row in (r.get("layers") or {}).values():
            if row.get("grad_none"):
                row.setdefault("grad_norm", 0.0)
    evals = [r for r in records if r["kind"] == "eval"]
    end = next((r for r in records if r["kind"] == "end"), {})
    extra: dict = {}
    healthy = run["fault_step"] is None
    expected, why, allowed, never = ([], [], [], []) if healthy else _fault(run, steps, extra)
    expected += crash_expected(end)
    measured = allowed_warnings({**run, "layer_order": (records[0].get("model") or {}).get(
        "layer_order")}, steps, evals)
    dropped = set(never)
    if run.get("noisy_by_design"):
        dropped.add("loss_spike")
    if run.get("loss_crosses_zero"):
        dropped |= {"loss_spike", "plateau"}
    exp_types = {e["type"] for e in expected}
    allowed = sorted(((set(allowed) | set(measured)) - exp_types) - (dropped - set(allowed))
                     - set(never))
    losses = [r["loss"] for r in steps if finite(r["loss"])]
    grads = [r["grad_norm"] for r in steps if finite(r.get("grad_norm"))]
    skipped = sum(bool(r.get("skipped")) for r in steps)
    scales = [r["loss_scale"] for r in steps if finite(r.get("loss_scale"))]
    evidence = (f"{len(steps)} steps, loss {steps[0]['loss']:.3g} -> {steps[-1]['loss']:.3g} "
                f"(range {min(losses):.3g}..{max(losses):.3g}); grad_norm median {median_of(grads):.3g}"
                + (f"; loss scale {min(scales):g}..{max(scales):g}, {skipped} steps skipped"
                   if scales else ""))
    notes = [f"{t}: {measured[t]}" + (" (not allowed: the shape's loss makes this rule "
                                      "meaningless)" if t in dropped and t not in allowed
                                      else "") for t in sorted(measured)]
    return {"file": path.name, "shape": run["shape"], "scenario": run["scenario"],
            "healthy": healthy, "half": half_of(path.name.split(".")[0]),
            "fault_step": run["fault_step"], "fault": run.get("fault") or "none",
            "fault_params": run.get("fault_params", {}),
            "model": f"{run['arch']}; {run['optimizer']} lr {run['lr']:g} wd "
                     f"{run['weight_decay']:g}, batch {run['batch_size']} x accum "
                     f"{run['accum_stages']}, amp {run['amp']}, clip {run.get('grad_clip')}, "
                     f"seed {run['seed']}; data: {run['data']}",
            "steps_recorded": len(steps), "end_status": end.get("status"), **extra,
            "expected": expected, "allowed": allowed, "evidence": "; ".join([evidence, *why]),
            "notes": "; ".join(notes) or "none"}


def write_shape_labels(directory: Path) -> None:
    labels = [label(p) for p in sorted(directory.glob("*.jsonl.gz"))]
    (directory / "labels.json").write_text(json.dumps(labels, indent=1) + "\n")
