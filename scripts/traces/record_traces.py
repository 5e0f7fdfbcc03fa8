"""Record the labelled activation traces of ``tests/traces/`` from real training runs.

How they were made: each trace is a real PyTorch run on CPU (one thread, fixed seeds),
monitored by the real client: ``monitor_client.Monitor.watch(..., activations=True)``
measures gradients, updates and activation statistics with the same hooks, ``StatsPack``
and ``PendingStep`` code as in production; only the sender is swapped for an in-memory
capture, so records are materialised on the spot (``step_time`` therefore includes the
previous step's host copy, microseconds here) and written as gzip JSON Lines (docs/format.md).
Per-layer and activation statistics every ``EVERY`` steps (``layer_stats_every`` /
``activation_every`` in the run config).

Scenarios (fault mechanisms are plain tensor edits inside the training loop):

* ``healthy_act_mlp``: MLP 32-256-256-256-10 with nn.ReLU, AdamW 1e-3, synthetic data
  labelled by a fixed random teacher (as the public ``mlp-*`` traces), 400 steps.
* ``dead_relu_mlp``: the same run; at ``fault_step`` the bias of the second hidden Linear
  is shifted by -``shift`` (a bad update / bad init of the kind an LR spike produces): most
  of the second ReLU's units output zero for every input, and dead units get no gradient
  to come back.
* ``healthy_act_gpt``: a 2-layer pre-LayerNorm char-GPT (d64, nn.GELU in the MLP) on the
  CPython standard library's .py files as characters, AdamW 3e-3, clip 1.0, 300 steps.
* ``activation_blowup_gpt``: the same run; from ``fault_step`` on, every step multiplies
  block 1's MLP input weight by ``growth`` (a runaway weight scale): its GELU's inputs and
  outputs grow geometrically until the loss goes non-finite and the run ends failed.

* ``category_shift_mlp``: the MLP run with per-category evals (the teacher's classes in
  three groups a, b, c; each eval sample weighted once by ``CategoryLoss``); from
  ``fault_step`` on, the training labels of category c are rotated within c (a data
  pipeline bug that mislabels one source): c's eval loss turns up while a and b improve.

Every run also carries gradient/weight distributions (``hist_every``) and per-category eval
losses every ``EVAL_EVERY`` steps (MLP: the class groups; GPT: the stdlib module a
validation sample starts in).

``labels.json`` windows come from each recording's measured activations, not from the
detectors: for dead units, from the first reading after the fault whose dead fraction is
at least 0.5 to the end of the run; for the blow-up, from the first reading after the
fault whose max-abs is 10x the pre-fault median of that module, to the first non-finite
step (a precursor must come before the NaN).

    python -m scripts.traces.record_traces            # writes tests/traces/*.jsonl.gz + labels.json
    python -m scripts.traces.record_traces --corpus   # the precision corpus, see corpus_runs.py
    python -m scripts.traces.record_traces --classes  # spike/divergence/explosion, classes_runs.py
    python -m scripts.traces.record_traces --shapes   # run shapes (RL, AMP, MoE, ...), shapes_runs.py
"""

from __future__ import annotations

import bisect
import gzip
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from monitor_client import CategoryLoss, WatchSettings
from scripts.traces.capture import monitor
from scripts.traces.trace_labels import write_labels
from scripts.traces.trace_models import PRINTABLE, CharGPT, char_data_by_file, teacher_data

OUT = Path(__file__).resolve().parents[2] / "tests" / "traces"
CORPUS = OUT / "corpus"
CLASSES = OUT / "classes"
SHAPES = OUT / "shapes"
EVERY = 5
EVAL_EVERY = 25
# MLP eval categories: the teacher's classes in three groups.
GROUPS = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b", 6: "c", 7: "c", 8: "c", 9: "c"}


