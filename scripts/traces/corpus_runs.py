"""The runs of the precision corpus (``tests/traces/corpus/``): one training loop, many shapes.

Each ``Spec`` is a real CPU training run (one thread, fixed seeds) monitored by the real
client with per-layer statistics on every step, as the public traces. The healthy runs vary
what changes a detector's baseline: architecture (MLP, deep tanh MLP, CNN, GRU, LSTM, ViT,
GPT), optimizer (every one torch ships that trains these), LR schedule (constant, cosine,
step decay, linear decay to 0, warm restarts), warmup (none to long), batch size (2 to
512, and a ramp), loss scale (near-zero classification losses, label smoothing, character
LM losses), gradient accumulation, eval cadence (an eval pause lands in the next step's
``step_time``), a resumed run (records start mid-run) and a fine-tune from a converged
checkpoint (the loss starts low). The faults are mechanisms on shapes the public set lacks:

* ``lr_spike``: every param group's LR x ``factor`` from ``fault_step`` on (persists);
* ``bad_batch``: one batch at ``fault_step`` with random labels (recovers), or ``burst``
  of them in a row;
* ``nan_hidden``: the RNN's initial state is NaN for the batch at ``fault_step``;
* ``inf_input``: one input pixel is +inf at ``fault_step``.

A run whose loss turns non-finite stops 3 steps later with status ``failed``.

    python -m scripts.traces.record_traces --corpus [--only NAME ...] [--shard I/N]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from monitor_client import WatchSettings
from scripts.traces.corpus_models import make_task

# arch, optimizer, lr, schedule, warmup, batch, steps, clip, accum, eval_every + extras
EVAL_BATCHES = 4


@dataclass
class Spec:
    name: str
    arch: str
    opt: str
    lr: float
    steps: int
    schedule: str = "const"  # const | cosine | step | linear0 | restarts
    warmup: int = 0
    batch: int = 32
    clip: float | None = None
    accum: int = 1
    eval_every: int = 100
    smoothing: float = 0.0
    pretrain: int = 0  # unmonitored steps first (resume: same run; finetune: then lr / 10)
    finetune: bool = False
    ramp: tuple[int, ...] = ()  # batch sizes in equal stages
    seed: int = 1
    fault: str | None = None
    fault_step: int | None = None
    factor: float = 1.0
    burst: int = 1  # bad_batch: this many bad batches in a row from fault_step
    model_kw: dict = field(default_factory=dict)
    layer_every: int = 1  # per-layer statistics every this many steps


def make_opt(name: str, params, lr: float) -> torch.optim.Optimizer:
    o = torch.optim
    return {"adamw": lambda: o.AdamW(params, lr=lr, weight_decay=0.01),
            "adam": lambda: o.Adam(params, lr=lr),
            "sgd": lambda: o.SGD(params, lr=lr),
            "sgdm": lambda: o.SGD(params, lr=lr, momentum=0.9),
            "nesterov": lambda: o.SGD(params, lr=lr, momentum=0.9, nesterov=True),
            "adafactor": lambda: o.Adafactor(params, lr=lr),
            "rmsprop": lambda: o.RMSprop(params, lr=lr),
            "adagrad": lambda: o.Adagrad(params, lr=lr),
            "nadam": lambda: o.NAdam(params, lr=lr),
            "radam": lambda: o.RAdam(params, lr=lr),
            "adamax": lambda: o.Adamax(params, lr=lr)}[name]()


def lr_at(spec: Spec, step: int, total: int) -> float:
    """The scheduled LR at ``step`` (1-based) of ``total``, before any fault."""
    if spec.warmup and step <= spec.warmup:
        return spec.lr * step / spec.warmup
    t = (step - spec.warmup) / max(total - spec.warmup, 1)
    if spec.schedule == "cosine":
        return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))
    if spec.schedule == "step":
        return spec.lr * (0.1 ** ((t >= 0.5) + (t >= 0.75)))
    if spec.schedule == "linear0":
        return spec.lr * max(1.0 - t, 0.0)
    if spec.schedule == "restarts":
        return spec.lr * (0.05 + 0.475 * (1 + math.cos(math.pi * ((3 * t) % 1.0))))
    return spec.lr


def batch_size(spec: Spec, step: int, first: int, total: int) -> int:
    if not spec.ramp:
        return spec.batch
    stage = min(len(spec.ramp) - 1, (step - first) * len(spec.ramp) // max(total, 1))
    return spec.ramp[stage]


def config_of(spec: Spec, task) -> dict:
    return {"scenario": spec.fault or "healthy", "fault_step": spec.fault_step,
            "fault": FAULTS.get(spec.fault), "fault_params": (
                {"factor": spec.factor} if spec.fault == "lr_spike" else
                {"burst": spec.burst} if spec.fault == "bad_batch" else {}),
            "seed": spec.seed, "arch": spec.arch, "model_kw": spec.model_kw,
            "optimizer": spec.opt, "lr": spec.lr, "schedule": spec.schedule,
            "warmup_steps": spec.warmup, "total_steps": spec.steps, "batch_size": spec.batch,
            "batch_ramp": list(spec.ramp), "accum_steps": spec.accum,
            "label_smoothing": spec.smoothing, "eval_every": spec.eval_every,
            "resumed_from_step": spec.pretrain if spec.pretrain and not spec.finetune else None,
            "finetuned_after_steps": spec.pretrain if spec.finetune else None,
            "seq_len": task.seq_len, "data": task.data}


FAULTS = {"lr_spike": "every param group's LR x factor from fault_step on",
          "bad_batch": "one batch of random labels at fault_step",
          "nan_hidden": "the RNN's initial hidden state is NaN for one batch",
          "inf_input": "one input pixel is +inf for one batch"}


def _train_step(spec, task, opt, x, y, poison: bool) -> torch.Tensor:
    total = torch.zeros(())
    for xs, ys in zip(x.chunk(spec.accum), y.chunk(spec.accum), strict=True):
        if poison and spec.fault == "nan_hidden":
            task.model.poison = True
        loss = task.loss(xs, ys, spec.smoothing)
        task.model.poison = False
        (loss / spec.accum).backward()
        total += loss.detach() / spec.accum
    return total


@torch.no_grad()
def _eval(task, smoothing: float) -> float:
    task.model.eval()
    x, y = task.val
    out = [float(task.loss(xs, ys)) for xs, ys in zip(x.chunk(EVAL_BATCHES),
                                                      y.chunk(EVAL_BATCHES), strict=True)]
    task.model.train()
    return sum(out) / len(out)


def run(spec: Spec, monitor) -> list[dict]:
    """Train ``spec``; ``monitor(name, config)`` returns (Monitor, capture with .records)."""
    task = make_task(spec.arch, spec.seed, **spec.model_kw)
    opt = make_opt(spec.opt, task.model.parameters(), spec.lr)
    gen = torch.Generator().manual_seed(spec.seed + 100)
    first = 1
    if spec.pretrain:  # unmonitored: the checkpoint this run resumes or fine-tunes from
        for step in range(1, spec.pretrain + 1):
            for g in opt.param_groups:
                g["lr"] = lr_at(spec, step, spec.pretrain if spec.finetune else spec.steps)
            _train_step(spec, task, opt, *task.batch(spec.batch, gen), False)
            opt.step()
            opt.zero_grad()
        first = spec.pretrain + 1
        if spec.finetune:
            opt = make_opt(spec.opt, task.model.parameters(), spec.lr / 10)
    mon, cap = monitor(spec.name, config_of(spec, task))
    mon.watch(task.model, opt, grad_clip=spec.clip,
              settings=WatchSettings(seq_len=task.seq_len, layer_stats_every=spec.layer_every,
                                     hist_every=0))
    last = first + spec.steps - 1 if spec.finetune else spec.steps
    status = "completed"
    for step in range(first, last + 1):
        lr = lr_at(spec, step - first + 1, last - first + 1) if spec.finetune else lr_at(
            spec, step, spec.steps)
        lr = lr / 10 if spec.finetune else lr
        if spec.fault == "lr_spike" and step >= spec.fault_step:
            lr *= spec.factor
        for g in opt.param_groups:
            g["lr"] = lr
        size = batch_size(spec, step, first, last - first + 1)
        x, y = task.batch(size * spec.accum, gen)
        hit = step == spec.fault_step
        if spec.fault == "bad_batch" and spec.fault_step is not None and \
                spec.fault_step <= step < spec.fault_step + spec.burst:
            y = torch.randint(0, int(y.max()) + 1, y.shape, generator=gen)
        if hit and spec.fault == "inf_input":
            x = x.clone()
            x.view(len(x), -1)[0, 0] = float("inf")
        loss = _train_step(spec, task, opt, x, y, hit)
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss, tokens=size * spec.accum * task.tokens_per_sample,
                     samples=size * spec.accum)
        if step % spec.eval_every == 0:
            mon.log_eval(step, val_loss=_eval(task, spec.smoothing))
        if not math.isfinite(float(loss)) and step >= (spec.fault_step or 0) + 3:
            status = "failed"
            break
    mon.close(status=status, error="loss is NaN" if status == "failed" else None)
    return cap.records


S = Spec
SPECS = [
    # -- healthy: GPT (character LM, loss ~4.5 -> ~2.3)
    S("h_gpt_adamw_cosine", "gpt", "adamw", 3e-3, 500, "cosine", 50, 16, clip=1.0),
    S("h_gpt_nesterov_step", "gpt", "nesterov", 0.2, 500, "step", 20, 16, clip=1.0),
    S("h_gpt_adafactor_const", "gpt", "adafactor", 1e-2, 400, seed=2, batch=16),
    S("h_gpt_adamw_linear0_accum4", "gpt", "adamw", 3e-3, 300, "linear0", 30, 4, accum=4,
      clip=1.0),
    S("h_gpt_adamw_restarts", "gpt", "adamw", 2e-3, 500, "restarts", 0, 16, eval_every=50),
    S("h_gpt_resumed", "gpt", "adamw", 3e-3, 600, "cosine", 50, 16, clip=1.0, pretrain=250),
    S("h_gpt_bs_ramp", "gpt", "adamw", 2e-3, 500, "const", 50, ramp=(4, 8, 16, 32)),
    S("h_gpt_bs2_noclip", "gpt", "adam", 1e-3, 400, batch=2, eval_every=20),
    # -- healthy: MLP
    S("h_mlp_adamw_const", "mlp", "adamw", 1e-3, 1200, batch=64),
    S("h_mlp_sgd_cosine", "mlp", "sgd", 0.1, 1200, "cosine", batch=64),
    S("h_mlp_sgdm_step", "mlp", "sgdm", 0.02, 1000, "step", 50, 64, eval_every=50),
    S("h_mlp_rmsprop", "mlp", "rmsprop", 3e-4, 800, batch=32),
    S("h_mlp_adagrad", "mlp", "adagrad", 1e-2, 800, batch=32),
    S("h_mlp_tanh8_adamw", "mlp", "adamw", 1e-3, 800, "cosine", 50, 64,
      model_kw={"act": "tanh", "depth": 8, "width": 64}),
    S("h_mlp_tanh8_sgdm", "mlp", "sgdm", 0.01, 800, batch=32,
      model_kw={"act": "tanh", "depth": 8, "width": 64}),
    S("h_mlp_gelu_bs8", "mlp", "adamw", 5e-4, 1500, batch=8, model_kw={"act": "gelu"}),
    S("h_mlp_bs512", "mlp", "adamw", 3e-3, 600, "linear0", 20, 512),
    S("h_mlp_smooth", "mlp", "adamw", 1e-3, 800, "cosine", batch=64, smoothing=0.1),
    S("h_mlp_finetune", "mlp", "adamw", 2e-3, 600, "cosine", 0, 64, pretrain=1200,
      finetune=True),
    S("h_mlp_accum8", "mlp", "sgdm", 0.05, 500, "cosine", 20, 8, accum=8),
    S("h_mlp_nadam_restarts", "mlp", "nadam", 1e-3, 1000, "restarts", batch=32),
    S("h_mlp_radam_linear0", "mlp", "radam", 1e-3, 800, "linear0", batch=32),
    S("h_mlp_adamax_warmup300", "mlp", "adamax", 2e-3, 900, "const", 300, 32),
    # -- healthy: CNN (loss falls to a few hundredths, noisy)
    S("h_cnn_adamw_cosine", "cnn", "adamw", 2e-3, 1000, "cosine", 30, 32),
    S("h_cnn_sgd_const", "cnn", "sgd", 0.05, 1000, batch=32),
    S("h_cnn_sgdm_step", "cnn", "sgdm", 0.01, 1000, "step", 0, 32),
    S("h_cnn_adam_bs8", "cnn", "adam", 1e-3, 1000, batch=8, seed=3),
    S("h_cnn_adamw_bs128", "cnn", "adamw", 3e-3, 500, "linear0", 0, 128),
    S("h_cnn_finetune", "cnn", "adamw", 2e-3, 600, "const", 0, 32, pretrain=800,
      finetune=True),
    S("h_cnn_smooth", "cnn", "adamw", 2e-3, 800, "cosine", 0, 32, smoothing=0.1),
    S("h_cnn_rmsprop_linear0", "cnn", "rmsprop", 1e-3, 800, "linear0", 0, 32),
    S("h_cnn_adafactor", "cnn", "adafactor", 1e-2, 800, seed=4),
    S("h_cnn_long_const", "cnn", "adamw", 1e-3, 1500, batch=32, eval_every=25, seed=5),
    # -- healthy: recurrent
    S("h_gru_adamw_cosine", "gru", "adamw", 3e-3, 500, "cosine", 20, 16, clip=1.0),
    S("h_lstm_sgdm_clip", "lstm", "sgdm", 0.5, 500, batch=16, clip=1.0),
    S("h_gru_rmsprop", "gru", "rmsprop", 1e-3, 400, batch=16),
    S("h_lstm_adam_warmup200", "lstm", "adam", 3e-3, 500, "cosine", 200, 16),
    S("h_gru_resumed", "gru", "adamw", 3e-3, 500, "const", 20, 16, pretrain=200),
    # -- healthy: ViT-like
    S("h_vit_adamw_cosine", "vit", "adamw", 1e-3, 700, "cosine", 100, 32, clip=1.0),
    S("h_vit_sgdm_step", "vit", "sgdm", 0.05, 700, "step", 20, 32),
    S("h_vit_bs_ramp", "vit", "adamw", 1e-3, 700, "const", 30, ramp=(8, 16, 32, 64)),
    S("h_vit_adafactor_restarts", "vit", "adafactor", 3e-3, 600, "restarts", 0, 32),
    S("h_vit_smooth_accum2", "vit", "adamw", 1e-3, 500, "linear0", 0, 16, accum=2,
      smoothing=0.1),
    S("h_vit_finetune", "vit", "adamw", 1e-3, 400, "cosine", 0, 32, pretrain=600,
      finetune=True),
    # -- healthy, added after the first tuning pass (a second unseen check)
    S("h_gpt_layers_every10", "gpt", "adamw", 3e-3, 500, "cosine", 30, 16, clip=1.0,
      layer_every=10, seed=3),
    S("h_mlp_dropout_wd", "mlp", "adamw", 2e-3, 1000, "cosine", 50, 64,
      model_kw={"dropout": 0.3}),
    S("h_cnn_bn_sgdm_step", "cnn", "sgdm", 0.05, 800, "step", 20, 32, model_kw={"bn": True}),
    S("h_gru_bs2", "gru", "adam", 1e-3, 500, batch=2, seed=4),
    S("h_vit_warmup300_smooth", "vit", "adamw", 1e-3, 800, "cosine", 300, 32, smoothing=0.1),
    S("h_mlp_tanh16_adam", "mlp", "adam", 5e-4, 800, batch=32,
      model_kw={"act": "tanh", "depth": 16, "width": 32}),
    # -- faults on shapes the public set lacks
    S("f_cnn_lr_spike_sgdm", "cnn", "sgdm", 0.01, 700, "const", 0, 32, fault="lr_spike",
      fault_step=500, factor=50.0),
    S("f_gru_nan_hidden", "gru", "adamw", 3e-3, 400, "const", 20, 16, clip=1.0,
      fault="nan_hidden", fault_step=300),
    S("f_cnn_bad_batch", "cnn", "adamw", 2e-3, 800, "const", 0, 32, fault="bad_batch",
      fault_step=250),
    S("f_mlp_bad_batch", "mlp", "adamw", 1e-3, 800, batch=64, fault="bad_batch",
      fault_step=600),
    S("f_gpt_lr_spike_clip", "gpt", "adamw", 2e-3, 450, "const", 30, 16, clip=1.0,
      fault="lr_spike", fault_step=300, factor=40.0),
    S("f_vit_lr_spike_clip", "vit", "adamw", 1e-3, 600, "const", 30, 32, clip=1.0,
      fault="lr_spike", fault_step=400, factor=40.0),
    S("f_vit_inf_input", "vit", "adamw", 1e-3, 500, "const", 30, 32, fault="inf_input",
      fault_step=400),
    S("f_mlp_lr_spike_sgd", "mlp", "sgd", 0.05, 800, batch=64, fault="lr_spike",
      fault_step=600, factor=30.0),
    S("f_lstm_lr_spike_clip", "lstm", "sgdm", 0.5, 450, batch=16, clip=1.0,
      fault="lr_spike", fault_step=300, factor=20.0),
    S("f_cnn_bad_batch_sgd", "cnn", "sgd", 0.05, 800, batch=32, fault="bad_batch",
      fault_step=250, seed=6),
]
