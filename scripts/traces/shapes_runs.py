"""The shape recordings (``tests/traces/shapes/``): run shapes the other corpora lack.

Real CPU training runs (one thread, fixed seeds) monitored by the real client
(``Monitor.watch``, per-layer statistics every ``LAYER_EVERY`` = 20 steps, as the class
recordings; 40 on the 146-parameter residual MLP and the 2-rank runs), on losses whose level, sign or noise is unlike a classifier's:

* ``ac``: actor-critic on a contextual bandit (16 contexts, 4 arms) whose payoff table is
  redrawn every 400 steps: the loss (policy + 0.5 value - 0.01 entropy) sits near zero,
  changes sign, and jumps at each redraw while the policy relearns. ``acnorm``: a harder
  bandit (32 contexts, 8 arms, reward noise 0.5) with per-batch normalised advantages and
  entropy bonus 0.05: the policy stays stochastic and the loss swings -0.2..0.3 all run.
* ``dqn``: a Q-network on a 6x6 gridworld (32 parallel agents, epsilon-greedy, a replay
  buffer, a target network synced every 100 steps): the TD loss is nonstationary by design.
* ``infonce``: a contrastive encoder on two noised, masked views of the same inputs, with a
  learnable temperature (CLIP's log-tau): the loss falls as tau moves.
* ``ddpm``: noise prediction of a tiny DDPM (2-D mixture of 8 gaussians, T=100), one random
  timestep per batch: the loss level jumps with the timestep drawn.
* ``bf16``: the corpus MLP under bf16 autocast; ``fp16``: the same under fp16 autocast with
  ``torch.amp.GradScaler("cpu")`` (growth every 50 steps: a moving scale, some overflow
  steps skipped).
* ``accum``: the corpus MLP with gradient accumulation ramped 1 -> 2 -> 4 -> 8 in stages.
* ``wd``: the corpus MLP under AdamW weight decay 0.7 (the weights shrink all run).
* ``moe``: a mixture of 4 expert MLPs with a top-1 router and a Switch load-balancing loss
  (x0.1: at x0.01 the router sent every input to one expert by step ~40).
* ``resmlp``: a deep narrow pre-LN residual MLP (24 blocks, width 32).
* ``ddp_mlp``, ``ddp_ddpm``: the corpus MLP and the diffusion run on 2 gloo DDP ranks (two
  processes on this host, the real client in each, no sidecar): both ranks' step records
  in one trace, interleaved by time, each with ``rank``, ``compute_time`` and
  ``sync_wait_time``; rank 0's run and end records (as the public ``straggler_ddp_gpt``).

Faults (labels from what each recording measurably did, ``shapes_labels.py``):

* ``recur``: one batch with inputs x30 every 35-70 steps (irregular, seeded) from
  ``fault_step`` on, on the corpus MLP and the MoE: a recurring gradient problem (the grad
  norm ~40x its level on each; the CNN, whose loss is ~0.001 by then, and the pre-LN
  residual MLP, whose LayerNorms absorb the scale, barely notice x30 and were dropped).
* ``burst``: 6 batches in a row with random labels under bf16, then clean data, on the
  corpus MLP and CNN (whose loss is ~0.01 by then, so the burst is a 1000x jump): the run
  recovers (a spike, not a divergence nor an explosion).
* ``kept``: LR x30 kept from ``fault_step`` on the actor-critic (SGD momentum 0.02: the
  policy and value blow up within ~20 steps) and on the contrastive run (SGD momentum 0.05:
  the loss level leaves its band and stays up for 80+ steps); LR x100 on the Adam
  actor-critic (the loss leaves its band for ~60 steps while the policy collapses). Adam at
  x30 on either did not diverge (the contrastive loss even fell faster) and was dropped.
* ``nan``: one +inf input at ``fault_step`` in the diffusion run.

The ``half`` is fixed by the seed before any tuning: seed 1 tunes, seeds 2 and 3 are held
out.

    python -m scripts.traces.record_traces --shapes [--only NAME ...] [--shard I/N]
"""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from monitor_client import WatchSettings
from scripts.traces.corpus_models import make_task
from scripts.traces.trace_models import teacher_data

LAYER_EVERY = 20
SEEDS = (1, 2, 3)


