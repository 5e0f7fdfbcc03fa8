"""The tasks of the corpus runs (``corpus_runs.py``): a model, its data and its loss.

Each ``Task`` draws a training batch of any size, evaluates on a fixed validation set and
computes its loss, so one training loop serves every architecture. Everything is small
enough to train a few hundred steps in seconds on one CPU thread.

Example::

    task = make_task("cnn", seed=3)
    x, y = task.batch(32, gen)
    loss = task.loss(x, y, smoothing=0.0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from scripts.traces.trace_models import PRINTABLE, Block, CharGPT, char_data, teacher_data

SEQ = 32  # characters per sample of the sequence tasks


@dataclass
class Task:
    model: nn.Module
    batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    val: tuple[torch.Tensor, torch.Tensor]
    tokens_per_sample: int
    seq_len: int | None
    data: str
    sequence: bool  # the loss is per token over (batch, time)

    def loss(self, x: torch.Tensor, y: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
        logits = self.model(x)
        if self.sequence:
            logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        return F.cross_entropy(logits, y, label_smoothing=smoothing)


class SmallCNN(nn.Module):
    def __init__(self, width: int = 8, bn: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.norm = nn.BatchNorm2d(2 * width) if bn else nn.Identity()
        self.fc = nn.Linear(2 * width * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.norm(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


class CharRNN(nn.Module):
    """Embedding -> one GRU or LSTM layer -> vocabulary logits, per character."""

    def __init__(self, cell: str, vocab: int, emb: int = 24, hidden: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = (nn.GRU if cell == "gru" else nn.LSTM)(emb, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)
        self.poison = False  # the nan_hidden fault: a NaN initial state for one batch

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        if self.poison:
            h = torch.full((1, idx.shape[0], self.rnn.hidden_size), float("nan"))
            out, _ = self.rnn(x, h if isinstance(self.rnn, nn.GRU) else (h, h))
        else:
            out, _ = self.rnn(x)
        return self.head(out)


class TinyViT(nn.Module):
    """4x4 patches of a 16x16 image -> 16 tokens -> bidirectional pre-LN blocks -> mean pool."""

    def __init__(self, d: int = 48, n_layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.patch = nn.Linear(16, d)
        self.pos = nn.Parameter(torch.randn(16, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, causal=False) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        p = x.reshape(b, 4, 4, 4, 4).permute(0, 1, 3, 2, 4).reshape(b, 16, 16)
        h = self.patch(p) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h).mean(1))


def mlp(widths: list[int], act: type[nn.Module], dropout: float = 0.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers += [act(), nn.Dropout(dropout)] if dropout else [act()]
    return nn.Sequential(*layers)


def prototype_images(n: int, seed: int, noise: float = 0.6) -> tuple[torch.Tensor, torch.Tensor]:
    """1x16x16 images of 10 smooth random prototypes, each shifted by up to 2 px and noised."""
    gen = torch.Generator().manual_seed(1000)  # the same 10 classes for every run
    protos = F.avg_pool2d(torch.randn(10, 1, 20, 20, generator=gen), 5, stride=1)  # 16x16
    protos = protos / protos.std(dim=(1, 2, 3), keepdim=True)
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=gen)
    shifts = torch.randint(-2, 3, (n, 2), generator=gen)
    x = torch.stack([protos[c].roll((int(s[0]), int(s[1])), dims=(1, 2))
                     for c, s in zip(y, shifts, strict=True)])
    return x + noise * torch.randn(x.shape, generator=gen), y


def _pool(x: torch.Tensor, y: torch.Tensor, n_val: int):
    (x, xv), (y, yv) = x.split([len(x) - n_val, n_val]), y.split([len(y) - n_val, n_val])

    def batch(size: int, gen: torch.Generator):
        idx = torch.randint(0, len(x), (size,), generator=gen)
        return x[idx], y[idx]

    return batch, (xv, yv)


def _chars(seed: int):
    data, _ = char_data(600_000)
    split = int(0.95 * len(data))
    train, val = data[:split], data[split:]
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(val) - SEQ - 1, (64,), generator=gen)
    vb = torch.stack([val[s:s + SEQ + 1] for s in starts])

    def batch(size: int, g: torch.Generator):
        s = torch.randint(0, len(train) - SEQ - 1, (size,), generator=g)
        b = torch.stack([train[i:i + SEQ + 1] for i in s])
        return b[:, :-1], b[:, 1:]

    return batch, (vb[:, :-1], vb[:, 1:])


def make_task(arch: str, seed: int, **kw) -> Task:
    """``arch``: mlp (``depth``, ``width``, ``act``, ``dropout``), cnn (``bn``), gru, lstm,
    vit, gpt."""
    torch.manual_seed(seed)
    if arch == "mlp":
        act = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}[kw.get("act", "relu")]
        width, depth = kw.get("width", 128), kw.get("depth", 3)
        model = mlp([32] + [width] * depth + [10], act, kw.get("dropout", 0.0))
        batch, val = _pool(*teacher_data(n=8192 + 1024, d_in=32, classes=10, seed=seed), 1024)
        return Task(model, batch, val, 1, None, "teacher-labelled gaussians (32-d, 10 classes)",
                    False)
    if arch in ("cnn", "vit"):
        model = SmallCNN(bn=kw.get("bn", False)) if arch == "cnn" else TinyViT()
        batch, val = _pool(*prototype_images(8192 + 1024, seed), 1024)
        return Task(model, batch, val, 1, None,
                    "1x16x16 images of 10 shifted, noised smooth prototypes", False)
    batch, val = _chars(seed)
    model = (CharGPT(len(PRINTABLE), d=48, n_layers=2, heads=4, seq=SEQ) if arch == "gpt"
             else CharRNN(arch, len(PRINTABLE)))
    return Task(model, batch, val, SEQ, SEQ, "CPython stdlib .py files as characters", True)
