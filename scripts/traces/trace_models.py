"""The small models and data of ``record_traces.py`` (real training, CPU, seconds).

Example::

    data, vocab = char_data()
    model = CharGPT(vocab, d=64, n_layers=2, heads=4, seq=64)
    loss = model.loss(batch[:, :-1], batch[:, 1:])
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

PRINTABLE = "".join(chr(c) for c in range(32, 127)) + "\n\t"


def char_data(max_chars: int = 2_000_000) -> tuple[torch.Tensor, int]:
    """The CPython standard library's .py files as characters (98 symbols), as one tensor."""
    ids, _ = char_data_by_file(max_chars)
    return ids, len(PRINTABLE)


def char_data_by_file(max_chars: int = 2_000_000) -> tuple[torch.Tensor, list[tuple[int, str]]]:
    """``char_data``'s tensor and where each file starts: (offset, module name)."""
    lib = Path(os.__file__).parent
    text, starts, size = [], [], 0
    for path in sorted(lib.glob("*.py")):
        chunk = path.read_text(errors="ignore")
        text.append(chunk)
        starts.append((size, path.stem))
        size += len(chunk)
        if size >= max_chars:
            break
    index = {c: i for i, c in enumerate(PRINTABLE)}
    ids = [index.get(c, 0) for c in "".join(text)[:max_chars]]
    return torch.tensor(ids, dtype=torch.long), starts


def teacher_data(n: int, d_in: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian inputs labelled by a fixed random 2-layer teacher network."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=gen)
    w1 = torch.randn(d_in, 64, generator=gen) / d_in ** 0.5
    w2 = torch.randn(64, classes, generator=gen) / 8.0
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool = True) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn_qkv, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp_fc, self.act, self.mlp_proj = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.attn_qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(self.act(self.mlp_fc(self.ln_2(x))))


class CharGPT(nn.Module):
    """Pre-LayerNorm decoder-only transformer over characters."""

    def __init__(self, vocab: int, d: int, n_layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
