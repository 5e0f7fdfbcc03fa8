"""The step guard judged on precision: how many healthy steps it skips, per 10,000.

A skipped step is a batch of training lost, so the guard (``watch(..., guard=True)``,
client ``_guard.py``) must almost never skip a healthy one; its target is at most 1 false
skip per 10,000 healthy steps. Measured two ways:

* **recorded healthy runs**: every healthy step of the recorded traces (``tests/traces``:
  the public healthy runs, the precision corpus, the class recordings and the faulty
  recordings up to their fault step, the activation recordings), 144 runs of MLPs, CNNs,
  GRUs, LSTMs, ViTs and character GPTs under 12 optimizers. Each run's recorded pre-clip
  gradient norms are replayed, in order, through the guard's own decision (``judge``, the
  code that runs on the device), so a skipped norm stays out of the window exactly as it
  would have in the run;
* **healthy runs of its own**: real CPU training runs through the real client (``GradStats``
  and ``StepGuard`` hooked on the optimizer, as ``watch(..., guard=True)`` does): an MLP
  regression with fused AdamW (the shape the issue found 2 false skips in), the same with
  SGD + momentum and with foreach Adam, a small CNN classifier with AdamW; then each again
  with three injected corrupt batches (labels x1000) to show the spikes are still skipped.

It also prints how the recorded single-batch faults fare (the corrupt or random-label
batches of ``tests/traces``): the guard is not meant to catch a batch 2-3x as hard as usual
(the loss-spike detector reports those), only the ones far outside the run's own
step-to-step noise and at least 4.5x the norm's level; a run whose norm swings 30x from one
step to the next (the recorded CNNs) keeps even a 160x batch.

Run: ``python -m bench.guard_precision [--own-steps 1000] [--details]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from monitor_agent.records import wire
from monitor_client._guard import StepGuard, judge, level_of, new_window
from monitor_client._stats import GradStats
from monitor_client.settings import GuardSettings

TRACES = Path(__file__).resolve().parents[1] / "tests" / "traces"
LABELLED = ("public", "corpus", "classes")  # directories with a labels.json
UNLABELLED_HEALTHY = ("healthy_act_mlp.jsonl.gz", "healthy_act_gpt.jsonl.gz")
# Recorded faults that are one bad batch, or a burst of them (labels.json ``fault``/``shape``).
SPIKE_WORDS = ("bad_batch", "burst", "inf_input")


@dataclass
class Tally:
    runs: int = 0
    steps: int = 0
    skips: list[tuple[str, int, float, float]] = field(default_factory=list)  # name, step, norm, x level

    @property
    def per_10k(self) -> float:
        return 1e4 * len(self.skips) / self.steps if self.steps else 0.0


def healthy_norms(root: Path = TRACES) -> Iterator[tuple[str, list[tuple[int, float]]]]:
    """(name, [(step, pre-clip grad norm)]) of every healthy stretch of the recorded runs:
    healthy runs whole, faulty ones up to their fault step; rank 0, GradScaler overflow
    steps left out (the scaler skipped them, not the guard)."""
    for directory in LABELLED:
        for label in json.loads((root / directory / "labels.json").read_text()):
            fault = label.get("fault_step")
            if not label.get("healthy") and fault is None:
                continue
            yield f"{directory}/{label['file']}", _norms(root / directory / label["file"], fault)
    for name in UNLABELLED_HEALTHY:
        yield name, _norms(root / name, None)


def _norms(path: Path, before: int | None) -> list[tuple[int, float]]:
    out = []
    for obj in wire.iter_trace(path):
        if obj.get("kind") != "step" or obj.get("rank", 0) != 0 or obj.get("skipped"):
            continue
        if before is not None and obj["step"] >= before:
            break
        norm = obj.get("grad_norm")
        if norm is not None:
            out.append((int(obj["step"]), float(norm)))
    return out


def replay(norms: list[tuple[int, float]], config: GuardSettings) -> list[tuple[int, float, float]]:
    """The steps the guard's decision skips on a recorded run: (step, norm, x its level)."""
    window, pos = new_window(config)
    skipped = []
    for step, norm in norms:
        level = float(level_of(window, pos, config))
        skip, _ = judge(window, pos, torch.tensor(norm), config)
        if bool(skip) and math.isfinite(norm):
            skipped.append((step, norm, norm / level))
    return skipped