@dataclass
class Shape:
    name: str
    kind: str
    steps: int
    lr: float
    seed: int = 1
    opt: str = "adamw"
    wd: float = 0.01
    batch: int = 64
    clip: float | None = None
    amp: str | None = None  # bf16 | fp16
    accum: tuple[int, ...] = (1,)  # micro-batches per step, in equal stages
    fault: str | None = None  # recur | burst | kept | nan
    fault_step: int | None = None
    factor: float = 30.0
    burst: int = 6
    arch: str = "mlp"  # the corpus task of the classifier shapes
    layer_every: int = LAYER_EVERY  # per-layer statistics every this many steps
    params: dict = field(default_factory=dict)


# -- the jobs: a model, its optimizer's params, a batch and a loss ----------------------


class Job:
    """``batch(step, gen)`` -> tensors split on dim 0; ``loss(*batch)``; ``after(step)``."""

    model: nn.Module
    desc: str
    data: str
    noisy = False  # the loss jumps by design (labels: no ratio-based loss_spike allowance)
    crosses_zero = False

    def after(self, step: int) -> None:
        pass

    def params(self):
        return self.model.parameters()

    def random_labels(self, batch: tuple, gen: torch.Generator) -> tuple:
        x, y = batch
        return x, torch.randint(0, int(y.max()) + 1, y.shape, generator=gen)


class Classifier(Job):
    def __init__(self, spec: Shape, model: nn.Module | None = None) -> None:
        self.task = make_task(spec.arch, spec.seed)
        self.model = model or self.task.model
        self.data, self.desc = self.task.data, spec.arch

    def batch(self, step: int, gen: torch.Generator, size: int) -> tuple:
        return self.task.batch(size, gen)

    def loss(self, x, y):
        return F.cross_entropy(self.model(x), y)


class ResBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class ResMLP(nn.Module):
    def __init__(self, depth: int = 24, width: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(32, width)
        self.blocks = nn.Sequential(*[ResBlock(width) for _ in range(depth)])
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.ln_f(self.blocks(self.inp(x))))


class MoE(nn.Module):
    """Top-1 router over 4 expert MLPs (Switch style): out = p_top * expert_top(h)."""

    def __init__(self, n: int = 4, d: int = 64) -> None:
        super().__init__()
        self.inp, self.router = nn.Linear(32, d), nn.Linear(d, n)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(),
                                                   nn.Linear(2 * d, d)) for _ in range(n))
        self.head = nn.Linear(d, 10)
        self.aux = torch.zeros(())

    def forward(self, x):
        h = F.relu(self.inp(x))
        probs = self.router(h).softmax(-1)
        top = probs.argmax(-1)
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            mask = top == i
            if mask.any():
                out[mask] = probs[mask, i:i + 1] * expert(h[mask])
        n = len(self.experts)
        frac = torch.bincount(top, minlength=n).float() / len(x)
        self.aux = n * (frac * probs.mean(0)).sum()
        return self.head(h + out)


class MoEJob(Classifier):
    def __init__(self, spec: Shape) -> None:
        torch.manual_seed(spec.seed)
        super().__init__(spec, MoE())
        self.desc = "MoE: 4 expert MLPs 64-128-64, top-1 router, aux 0.1"

    def loss(self, x, y):
        return F.cross_entropy(self.model(x), y) + 0.1 * self.model.aux


class Bandit(Job):
    """Actor-critic on a contextual bandit whose payoff table is redrawn every 400 steps."""

    crosses_zero = noisy = True

    def __init__(self, spec: Shape) -> None:
        torch.manual_seed(spec.seed)
        contexts, arms = spec.params.get("contexts", 16), spec.params.get("arms", 4)
        self.noise = spec.params.get("noise", 0.1)
        self.trunk = nn.Sequential(nn.Linear(contexts, 64), nn.Tanh(), nn.Linear(64, 64),
                                   nn.Tanh())
        self.pi, self.v = nn.Linear(64, arms), nn.Linear(64, 1)
        self.model = nn.ModuleDict({"trunk": self.trunk, "pi": self.pi, "v": self.v})
        self.contexts, self.arms = contexts, arms
        self.redraw = spec.params.get("redraw", 400)
        self.norm_adv = spec.params.get("norm_adv", False)
        self.ent = spec.params.get("entropy", 0.01)
        self.table_gen = torch.Generator().manual_seed(spec.seed + 500)
        self.table = torch.rand(contexts, arms, generator=self.table_gen)
        self.desc = (f"actor-critic MLP {contexts}-64-64 (tanh), policy {arms} + value heads, "
                     f"entropy bonus {self.ent:g}"
                     + (", advantages normalised per batch" if self.norm_adv else ""))
        self.data = (f"contextual bandit, {contexts} contexts x {arms} arms, U(0,1) payoffs "
                     f"+ N(0, {self.noise:g}) noise, table redrawn every {self.redraw} steps")

    def batch(self, step: int, gen: torch.Generator, size: int) -> tuple:
        if step > 1 and (step - 1) % self.redraw == 0:
            self.table = torch.rand(self.contexts, self.arms, generator=self.table_gen)
        c = torch.randint(0, self.contexts, (size,), generator=gen)
        x = F.one_hot(c, self.contexts).float()
        with torch.no_grad():
            probs = self.pi(self.trunk(x)).softmax(-1)
        a = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        r = self.table[c, a] + self.noise * torch.randn(size, generator=gen)
        return x, a, r

    def loss(self, x, a, r):
        h = self.trunk(x)
        logp = self.pi(h).log_softmax(-1)
        v = self.v(h).squeeze(1)
        adv = (r - v).detach()
        if self.norm_adv:  # per-batch advantage normalisation (A2C/PPO implementations)
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy = -(logp.gather(1, a[:, None]).squeeze(1) * adv).mean()
        entropy = -(logp.exp() * logp).sum(-1).mean()
        return policy + 0.5 * ((r - v) ** 2).mean() - self.ent * entropy

    def random_labels(self, batch, gen):
        raise NotImplementedError