def run_mlp(name: str, fault_step: int | None, shift: float = 3.0, steps: int = 400,
            fault: str = "dead_units") -> list:
    torch.manual_seed(4)
    x_all, y_all = teacher_data(n=8192 + 1024, d_in=32, classes=10, seed=4)
    (x_all, x_val), (y_all, y_val) = x_all.split([8192, 1024]), y_all.split([8192, 1024])
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    config = {"scenario": fault if fault_step else "healthy", "fault_step": fault_step,
              "fault": MLP_FAULTS[fault] if fault_step else None,
              "fault_params": ({"shift": -shift} if fault == "dead_units" else
                               {"category": "c"}) if fault_step else {},
              "optimizer": "adamw", "lr": 1e-3, "batch_size": 128, "total_steps": steps,
              "warmup_steps": 0, "layer_stats_every": EVERY, "activation_every": EVERY,
              "hist_every": EVERY, "eval_every": EVAL_EVERY}
    mon, cap = monitor(name, config)
    mon.watch(model, opt,
              settings=WatchSettings(layer_stats_every=EVERY, activations=True,
                                     activation_every=EVERY, hist_every=EVERY))
    val_groups = [GROUPS[int(c)] for c in y_val]
    gen = torch.Generator().manual_seed(5)
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(x_all), (128,), generator=gen)
        if step == fault_step and fault == "dead_units":
            with torch.no_grad():
                model[2].bias -= shift
        targets = y_all[idx]
        if fault_step and step >= fault_step and fault == "category_shift":
            targets = _relabel_group_c(targets)
        loss = nn.functional.cross_entropy(model(x_all[idx]), targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss.detach(), tokens=128, samples=128)
        if step % EVAL_EVERY == 0:
            _eval_mlp(mon, model, step, x_val, y_val, val_groups)
    mon.close()
    return cap.records


MLP_FAULTS = {
    "dead_units": "bias shift of layer 2 (Linear 256->256)",
    "category_shift": "training labels of category c (teacher classes 6-9) rotated within c",
}


def _relabel_group_c(y: torch.Tensor) -> torch.Tensor:
    """Category c's labels rotated (6->7->8->9->6): its data now teaches the wrong answer."""
    in_c = y >= 6
    return torch.where(in_c, 6 + (y - 6 + 1) % 4, y)


@torch.no_grad()
def _eval_mlp(mon, model, step, x_val, y_val, groups) -> None:
    model.eval()
    cats = CategoryLoss()
    cats.add(nn.functional.cross_entropy(model(x_val), y_val, reduction="none"), groups)
    model.train()
    mon.log_eval(step, val_loss=cats.overall(), metrics=cats.metrics())


@torch.no_grad()
def _eval_gpt(mon, model, step, val, files, gen) -> None:
    model.eval()
    cats = CategoryLoss()
    offsets = [start for start, _ in files]
    for _ in range(4):
        starts = torch.randint(0, len(val) - 65, (16,), generator=gen)
        batch = torch.stack([val[s:s + 65] for s in starts])
        logits = model(batch[:, :-1])
        tok = nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
        names = [files[bisect.bisect_right(offsets, int(s)) - 1][1] for s in starts]
        cats.add(tok, names)
    model.train()
    mon.log_eval(step, val_loss=cats.overall(), metrics=cats.metrics())


def run_gpt(name: str, fault_step: int | None, growth: float = 1.15, steps: int = 300) -> list:
    torch.manual_seed(7)
    data, files = char_data_by_file()
    split = int(0.9 * len(data))
    data, val = data[:split], data[split:]
    ends = [start for start, _ in files[1:]] + [math.inf]
    val_files = [(max(start - split, 0), stem)
                 for (start, stem), end in zip(files, ends, strict=True) if end > split]
    model = CharGPT(len(PRINTABLE), d=64, n_layers=2, heads=4, seq=64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    config = {"scenario": "activation_blowup" if fault_step else "healthy",
              "fault_step": fault_step,
              "fault": "block 1 mlp_fc weight x growth every step" if fault_step else None,
              "fault_params": {"growth": growth} if fault_step else {}, "optimizer": "adamw",
              "lr": 3e-3, "batch_size": 16, "seq_len": 64, "total_steps": steps,
              "warmup_steps": 20, "grad_clip": 1.0, "layer_stats_every": EVERY,
              "activation_every": EVERY, "hist_every": EVERY, "eval_every": EVAL_EVERY}
    mon, cap = monitor(name, config)
    mon.watch(model, opt, grad_clip=1.0,
              settings=WatchSettings(seq_len=64, layer_stats_every=EVERY, activations=True,
                                     activation_every=EVERY, hist_every=EVERY))
    gen, eval_gen = torch.Generator().manual_seed(8), torch.Generator().manual_seed(9)
    status = "completed"
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = 3e-3 * min(1.0, step / 20)
        if fault_step and step >= fault_step:
            with torch.no_grad():
                model.blocks[1].mlp_fc.weight.mul_(growth)
        starts = torch.randint(0, len(data) - 65, (16,), generator=gen)
        batch = torch.stack([data[s:s + 65] for s in starts])
        loss = model.loss(batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss.detach(), tokens=16 * 64, samples=16)
        if step % EVAL_EVERY == 0:
            _eval_gpt(mon, model, step, val, val_files, eval_gen)
        # A few non-finite steps, then the job dies (as a real one would).
        if not math.isfinite(float(loss.detach())) and step >= (fault_step or 0) + 3:
            status = "failed"
            break
    mon.close(status=status, error="loss is NaN" if status == "failed" else None)
    return cap.records


def write(name: str, records: list, out: Path = OUT) -> Path:
    from monitor_agent.records import wire

    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=9) as fh:
        for rec in records:
            fh.write(wire.dumps(_rounded(rec)) + b"\n")
    return path


