"""A tiny character-level GPT trained on CPU on the Python standard library's own source,
monitored by ``monitor_client``, with optional injected faults: what ``monitor-agent demo``
trains. It lives in the package so the demo runs from an installed wheel (it needs
``torch`` and ``monitor-client`` beside it); ``examples/train_gpt.py`` runs it from a
checkout.

    python -m monitor_agent.tools.demo_gpt --url http://127.0.0.1:9400 --steps 300 \\
        --inject nan --inject-step 200 --progress

Faults (``--inject``), from ``--inject-step`` on:
  nan           one batch carries an infinite activation: loss, gradients and then the
                weights become NaN. Like most real scripts we keep going for a few steps;
                after ``--nan-patience`` consecutive non-finite losses (default 10) training
                stops, the ``end`` record says ``failed`` and the exit status is 1.
  lr-spike      the learning rate is multiplied by 30.
  frozen-layer  the last block's MLP gets learning rate 0 (its update norm becomes 0).
  slow-data     the data loader sleeps 40 ms per batch.
  leak          each step's graph is kept alive (retain_graph + a list): memory climbs.
  none          a healthy run.

The loop also obeys the sidecar: when an alert rule with ``action: stop`` fires (e.g. on
repeated NaN, see ``monitor_agent/default_rules.yaml``) it stops at once and the run ends
``stopped``; ``action: checkpoint`` saves the model to ``--checkpoint-dir``.

``--progress`` prints ``step N/M loss X`` per step (for progress bars); ``--quiet`` prints
nothing else. Exit status: 0 completed, 1 stopped on NaN, 3 stopped by the monitor.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import monitor_client
from monitor_agent.tools import ToolError

VOCAB = ["\t", "\n"] + [chr(c) for c in range(32, 127)]
FAULTS = ("none", "nan", "lr-spike", "frozen-layer", "slow-data", "leak")


class NonFiniteLoss(ToolError):
    """Training stopped because the loss stayed NaN/inf."""


class StoppedByMonitor(ToolError):
    """An alert rule of the sidecar asked this run to stop."""


def load_text(max_chars: int = 1_500_000) -> tuple[torch.Tensor, list[tuple[int, str]]]:
    """The stdlib's top-level .py files as character ids (unknown characters -> '?'), and
    where each file starts (offset, module name): the eval's categories."""
    index = {c: i for i, c in enumerate(VOCAB)}
    unknown = index["?"]
    parts, starts, total = [], [], 0
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        starts.append((total, path.stem))
        total += len(text)
        if total >= max_chars:
            break
    text = "".join(parts)[:max_chars]
    return torch.tensor([index.get(c, unknown) for c in text], dtype=torch.long), starts


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, bias=False)
        self.attn_qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn_proj = nn.Linear(d, d, bias=False)
        self.ln_2 = nn.LayerNorm(d, bias=False)
        self.mlp_fc = nn.Linear(d, 4 * d, bias=False)
        self.mlp_proj = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.attn_qkv(self.ln_1(x)).view(b, t, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x))))


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)  # GPT-2's initialisation


class CharGPT(nn.Module):
    """Pre-LayerNorm decoder-only transformer (the shape of the shared traces' char-gpt)."""

    def __init__(self, vocab: int, d_model: int, n_layers: int, heads: int, seq_len: int):
        super().__init__()
        self.n_layers, self.d_model = n_layers, d_model  # read by the client for MFU
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model, bias=False)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.poison = False
        self.apply(_init_weights)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor,
                reduction: str = "mean") -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        if self.poison:  # the injected bad batch: one infinite activation
            x = x.clone()
            x[0, 0, 0] = math.inf
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1),
                               reduction=reduction)
        return loss if reduction == "mean" else loss.view(targets.shape)


def batches(data: torch.Tensor, args: argparse.Namespace, gen: torch.Generator,
            state: dict):
    while True:
        if state["slow"]:
            time.sleep(0.04)
        ix = torch.randint(len(data) - args.seq_len - 1, (args.batch_size,), generator=gen)
        x = torch.stack([data[i:i + args.seq_len] for i in ix])
        y = torch.stack([data[i + 1:i + args.seq_len + 1] for i in ix])
        yield x, y


def set_lr(opt: torch.optim.Optimizer, args: argparse.Namespace, step: int,
           state: dict) -> None:
    """Linear warm-up, cosine to 0.1x; the fault multipliers apply from this very step."""
    if step <= args.warmup:
        factor = step / args.warmup
    else:
        progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        factor = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    lr = args.lr * factor * state["lr_mult"]
    opt.param_groups[0]["lr"] = lr
    opt.param_groups[1]["lr"] = 0.0 if state["frozen"] else lr


def build(args: argparse.Namespace, state: dict):
    torch.manual_seed(args.seed)
    model = CharGPT(len(VOCAB), args.d_model, args.n_layers, 4, args.seq_len)
    last_mlp = {f"blocks.{args.n_layers - 1}.mlp_fc.weight",
                f"blocks.{args.n_layers - 1}.mlp_proj.weight"}
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if n not in last_mlp]},
              {"params": [p for n, p in named if n in last_mlp]}]
    return model, torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)


def files_from(files: list[tuple[int, str]], offset: int) -> list[tuple[int, str]]:
    """The files of ``files`` that reach past ``offset``, with starts relative to it."""
    ends = [start for start, _ in files[1:]] + [math.inf]
    return [(max(start - offset, 0), name)
            for (start, name), end in zip(files, ends, strict=True) if end > offset]