class Grid(Job):
    """DQN on a 6x6 gridworld: 32 agents, replay, target network synced every 100 steps."""

    noisy = True

    def __init__(self, spec: Shape, n: int = 6, agents: int = 32) -> None:
        torch.manual_seed(spec.seed)
        self.n, self.agents = n, agents
        self.model = nn.Sequential(nn.Linear(n * n, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                   nn.Linear(64, 4))
        self.target = copy.deepcopy(self.model).requires_grad_(False)
        self.sync = spec.params.get("sync", 100)
        self.pos = torch.zeros(agents, dtype=torch.long)
        self.t = torch.zeros(agents, dtype=torch.long)
        cap = 8192
        self.buf = {"s": torch.zeros(cap, dtype=torch.long), "a": torch.zeros(cap, dtype=torch.long),
                    "r": torch.zeros(cap), "s2": torch.zeros(cap, dtype=torch.long),
                    "done": torch.zeros(cap)}
        self.cap, self.filled, self.head = cap, 0, 0
        self.desc = "Q-net MLP 36-64-64-4 (relu), target net synced every 100 steps"
        self.data = (f"{n}x{n} gridworld, goal +1 at the far corner, -0.01 a move, 50-move "
                     f"episodes; {agents} agents, epsilon 1 -> 0.05 over 600 steps, gamma 0.95")

    def _onehot(self, s):
        return F.one_hot(s, self.n * self.n).float()

    def batch(self, step: int, gen: torch.Generator, size: int) -> tuple:
        eps = max(0.05, 1.0 - step / 600)
        with torch.no_grad():
            greedy = self.model(self._onehot(self.pos)).argmax(-1)
        rand = torch.randint(0, 4, (self.agents,), generator=gen)
        a = torch.where(torch.rand(self.agents, generator=gen) < eps, rand, greedy)
        row, col = self.pos // self.n, self.pos % self.n
        row = (row + (a == 1).long() - (a == 0).long()).clamp(0, self.n - 1)
        col = (col + (a == 3).long() - (a == 2).long()).clamp(0, self.n - 1)
        s2 = row * self.n + col
        goal = s2 == self.n * self.n - 1
        self.t += 1
        done = goal | (self.t >= 50)
        r = goal.float() - 0.01
        idx = (self.head + torch.arange(self.agents)) % self.cap
        for k, v in (("s", self.pos), ("a", a), ("r", r), ("s2", s2), ("done", goal.float())):
            self.buf[k][idx] = v
        self.head = (self.head + self.agents) % self.cap
        self.filled = min(self.filled + self.agents, self.cap)
        self.pos = torch.where(done, torch.zeros_like(s2), s2)
        self.t = torch.where(done, torch.zeros_like(self.t), self.t)
        pick = torch.randint(0, self.filled, (size,), generator=gen)
        return tuple(self.buf[k][pick] for k in ("s", "a", "r", "s2", "done"))

    def loss(self, s, a, r, s2, done):
        q = self.model(self._onehot(s)).gather(1, a[:, None]).squeeze(1)
        with torch.no_grad():
            target = r + 0.95 * (1 - done) * self.target(self._onehot(s2)).max(-1).values
        return F.smooth_l1_loss(q, target)

    def after(self, step: int) -> None:
        if step % self.sync == 0:
            self.target.load_state_dict(self.model.state_dict())


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 64))
        self.log_tau = nn.Parameter(torch.tensor(math.log(0.5)))