def _rounded(obj):
    """7 significant digits, as the public traces: float32 statistics carry no more. Wall
    clock ``time`` keeps 0.1 ms (as the public traces): at 7 digits a Unix time moves in
    1000 s jumps, which replays as a stall and breaks the rank interleaving of DDP traces
    (the corpus and class recordings were written before this and carry such times)."""
    if isinstance(obj, float):
        return float(f"{obj:.7g}") if math.isfinite(obj) else obj
    if isinstance(obj, dict):
        return {k: round(v, 4) if k == "time" and isinstance(v, float) else _rounded(v)
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


SCENARIOS = {
    "healthy_act_mlp": lambda: run_mlp("healthy_act_mlp", None),
    "dead_relu_mlp": lambda: run_mlp("dead_relu_mlp", 200),
    "healthy_act_gpt": lambda: run_gpt("healthy_act_gpt", None),
    "activation_blowup_gpt": lambda: run_gpt("activation_blowup_gpt", 150),
    "category_shift_mlp": lambda: run_mlp("category_shift_mlp", 200, fault="category_shift"),
}


def record_corpus(only: list[str], shard: str) -> None:
    """The precision corpus (``corpus_runs.py``): one file per run, then its labels."""
    from scripts.traces.corpus_labels import write_corpus_labels
    from scripts.traces.corpus_runs import SPECS, run

    _record(SPECS, run, CORPUS, write_corpus_labels, only, shard)


def record_classes(only: list[str], shard: str) -> None:
    """The class recordings (``classes_runs.py``): one file per run, then their labels."""
    from scripts.traces.classes_labels import write_class_labels
    from scripts.traces.classes_runs import SPECS
    from scripts.traces.corpus_runs import run

    _record(SPECS, run, CLASSES, write_class_labels, only, shard)


def record_shapes(only: list[str], shard: str) -> None:
    """The shape recordings (``shapes_runs.py``): one file per run, then their labels."""
    from scripts.traces.shapes_labels import write_shape_labels
    from scripts.traces.shapes_runs import SPECS, run

    _record(SPECS, run, SHAPES, write_shape_labels, only, shard)


def _record(specs: list, run: Callable, out_dir: Path, label: Callable[[Path], None],
            only: list[str], shard: str) -> None:
    """Record this shard's share of ``specs`` (``index/count``; ``only`` names some), one
    file each in ``out_dir``; the labels only when one shard recorded them all."""
    index, count = (int(v) for v in shard.split("/"))
    todo = [s for i, s in enumerate(specs) if i % count == index and (not only or s.name in only)]
    for spec in todo:
        start = time.perf_counter()
        path = write(spec.name, run(spec, monitor), out_dir)
        print(f"{spec.name}: {path.stat().st_size / 1024:.0f} KiB, "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    if count == 1:
        label(out_dir)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", action="store_true", help="record tests/traces/corpus")
    parser.add_argument("--only", nargs="*", default=[], help="corpus runs by name")
    parser.add_argument("--shard", default="0/1", help="I/N: every N-th corpus run from I")
    parser.add_argument("--classes", action="store_true", help="record tests/traces/classes")
    parser.add_argument("--shapes", action="store_true", help="record tests/traces/shapes")
    parser.add_argument("--labels", action="store_true", help="only (re)write corpus labels "
                        "(with --shapes: the shape labels)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.labels and args.shapes:
        from scripts.traces.shapes_labels import write_shape_labels

        write_shape_labels(SHAPES)
        return
    if args.labels:
        from scripts.traces.corpus_labels import write_corpus_labels

        write_corpus_labels(CORPUS)
        return
    if args.corpus:
        record_corpus(args.only, args.shard)
        return
    if args.classes:
        record_classes(args.only, args.shard)
        return
    if args.shapes:
        record_shapes(args.only, args.shard)
        return
    recorded = {}
    for name, fn in SCENARIOS.items():
        start = time.perf_counter()
        records = fn()
        path = write(name, records)
        recorded[name] = records
        print(f"{name}: {len(records)} records, {path.stat().st_size / 1024:.0f} KiB, "
              f"{time.perf_counter() - start:.1f} s")
    write_labels(OUT / "labels.json", recorded)


if __name__ == "__main__":
    main()
