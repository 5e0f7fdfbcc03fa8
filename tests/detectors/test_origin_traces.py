"""Where a fault started, on real recorded runs (scripts/traces/record_origin_traces.py): the page
names the layer whose forward output went NaN, and the layer that left its own band first
in an LR spike and in an input-scale bug."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from detector_harness import load_records, replay_records

from monitor_agent.detectors.support.layer_bands import BAND_RATIO

ORIGIN = Path(__file__).resolve().parents[1] / "traces" / "origin"


def _trace(name: str):
    records = load_records(ORIGIN / f"{name}.jsonl.gz")
    run = next(r for r in records if r.kind == "run")
    return records, run.config["fault_step"], replay_records(records)


def _first(findings, ftype):
    return next(f for f in findings if f.type == ftype and f.layer is None)


def test_a_nan_born_in_one_layers_forward_pages_that_layer():
    records, fault, findings = _trace("nan_forward_gpt")
    f = _first(findings, "nan_inf")
    assert f.step == fault
    assert f.evidence["pass"] == "forward" and f.evidence["origin"] == "blocks.1.mlp_fc"
    assert "forward pass: the output of blocks.1.mlp_fc went non-finite first" in f.message
    # The gradients could not have said it: every one of them is NaN on that step.
    step = next(r for r in records if r.kind == "step" and r.step == fault)
    assert np.isnan(step.layer_grads.stats["grad_norm"]).all()


def _pre_fault_median(records, fault: int, layer: str) -> float:
    values = []
    for r in records:
        table = r.layer_grads if r.kind == "step" and r.step < fault else None
        if table is not None and layer in table.names:
            values.append(table.stats["grad_norm"][table.names.index(layer)])
    return float(np.median(values))


def _reading(records, step: int, layer: str) -> float:
    rec = next(r for r in records if r.kind == "step" and r.step == step)
    return float(rec.layer_grads.stats["grad_norm"][rec.layer_grads.names.index(layer)])


@pytest.mark.parametrize("ftype", ["grad_explosion", "divergence"])
def test_an_lr_spike_names_a_layer_that_left_its_band_after_the_spike(ftype):
    records, fault, findings = _trace("lr_spike_gpt")
    f = _first(findings, ftype)
    layer, left = f.evidence["first_layer_out"], f.evidence["first_layer_out_step"]
    assert layer and fault <= left <= f.step
    assert f"first layer out of its band: {layer} (step {left}" in f.message
    # Checked against the raw recording, not the detector's own state.
    assert _reading(records, left, layer) >= BAND_RATIO * _pre_fault_median(records, fault, layer)


@pytest.mark.parametrize("ftype", ["grad_explosion", "divergence"])
def test_an_input_scale_bug_names_the_input_layer(ftype):
    records, fault, findings = _trace("input_scale_mlp")
    f = _first(findings, ftype)
    assert f.evidence["first_layer_out"] == "0.weight"
    assert f.evidence["first_layer_out_step"] == fault
    # On the fault step every weight's gradient grew, the input layer's the most.
    ratios = {n: _reading(records, fault, n) / _pre_fault_median(records, fault, n)
              for n in ("0.weight", "2.weight", "4.weight")}
    assert max(ratios, key=ratios.get) == "0.weight"


def test_the_client_sent_per_parameter_norms_only_when_they_mattered():
    for name in ("nan_forward_gpt", "lr_spike_gpt", "input_scale_mlp"):
        records, fault, _ = _trace(name)
        steps = [r for r in records if r.kind == "step"]
        gated = [r.step for r in steps if r.grad_norms is not None]
        assert fault in gated or any(r.step == fault and r.layers is not None for r in steps)
        assert len(gated) < 0.2 * len(steps), gated