class Contrastive(Job):
    """InfoNCE between two noised, masked views; a learnable temperature (log tau)."""

    def __init__(self, spec: Shape) -> None:
        torch.manual_seed(spec.seed)
        self.model = Encoder()
        self.x, _ = teacher_data(n=8192, d_in=32, classes=10, seed=spec.seed)
        self.desc = "encoder MLP 32-128-64 + learnable log-temperature (init tau 0.5)"
        self.data = ("teacher gaussians (32-d); views: +N(0, 0.5) noise, 20% of features "
                     "zeroed; symmetric InfoNCE over the batch")

    def batch(self, step: int, gen: torch.Generator, size: int) -> tuple:
        x = self.x[torch.randint(0, len(self.x), (size,), generator=gen)]

        def view():
            keep = (torch.rand(x.shape, generator=gen) > 0.2).float()
            return (x + 0.5 * torch.randn(x.shape, generator=gen)) * keep

        return view(), view()

    def loss(self, a, b):
        za = F.normalize(self.model.enc(a), dim=-1)
        zb = F.normalize(self.model.enc(b), dim=-1)
        logits = za @ zb.T / self.model.log_tau.exp().clamp(min=0.01)
        y = torch.arange(len(a))
        return 0.5 * (F.cross_entropy(logits, y) + F.cross_entropy(logits.T, y))


class Diffusion(Job):
    """DDPM noise prediction on a 2-D mixture of 8 gaussians; one timestep per batch."""

    noisy = True

    def __init__(self, spec: Shape, steps: int = 100) -> None:
        torch.manual_seed(spec.seed)
        self.model = nn.Sequential(nn.Linear(2 + 16, 128), nn.SiLU(), nn.Linear(128, 128),
                                   nn.SiLU(), nn.Linear(128, 2))
        betas = torch.linspace(1e-3, 0.2, steps)
        self.abar = torch.cumprod(1 - betas, 0)
        self.T = steps
        self.desc = "noise-prediction MLP (2 + 16 time features)-128-128-2 (SiLU)"
        self.data = ("8 gaussians (std 0.1) on the unit circle x2; T=100, betas 1e-3..0.2 "
                     "linear; one timestep drawn per batch")

    def batch(self, step: int, gen: torch.Generator, size: int) -> tuple:
        k = torch.randint(0, 8, (size,), generator=gen)
        ang = k.float() * (2 * math.pi / 8)
        x0 = 2 * torch.stack([ang.cos(), ang.sin()], 1) + 0.1 * torch.randn(size, 2, generator=gen)
        t = torch.randint(0, self.T, (1,), generator=gen).expand(size).clone()
        return x0, t, torch.randn(size, 2, generator=gen)

    def loss(self, x0, t, noise):
        ab = self.abar[t][:, None]
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
        freqs = torch.exp(torch.linspace(0, math.log(100), 8))
        arg = t[:, None].float() / self.T * freqs
        feat = torch.cat([xt, arg.sin(), arg.cos()], 1)
        return F.mse_loss(self.model(feat), noise)


def make_job(spec: Shape) -> Job:
    if spec.kind == "resmlp":
        torch.manual_seed(spec.seed)
        job = Classifier(spec, ResMLP())
        job.desc = "residual MLP: 24 pre-LN blocks, width 32"
        return job
    return {"ac": Bandit, "dqn": Grid, "infonce": Contrastive, "ddpm": Diffusion,
            "moe": MoEJob}.get(spec.kind, Classifier)(spec)


# -- the loop ---------------------------------------------------------------------------


def recur_steps(spec: Shape) -> list[int]:
    """The x30 batches: from fault_step, gaps of 35-70 steps drawn from the seed."""
    gen = torch.Generator().manual_seed(spec.seed + 900)
    out, s = [], spec.fault_step
    while s <= spec.steps:
        out.append(s)
        s += int(torch.randint(35, 71, (1,), generator=gen))
    return out


FAULTS = {"recur": "one batch with inputs x factor at each step of fault_params.steps",
          "burst": "fault_params.burst batches in a row with random labels from fault_step",
          "kept": "every param group's LR x factor from fault_step on (kept)",
          "nan": "one input element is +inf for the batch at fault_step"}