def former_band(norms: list[tuple[int, float]]) -> list[int]:
    """The steps the guard's former rule (before issue 31) skipped: norm above median + 6 x
    max(1.4826 x MAD, 0.1 x median) of the last 128 taken norms, once 64 are in."""
    taken: list[float] = []
    skipped = []
    for step, norm in norms:
        if not math.isfinite(norm):
            skipped.append(step)
            continue
        if len(taken) >= 64:
            window = torch.tensor(taken[-128:])
            median = float(window.median())
            sigma = max(1.4826 * float((window - median).abs().median()), 0.1 * median)
            if norm > median + 6 * sigma:
                skipped.append(step)
                continue
        taken.append(norm)
    return skipped


def recorded(config: GuardSettings, root: Path = TRACES) -> Tally:
    tally = Tally()
    for name, norms in healthy_norms(root):
        tally.runs += 1
        tally.steps += len(norms)
        tally.skips += [(name, s, n, r) for s, n, r in replay(norms, config)]
    return tally


def recorded_spikes(config: GuardSettings, root: Path = TRACES) -> list[tuple[str, int, float, bool]]:
    """Each recorded single-batch fault's first step: (trace, step, x level, skipped)."""
    out = []
    for directory in LABELLED:
        for label in json.loads((root / directory / "labels.json").read_text()):
            what = f"{label.get('fault', '')} {label.get('shape', '')} {label.get('scenario', '')}"
            fault = label.get("fault_step")
            if fault is None or not any(w in what for w in SPIKE_WORDS):
                continue
            norms = _norms(root / directory / label["file"], fault + 1)
            window, pos = new_window(config)
            for step, norm in norms:
                level = float(level_of(window, pos, config))
                skip, _ = judge(window, pos, torch.tensor(norm), config)
                if step == fault:
                    out.append((f"{directory}/{label['file']}", step, norm / level, bool(skip)))
    return out


# -- healthy runs of its own, through the real client ----------------------------------------

SHAPES = ("mlp_adamw_fused", "mlp_sgd_momentum", "mlp_adam_foreach", "cnn_adamw")


