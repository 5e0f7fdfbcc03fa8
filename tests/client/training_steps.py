"""The loop the client tests train with: optimizer steps of a small model on a batch of
ones, each logged with a loss of 1.0."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def log_steps(mon: Any, model: torch.nn.Module, opt: torch.optim.Optimizer,
              steps: Iterable[int], batch: int = 3) -> None:
    """Train and log each of ``steps``: forward, backward, step, zero_grad, ``log_step``."""
    features = next(model.parameters()).shape[-1]
    for step in steps:
        model(torch.ones(batch, features)).sum().backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=1.0)