def config_of(spec: Shape, job: Job) -> dict:
    params = {"recur": lambda: {"factor": spec.factor, "steps": recur_steps(spec)},
              "burst": lambda: {"burst": spec.burst},
              "kept": lambda: {"factor": spec.factor}}.get(spec.fault, dict)()
    return {"scenario": spec.fault or "healthy", "shape": spec.kind, "fault_step": spec.fault_step,
            "fault": FAULTS.get(spec.fault), "fault_params": params, "seed": spec.seed,
            "arch": job.desc, "optimizer": spec.opt, "lr": spec.lr, "weight_decay": spec.wd,
            "schedule": "const", "warmup_steps": 0, "total_steps": spec.steps,
            "batch_size": spec.batch, "accum_stages": list(spec.accum), "amp": spec.amp,
            "loss_crosses_zero": job.crosses_zero, "noisy_by_design": job.noisy,
            "data": job.data, **spec.params}


def _opt(spec: Shape, params) -> torch.optim.Optimizer:
    if spec.opt == "adam":
        return torch.optim.Adam(params, lr=spec.lr)
    if spec.opt == "sgdm":
        return torch.optim.SGD(params, lr=spec.lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.wd)


def run(spec: Shape, monitor) -> list[dict]:
    """Train ``spec``; ``monitor(name, config)`` returns (Monitor, capture with .records)."""
    if spec.params.get("ddp_ranks"):
        return run_ddp(spec)
    job = make_job(spec)
    opt = _opt(spec, job.params())
    gen = torch.Generator().manual_seed(spec.seed + 100)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=50) \
        if spec.amp == "fp16" else None
    mon, cap = monitor(spec.name, config_of(spec, job))
    mon.watch(job.model, opt, grad_clip=spec.clip, scaler=scaler,
              settings=WatchSettings(layer_stats_every=spec.layer_every, hist_every=0))
    recur = set(recur_steps(spec)) if spec.fault == "recur" else set()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.amp)
    status = "completed"
    for step in range(1, spec.steps + 1):
        lr = spec.lr * (spec.factor if spec.fault == "kept" and step >= spec.fault_step else 1)
        for g in opt.param_groups:
            g["lr"] = lr
        accum = spec.accum[min(len(spec.accum) - 1, (step - 1) * len(spec.accum) // spec.steps)]
        batch = job.batch(step, gen, spec.batch * accum)
        if step in recur:
            batch = (batch[0] * spec.factor, *batch[1:])
        if spec.fault == "burst" and spec.fault_step <= step < spec.fault_step + spec.burst:
            batch = job.random_labels(batch, gen)
        if spec.fault == "nan" and step == spec.fault_step:
            x = batch[0].clone()
            x.view(-1)[0] = float("inf")
            batch = (x, *batch[1:])
        total = torch.zeros(())
        for part in zip(*(b.chunk(accum) for b in batch), strict=True):
            with torch.autocast("cpu", dtype=dtype) if dtype else nullcontext():
                loss = job.loss(*part)
            scaled = loss.float() / accum
            (scaler.scale(scaled) if scaler else scaled).backward()
            total += loss.detach().float() / accum
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()
        job.after(step)
        mon.log_step(step, loss=total, samples=spec.batch * accum, tokens=spec.batch * accum)
        if not math.isfinite(float(total)) and step >= (spec.fault_step or 0) + 3:
            status = "failed"
            break
    mon.close(status=status, error="loss is NaN" if status == "failed" else None)
    return cap.records


def _ddp_worker(rank: int, spec: Shape, port: int, out: str) -> None:
    """One rank of a 2-rank gloo DDP run: its own Monitor and capture, its records to a file."""
    import os

    import torch.distributed as dist

    from monitor_agent.records import wire
    from scripts.traces.capture import monitor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    job = make_job(spec)
    inner = job.model
    job.model = nn.parallel.DistributedDataParallel(inner)
    opt = _opt(spec, inner.parameters())
    gen = torch.Generator().manual_seed(spec.seed + 100 + 1000 * rank)  # each rank its data
    config = {**config_of(spec, job), "ddp": {"backend": "gloo", "world_size": 2}}
    mon, cap = monitor(spec.name, config)
    mon.watch(inner, opt, grad_clip=spec.clip,
              settings=WatchSettings(layer_stats_every=spec.layer_every, hist_every=0))
    for step in range(1, spec.steps + 1):
        loss = job.loss(*job.batch(step, gen, spec.batch))
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss.detach(), samples=spec.batch, tokens=spec.batch)
    mon.close(status="completed")
    dist.barrier()
    dist.destroy_process_group()
    with open(f"{out}/rank{rank}.jsonl", "wb") as fh:
        for rec in cap.records:
            fh.write(wire.dumps(rec) + b"\n")


def run_ddp(spec: Shape) -> list[dict]:
    """Two gloo ranks on this host, each with the real client (no sidecar); one trace: rank
    0's run and end records and both ranks' steps, interleaved by time (as the public
    ``straggler_ddp_gpt``)."""
    import json
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_ddp_worker, args=(spec, port, out), nprocs=2, join=True)
        ranks = [[json.loads(line) for line in Path(f"{out}/rank{r}.jsonl").read_text().splitlines()]
                 for r in (0, 1)]
    head = [r for r in ranks[0] if r["kind"] == "run"][:1]
    tail = [r for r in ranks[0] if r["kind"] == "end"]
    steps = sorted((r for recs in ranks for r in recs if r["kind"] == "step"),
                   key=lambda r: (r["time"], r["rank"]))
    return head + steps + tail