@torch.no_grad()
def evaluate(model: CharGPT, val: torch.Tensor, files: list[tuple[int, str]], args,
             gen) -> tuple[float | None, dict[str, float]]:
    """Validation loss, overall and per source module (the module a sample starts in)."""
    model.eval()
    cats = monitor_client.CategoryLoss()
    offsets = [start for start, _ in files]
    for _ in range(4):
        ix = torch.randint(len(val) - args.seq_len - 1, (args.batch_size,), generator=gen)
        x = torch.stack([val[i:i + args.seq_len] for i in ix])
        y = torch.stack([val[i + 1:i + args.seq_len + 1] for i in ix])
        names = [files[bisect.bisect_right(offsets, int(i)) - 1][1] for i in ix]
        cats.add(model(x, y, reduction="none"), names)
    model.train()
    return cats.overall(), cats.metrics()


def measure_peak_flops(n: int = 512, repeats: int = 5) -> float:
    """Best of a few float32 matmuls: the CPU's practical peak, for an honest MFU."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def apply_fault(args, step: int, state: dict, model: CharGPT) -> None:
    active = args.inject != "none" and step >= args.inject_step
    model.poison = active and args.inject == "nan" and step == args.inject_step
    state["lr_mult"] = 30.0 if active and args.inject == "lr-spike" else 1.0
    state["frozen"] = active and args.inject == "frozen-layer"
    state["slow"] = active and args.inject == "slow-data"
    state["leak"] = active and args.inject == "leak"


def train(args: argparse.Namespace, mon: monitor_client.Monitor) -> None:
    state = {"lr_mult": 1.0, "frozen": False, "slow": False, "leak": False}
    data, files = load_text()
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    val_files = files_from(files, split)
    model, opt = build(args, state)
    peak = args.peak_flops if args.peak_flops > 0 else measure_peak_flops()
    # the Monitor's WatchSettings (--layer-stats-every), with what only the loop knows
    mon.watch(model, opt, grad_clip=args.grad_clip, settings=dataclasses.replace(
        mon.settings.watch, seq_len=args.seq_len, peak_flops=peak))
    gen, leaked, bad = torch.Generator().manual_seed(args.seed), [], 0
    stream = mon.timed(batches(train_data, args, gen, state))
    for step in range(1, args.steps + 1):
        apply_fault(args, step, state, model)
        x, y = next(stream)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward(retain_graph=state["leak"])
        if state["leak"]:
            leaked.append(loss)
        set_lr(opt, args, step, state)
        opt.step()  # the client's hooks measure and clip here
        value = loss.item()
        mon.log_step(step, loss=value, tokens=x.numel(), samples=x.shape[0])
        if args.progress:
            print(f"step {step}/{args.steps} loss {value:.4f}", flush=True)
        obey_monitor(args, mon, model, step)
        bad = bad + 1 if not math.isfinite(value) else 0
        if bad >= args.nan_patience:
            raise NonFiniteLoss(f"loss non-finite for {bad} consecutive steps (step {step})")
        if step % args.eval_every == 0 or step == args.steps:
            val_loss, per_module = evaluate(model, val_data, val_files, args, gen)
            mon.log_eval(step, val_loss=val_loss, metrics=per_module)


def obey_monitor(args, mon: monitor_client.Monitor, model: CharGPT, step: int) -> None:
    """Actions of the sidecar's alert rules: save now, or stop now."""
    if mon.should_checkpoint() and args.checkpoint_dir:
        path = Path(args.checkpoint_dir) / f"step{step}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
    if mon.should_stop():
        raise StoppedByMonitor(f"{mon.stop_reason()} (stopped after step {step})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("MONITOR_AGENT_URL", "http://127.0.0.1:9400"))
    p.add_argument("--run-id", default=None)
    p.add_argument("--project", default="train-gpt")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--inject", choices=FAULTS, default="none")
    p.add_argument("--inject-step", type=int, default=200)
    p.add_argument("--layer-stats-every", type=int, default=10)
    p.add_argument("--nan-patience", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--peak-flops", type=float, default=0.0,
                   help="FLOP/s of this CPU for MFU (0: measure a float32 matmul)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--spool-dir", default=None)
    p.add_argument("--checkpoint-dir", default=None, help="where a 'checkpoint' action saves")
    p.add_argument("--progress", action="store_true", help="print 'step N/M loss X' lines")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    skip = ("url", "run_id", "spool_dir", "checkpoint_dir")
    config = {k: v for k, v in vars(args).items() if k not in skip}
    config.update(optimizer="adamw", total_steps=args.steps, warmup_steps=args.warmup)
    mon = monitor_client.Monitor(url=args.url, project=args.project, config=config,
                                 run_id=args.run_id, settings=monitor_client.MonitorSettings(
                                     spool_dir=args.spool_dir, watch=monitor_client.WatchSettings(
                                         layer_stats_every=args.layer_stats_every)))
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    say(f"run {mon.run_id}: {args.steps} steps, fault {args.inject}@{args.inject_step}")
    try:
        train(args, mon)
    except NonFiniteLoss as exc:
        mon.close(status="failed", error=str(exc))
        print(f"training stopped: {exc}", file=sys.stderr, flush=True)
        return 1
    except StoppedByMonitor as exc:
        mon.close(status="stopped", error=str(exc))
        print(f"training stopped by the monitor: {exc}", file=sys.stderr, flush=True)
        return 3
    delivered = mon.close()
    say(f"done: {mon.counters()} ({'all delivered' if delivered else 'some left in spool'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
