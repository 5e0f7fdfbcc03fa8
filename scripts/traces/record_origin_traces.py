"""Record the root-cause traces of ``tests/traces/origin/``: where did a fault start?

Real PyTorch runs on CPU (one thread, fixed seeds) through the real client, exactly as
``record_traces.py`` makes its traces (the same in-memory capture stands in for the HTTP
sender, so every record is materialised by the production ``PendingStep`` code, with the
per-parameter norm gate and the forward finite sums). Default client configuration:
per-layer statistics every 25 steps, no activations, no histograms.

* ``nan_forward_gpt``: a 2-layer char-GPT (as ``healthy_act_gpt``), AdamW 3e-3, clip 1.0;
  at ``fault_step`` one element of ``blocks.1.mlp_fc``'s output is made NaN inside its
  forward (a forward hook of the script's own, ``prepend=True`` so it runs as part of the layer's
  forward, before any observer). The loss and every gradient go NaN; the page must name
  ``blocks.1.mlp_fc``, not the first or last parameter.
* ``lr_spike_gpt``: the same run without clipping; from ``fault_step`` on the lr is 30x.
  The gradients climb layer by layer until they overflow; the finding must name a layer
  whose norm had left its own band, at or after the spike.
* ``input_scale_mlp``: an MLP 32-256-256-10 on teacher data, SGD with momentum; from
  ``fault_step`` on the inputs arrive 100x too large (a normalisation step dropped from
  the data pipeline). The first Linear's gradient is ``delta x^T``, so it scales with the
  input and leaves its band first: the finding must name ``0.weight``.

    python -m scripts.traces.record_origin_traces        # writes tests/traces/origin/*.jsonl.gz
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from torch import nn

from monitor_client import WatchSettings
from scripts.traces.capture import monitor
from scripts.traces.record_traces import write
from scripts.traces.trace_models import PRINTABLE, CharGPT, char_data, teacher_data

OUT = Path(__file__).resolve().parents[2] / "tests" / "traces" / "origin"
FAULT_STEP = {"nan_forward_gpt": 120, "lr_spike_gpt": 150, "input_scale_mlp": 150}
ORIGIN_LAYER = "blocks.1.mlp_fc"


def _nan_output(module, args, output):
    out = output.clone()
    out[0, 0, 0] = float("nan")
    return out


def run_gpt(name: str, steps: int = 200) -> list[dict]:
    torch.manual_seed(7)
    data, _ = char_data()
    fault = FAULT_STEP[name]
    spike = name == "lr_spike_gpt"
    clip = None if spike else 1.0
    model = CharGPT(len(PRINTABLE), d=64, n_layers=2, heads=4, seq=64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    config = {"scenario": name, "fault_step": fault, "optimizer": "adamw", "lr": 3e-3,
              "batch_size": 16, "seq_len": 64, "total_steps": steps, "warmup_steps": 20,
              "grad_clip": clip,
              "fault": "lr x30" if spike else f"NaN in {ORIGIN_LAYER}'s forward output"}
    target = model.blocks[1].mlp_fc
    mon, cap = monitor(name, config)
    mon.watch(model, opt, grad_clip=clip, settings=WatchSettings(seq_len=64))
    gen = torch.Generator().manual_seed(8)
    status, bad = "completed", 0
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = 3e-3 * min(1.0, step / 20) * (30 if spike and step >= fault else 1)
        hook = (target.register_forward_hook(_nan_output, prepend=True)
                if not spike and step == fault else None)
        starts = torch.randint(0, len(data) - 65, (16,), generator=gen)
        batch = torch.stack([data[s:s + 65] for s in starts])
        loss = model.loss(batch[:, :-1], batch[:, 1:])
        if hook is not None:
            hook.remove()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss.detach(), tokens=16 * 64, samples=16)
        bad = bad + 1 if not math.isfinite(float(loss.detach())) else 0
        if bad >= 3:  # a few non-finite steps, then the job dies (as a real one would)
            status = "failed"
            break
    mon.close(status=status, error="loss is NaN" if status == "failed" else None)
    return cap.records


def run_mlp(name: str, steps: int = 260) -> list[dict]:
    torch.manual_seed(4)
    x_all, y_all = teacher_data(n=8192, d_in=32, classes=10, seed=4)
    fault = FAULT_STEP[name]
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    config = {"scenario": name, "fault_step": fault, "optimizer": "sgdm", "lr": 0.02,
              "batch_size": 128, "total_steps": steps, "warmup_steps": 0,
              "fault": "inputs x100 (normalisation dropped)"}
    mon, cap = monitor(name, config)
    mon.watch(model, opt)
    gen = torch.Generator().manual_seed(5)
    status, bad = "completed", 0
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(x_all), (128,), generator=gen)
        x = x_all[idx] * (100.0 if step >= fault else 1.0)
        loss = nn.functional.cross_entropy(model(x), y_all[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss.detach(), tokens=128, samples=128)
        bad = bad + 1 if not math.isfinite(float(loss.detach())) else 0
        if bad >= 3:
            status = "failed"
            break
    mon.close(status=status, error="loss is NaN" if status == "failed" else None)
    return cap.records


SCENARIOS = {
    "nan_forward_gpt": lambda: run_gpt("nan_forward_gpt"),
    "lr_spike_gpt": lambda: run_gpt("lr_spike_gpt"),
    "input_scale_mlp": lambda: run_mlp("input_scale_mlp"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", metavar="NAME",
                        help=f"record only these ({', '.join(SCENARIOS)}); default: all")
    only = parser.parse_args().only or list(SCENARIOS)
    if unknown := [name for name in only if name not in SCENARIOS]:
        parser.error(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
    torch.set_num_threads(1)
    for name in only:
        start = time.perf_counter()
        records = SCENARIOS[name]()
        path = write(name, records, OUT)
        gated = sum(1 for r in records if r.get("grad_norms"))
        print(f"{name}: {len(records)} records ({gated} with gated grad_norms), "
              f"{path.stat().st_size / 1024:.0f} KiB, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