S = Shape
# A harder bandit (32 contexts, 8 arms, reward noise 0.5) with per-batch normalised
# advantages and entropy bonus 0.05: the policy stays stochastic and the loss swings
# -0.2..0.3 around +0.12 all run.
ACNORM = {"norm_adv": True, "entropy": 0.05, "contexts": 32, "arms": 8, "noise": 0.5}
HEALTHY = {  # name: (kind, steps, lr, extra)
    "ac": ("ac", 1600, 3e-3, dict(opt="adam")),
    "acnorm": ("ac", 1600, 3e-3, dict(opt="adam", params=ACNORM)),
    "dqn": ("dqn", 1200, 1e-3, dict(opt="adam")),
    "infonce": ("infonce", 800, 1e-3, dict(batch=128)),
    "ddpm": ("ddpm", 1500, 1e-3, dict(batch=128)),
    "bf16": ("bf16", 800, 1e-3, dict(amp="bf16")),
    "fp16": ("fp16", 800, 1e-3, dict(amp="fp16")),
    "accum": ("accum", 800, 1e-3, dict(batch=32, accum=(1, 2, 4, 8))),
    "wd": ("wd", 1000, 1e-3, dict(wd=0.7)),
    "moe": ("moe", 1000, 1e-3, dict()),
    "resmlp": ("resmlp", 600, 1e-3, dict(layer_every=40)),  # 146 parameters: fewer rows
}


def _specs() -> list[Shape]:
    out = []
    for seed in SEEDS:
        for name, (kind, steps, lr, extra) in HEALTHY.items():
            out.append(S(f"h_{name}_s{seed}", kind, steps, lr, seed=seed, **extra))
        for arch in ("mlp", "moe"):
            out.append(S(f"recur30_{arch}_s{seed}", arch, 600, 1e-3, seed=seed,
                         fault="recur", fault_step=200))
        out.append(S(f"burst6_bf16_s{seed}", "bf16", 400, 1e-3, seed=seed, amp="bf16",
                     fault="burst", fault_step=200))
        out.append(S(f"burst6_bf16_cnn_s{seed}", "bf16", 400, 2e-3, seed=seed, amp="bf16",
                     arch="cnn", batch=32, fault="burst", fault_step=200))
        out.append(S(f"kept30_ac_s{seed}", "ac", 1000, 0.02, seed=seed, opt="sgdm",
                     fault="kept", fault_step=600))
        out.append(S(f"kept100_ac_adam_s{seed}", "ac", 1000, 3e-3, seed=seed, opt="adam",
                     fault="kept", fault_step=600, factor=100.0))
        out.append(S(f"kept30_infonce_s{seed}", "infonce", 600, 0.05, seed=seed, batch=128,
                     opt="sgdm", fault="kept", fault_step=400))
        out.append(S(f"nan_ddpm_s{seed}", "ddpm", 500, 1e-3, seed=seed, batch=128,
                     fault="nan", fault_step=400))
        for kind, steps, batch in (("mlp", 500, 32), ("ddpm", 600, 64)):  # 2 ranks
            out.append(S(f"h_ddp_{kind}_s{seed}", kind, steps, 1e-3, seed=seed, batch=batch,
                         layer_every=40, params={"ddp_ranks": 2}))
    return out


SPECS = _specs()


def half_of(name: str) -> str:
    return "tune" if name.endswith("_s1") else "heldout"
