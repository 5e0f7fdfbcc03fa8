"""A user's nanoGPT-style training script, instrumented from the README's snippet alone.

Written the way karpathy/nanoGPT's ``train.py`` is written (module-level config globals
overridden by ``--key=value``, ``get_batch``, ``get_lr`` with warmup and cosine decay,
``grad_clip = 0.0`` meaning "disabled", ``max_iters``), not the way our examples are. The
monitoring is the lines marked ``# monitor``; everything else is the user's.

Faults a test asks for, as a user's bug would make them: ``lr_jump_at`` multiplies the LR
by ``lr_jump`` from that iteration on (a schedule bug), ``nan_from`` makes the loss NaN from
that iteration to the end (a bad log in the loss).
"""

import math
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

import monitor_client  # monitor

# -----------------------------------------------------------------------------
# default config values, nanoGPT style
out_dir = "out"
eval_interval = 50
eval_iters = 5
run_id = None
batch_size = 8
block_size = 32
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.0
learning_rate = 1e-3
max_iters = 120
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.99
grad_clip = 0.0  # clip gradients at this value, or disable if == 0.0
decay_lr = True
warmup_iters = 10
lr_decay_iters = 120
min_lr = 1e-4
seed = 1337
lr_jump_at = 0
lr_jump = 100.0
nan_from = 0
for arg in sys.argv[1:]:  # nanoGPT's configurator, inlined
    key, val = arg[2:].split("=", 1)
    old = globals()[key]
    globals()[key] = val if isinstance(old, str) or old is None else type(old)(eval(val))
config = {k: v for k, v in dict(globals()).items()
          if not k.startswith("_") and isinstance(v, (int, float, bool, str))}
# -----------------------------------------------------------------------------

torch.manual_seed(seed)
torch.set_num_threads(1)
text = ("First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. "
        "First Citizen: You are all resolved rather to die than to famish? ") * 40
chars = sorted(set(text))
stoi = {ch: i for i, ch in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
n = int(0.9 * len(data))
train_data, val_data = data[:n], data[n:]


def get_batch(split):
    d = train_data if split == "train" else val_data
    ix = torch.randint(len(d) - block_size, (batch_size,))
    x = torch.stack([d[i:i + block_size] for i in ix])
    y = torch.stack([d[i + 1:i + 1 + block_size] for i in ix])
    return x, y


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, dropout=dropout, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(len(chars), n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, len(chars), bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1))
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate,
                              betas=(beta1, beta2), weight_decay=weight_decay)
mon = monitor_client.Monitor(project="nanogpt", config=config,  # monitor
                             total_steps=max_iters, run_id=run_id)  # monitor
mon.watch(model, optimizer, grad_clip=grad_clip)  # monitor


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(eval_iters)
    for k in range(eval_iters):
        x, y = get_batch("val")
        losses[k] = model(x, y)[1].item()
    model.train()
    return losses.mean().item()


def get_lr(it):
    if it < warmup_iters:
        lr = learning_rate * (it + 1) / (warmup_iters + 1)
    elif it > lr_decay_iters:
        lr = min_lr
    else:
        ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        lr = min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)
    if lr_jump_at and it >= lr_jump_at:
        lr *= lr_jump  # the user's bug
    return lr


t0 = time.time()
t_last = t0
for iter_num in range(1, max_iters + 1):
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    X, Y = get_batch("train")
    logits, loss = model(X, Y)
    if nan_from and iter_num >= nan_from:
        loss = loss * torch.log(torch.tensor(-1.0))  # the user's bug: NaN made in the loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt, t_last = t1 - t_last, t1
    mon.log_step(iter_num, loss=loss, tokens=X.numel(), iter_ms=dt * 1000)  # monitor
    if iter_num % eval_interval == 0:
        val = estimate_loss()
        mon.log_eval(iter_num, val_loss=val)  # monitor
        print(f"step {iter_num}: val loss {val:.4f}")
print(f"done in {time.time() - t0:.1f}s")
mon.close()  # monitor