def own_run(shape: str, steps: int, seed: int, spikes: tuple[int, ...] = (),
            config: GuardSettings | None = None) -> list[int]:
    """Train ``shape`` for ``steps`` steps with the guard on; the steps it skipped."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    if shape.startswith("cnn"):
        model: torch.nn.Module = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(16, 10))
        teacher = torch.randn(10, 1, 12, 12, generator=gen)
    else:
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
        target = torch.randn(16, 1, generator=gen)
    params = model.parameters()
    opt = {"mlp_adamw_fused": lambda: torch.optim.AdamW(params, lr=3e-3, fused=True),
           "mlp_sgd_momentum": lambda: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
           "mlp_adam_foreach": lambda: torch.optim.Adam(params, lr=1e-3, foreach=True),
           "cnn_adamw": lambda: torch.optim.AdamW(params, lr=2e-3)}[shape]()
    stats = GradStats(model, opt, grad_clip=1.0).attach()
    guard = StepGuard(stats, opt, config or GuardSettings()).attach()
    skipped = []
    for step in range(1, steps + 1):
        if shape.startswith("cnn"):
            x = torch.randn(32, 1, 12, 12, generator=gen)
            y = (x.flatten(1) @ teacher.flatten(1).T).argmax(dim=1)
            if step in spikes:
                x = x * 1e3  # a corrupt batch: inputs x1000
            loss = torch.nn.functional.cross_entropy(model(x), y)
        else:
            x = torch.randn(128, 16, generator=gen)
            y = x @ target + 0.1 * torch.randn(128, 1, generator=gen)
            if step in spikes:
                y = y * 1e3  # a corrupt batch: labels x1000
            loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        pack = stats.take()
        guard.add_to(pack)
        if pack.decode(pack.vector().tolist()).get("skip_reason"):
            skipped.append(step)
    guard.detach()
    stats.detach()
    return skipped


def own(steps: int, seeds: tuple[int, ...] = (1, 2, 3), config: GuardSettings | None = None
        ) -> tuple[Tally, dict[str, tuple[tuple[int, ...], list[int]]]]:
    """Healthy runs of each shape and seed, then each shape once with three spikes."""
    tally = Tally()
    for shape in SHAPES:
        for seed in seeds:
            tally.runs += 1
            tally.steps += steps
            tally.skips += [(f"{shape} seed {seed}", s, float("nan"), float("nan"))
                            for s in own_run(shape, steps, seed, config=config)]
    spiked = {}
    for shape in SHAPES:
        spikes = (steps // 3, steps // 2, 2 * steps // 3)
        spiked[shape] = (spikes, own_run(shape, steps, 7, spikes, config=config))
    return tally, spiked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--own-steps", type=int, default=1000)
    parser.add_argument("--details", action="store_true", help="list every false skip")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = GuardSettings()
    print(f"step guard: skips a norm k={config.k:g} noise sigmas of its log's step-to-step "
          f"change over {config.window} steps (at least {config.floor:g}: nothing under "
          f"{math.exp(config.k * config.floor):.1f}x) above its level (median of the last "
          f"{config.level} steps); judged after {config.min_history}")
    t0 = time.perf_counter()
    rec = recorded(config)
    print(f"\nrecorded healthy runs: {rec.runs} runs, {rec.steps} healthy steps, "
          f"{len(rec.skips)} false skips = {rec.per_10k:.2f} per 10,000 healthy steps "
          f"(target <= 1) [{time.perf_counter() - t0:.0f} s]")
    for name, step, norm, ratio in rec.skips if args.details or len(rec.skips) <= 10 else []:
        print(f"  {name} step {step}: grad norm {norm:.3g} = {ratio:.1f}x its level")
    former = sum(len(former_band(norms)) for _, norms in healthy_norms())
    print(f"  for comparison, the band it replaced (6 robust sigmas of the norm itself, sigma "
          f"at least 0.1 x the median) skips {former} of them = "
          f"{1e4 * former / rec.steps:.0f} per 10,000")
    t0 = time.perf_counter()
    mine, spiked = own(args.own_steps, config=config)
    print(f"\nown healthy runs (real client, CPU): {mine.runs} runs x {args.own_steps} steps, "
          f"{len(mine.skips)} false skips = {mine.per_10k:.2f} per 10,000 "
          f"[{time.perf_counter() - t0:.0f} s]")
    for name, step, _, _ in mine.skips:
        print(f"  {name} step {step}")
    for shape, (spikes, skipped) in spiked.items():
        print(f"  {shape} with corrupt batches at {list(spikes)}: skipped {skipped}")
    total = Tally(rec.runs + mine.runs, rec.steps + mine.steps, rec.skips + mine.skips)
    print(f"\nall healthy steps: {total.steps}, false skips {len(total.skips)} = "
          f"{total.per_10k:.2f} per 10,000")
    faults = recorded_spikes(config)
    caught = [f for f in faults if f[3]]
    big = [f for f in faults if f[2] >= math.exp(config.k * config.floor)]
    print(f"\nrecorded single-batch faults (first bad step): {len(caught)} of {len(faults)} "
          f"skipped; {len(big)} were >= {math.exp(config.k * config.floor):.1f}x the level "
          f"({sum(f[3] for f in big)} of those skipped)")
    if args.details:
        for name, step, ratio, skip in faults:
            print(f"  {name} step {step}: {ratio:.1f}x level, {'skipped' if skip else 'taken'}")


if __name__ == "__main__":
    main()
