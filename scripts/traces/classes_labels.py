"""``labels.json`` of the class recordings (``classes_runs.py``), from what each one measurably did.

Same schema as ``tests/traces/corpus/labels.json`` (``half`` from the seed: see
``classes_runs.py``), plus ``shape`` (``burst``, ``kept``, ``jump``) and, on bursts,
``returned_step``: the first step after the burst whose loss is back within 1.5x of the
pre-fault median (null: not within the recording). Nothing here runs a
detector; every window comes from the recorded numbers (pre-fault medians over the 50 steps
before the fault), with the number in ``evidence``:

* ``loss_spike`` (warning, ``burst``): the burst's first step to 2 steps after its last,
  when the burst's highest loss is >= 1.5x the pre-fault median. ``divergence`` is never
  expected nor allowed on a burst: the data came back and so did the loss (the evidence
  gives the step it was back within 1.5x), which is what a spike is.
* ``divergence`` (error, ``kept``/``jump``): when the median loss of steps fault+20 ..
  fault+60 is >= 1.3x the pre-fault median (the rise is still there 20-60 steps later: it
  persists); window from the fault to 60 steps after it, capped at the first non-finite
  step. Between 1.1x and 1.3x it is allowed (a real but small rise: neither answer is
  wrong).
* ``grad_explosion`` (error, ``kept``/``jump``): when at least 3 of the 50 steps after the
  fault have a grad norm >= 4x the pre-fault median (consecutive or not); window from the
  fault to 10 steps after the third such step, capped at the first non-finite step. On a
  burst the same measurement makes it *allowed* (bad data does give repeated large
  gradients), never expected.
* ``nan_inf`` (critical): the first non-finite loss or grad norm, exactly; after it every
  loss/gradient type is allowed.

Other warnings whose signal the recording carries are allowed by the corpus's own rules
(``corpus_labels.allowed_warnings``). Run: ``python -m scripts.traces.record_traces --classes``.
"""

from __future__ import annotations

import json
from pathlib import Path

from scripts.traces.classes_runs import half_of
from scripts.traces.corpus_labels import (
    allowed_warnings,
    finite,
    first_nonfinite,
    median_of,
    read_records,
)

SPIKE_RATIO = 1.5
PERSIST_RATIO, PERSIST_FROM, PERSIST_TO = 1.3, 20, 60
BORDER_RATIO = 1.1
GRAD_SPIKE, GRAD_SPIKES, GRAD_WINDOW = 4.0, 3, 50


def _grad_spikes(after: list[dict], pre_grad: float) -> list[int]:
    return [r["step"] for r in after[:GRAD_WINDOW]
            if not finite(r["grad_norm"]) or r["grad_norm"] >= GRAD_SPIKE * pre_grad]


def _expected(run: dict, steps: list[dict], shape: str, extra: dict
              ) -> tuple[list[dict], list[str], list[str]]:
    fault = run["fault_step"]
    pre = [r for r in steps if fault - 50 <= r["step"] < fault]
    pre_loss, pre_grad = median_of(r["loss"] for r in pre), median_of(r["grad_norm"] for r in pre)
    after = [r for r in steps if r["step"] >= fault]
    nan = first_nonfinite(steps)
    cap = nan if nan is not None else 10**9
    expected, why, allowed = [], [], []
    if nan is not None:
        expected.append({"type": "nan_inf", "severity": "critical", "first_step": nan,
                         "last_step": nan})
        allowed += ["divergence", "grad_explosion", "loss_spike", "plateau", "update_ratio_high",
                    "dead_layer", "grad_vanishing", "gain_drift"]
        why.append(f"first non-finite loss/grad at step {nan}")
    spikes = _grad_spikes(after, pre_grad)
    why.append(f"loss {pre_loss:.3g}, grad norm {pre_grad:.3g} (medians of the 50 steps before "
               f"the fault); {len(spikes)} of the {GRAD_WINDOW} steps after it >= "
               f"{GRAD_SPIKE:g}x that grad norm")
    if shape == "burst":
        n = run["fault_params"]["burst"]
        peak = max(r["loss"] for r in after[:n])
        back = next((r["step"] for r in after[n:] if r["loss"] <= SPIKE_RATIO * pre_loss), None)
        why.append(f"{n} bad batches from step {fault}: loss up to {peak:.3g} "
                   f"({peak / pre_loss:.1f}x), back within {SPIKE_RATIO:g}x at step {back}")
        extra["returned_step"] = back
        if peak >= SPIKE_RATIO * pre_loss:
            expected.append({"type": "loss_spike", "severity": "warning", "first_step": fault,
                             "last_step": fault + n + 1})
        if len(spikes) >= GRAD_SPIKES:
            allowed.append("grad_explosion")
        return expected, why, allowed
    later = [r["loss"] for r in after[PERSIST_FROM:PERSIST_TO] if finite(r["loss"])]
    level = median_of(later) if later else float("inf")
    why.append(f"LR x{run['fault_params']['factor']:g} kept from step {fault}: median loss of "
               f"steps {fault + PERSIST_FROM}..{fault + PERSIST_TO - 1} {level:.3g} "
               f"({level / pre_loss:.2f}x)")
    if level >= PERSIST_RATIO * pre_loss:
        expected.append({"type": "divergence", "severity": "error", "first_step": fault,
                         "last_step": min(fault + PERSIST_TO, cap)})
    elif level >= BORDER_RATIO * pre_loss:  # a real but small rise: neither way is wrong
        allowed.append("divergence")
    if len(spikes) >= GRAD_SPIKES:
        expected.append({"type": "grad_explosion", "severity": "error", "first_step": fault,
                         "last_step": min(spikes[GRAD_SPIKES - 1] + 10, cap)})
    allowed += ["lr_jump", "loss_spike", "update_ratio_high", "clip_saturation", "dead_layer",
                "grad_vanishing", "gain_drift"]
    return expected, why, allowed


def label(path: Path) -> dict:
    records = read_records(path)
    run = records[0]["config"]
    steps = [r for r in records if r["kind"] == "step" and r.get("rank", 0) == 0]
    evals = [r for r in records if r["kind"] == "eval"]
    shape = path.name.split("_")[0].rstrip("0123456789")
    extra: dict = {}
    expected, why, allowed = _expected(run, steps, shape, extra)
    measured = allowed_warnings({**run, "layer_order": (records[0].get("model") or {}).get(
        "layer_order")}, steps, evals)
    exp_types = {e["type"] for e in expected}
    allowed = sorted((set(allowed) | set(measured)) - exp_types)
    return {"file": path.name, "shape": shape, "scenario": run["scenario"], "healthy": False,
            "half": half_of(path.name.split(".")[0]), "fault_step": run["fault_step"],
            "fault": run.get("fault"), "fault_params": run.get("fault_params", {}),
            "model": f"{run['arch']}, {run['optimizer']} lr {run['lr']:g}, batch "
                     f"{run['batch_size']}, clip {run.get('grad_clip')}, seed {run['seed']}",
            "steps_recorded": len(steps), **extra, "expected": expected, "allowed": allowed,
            "evidence": "; ".join(why),
            "notes": "; ".join(f"{t}: {measured[t]}" for t in sorted(measured)) or "none"}


def write_class_labels(directory: Path) -> None:
    labels = [label(p) for p in sorted(directory.glob("*.jsonl.gz"))]
    (directory / "labels.json").write_text(json.dumps(labels, indent=1) + "\n")
