"""Hooks: what the client hooks on a model and its optimizer is all gone once the run ends,
whatever ``watch()`` measured (a hook left behind would run in the next training loop)."""

from __future__ import annotations

import torch
from training_steps import log_steps

from monitor_client import GuardSettings, Monitor, MonitorSettings, WatchSettings
from monitor_client._hooks import Hooks


def _hook_counts(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    modules = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    params = sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
                 for p in model.parameters())
    return (modules + params + len(opt._optimizer_step_pre_hooks)
            + len(opt._optimizer_step_post_hooks))


def test_a_closed_monitor_leaves_no_hook_on_the_model_or_the_optimizer(receiver, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = Monitor(receiver.url, "hooks", run_id="hooks", settings=MonitorSettings(
        spool_dir=tmp_path, install_hooks=False, linger=0.02, world_size=2, rank=0,
        watch=WatchSettings(activations=True, guard=GuardSettings())))
    mon.watch(model, opt, grad_clip=1.0)
    hooked = _hook_counts(model, opt)
    log_steps(mon, model, opt, (1, 2))
    assert mon.close(timeout=10)
    # stats, guard, timings (world_size 2), finite flags, activations, the watchdog's phase
    assert hooked > 10 and _hook_counts(model, opt) == 0


def test_hooks_remove_what_they_hold_once():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks = Hooks().around_step(opt, before=lambda: None, after=lambda: None)
    hooks.add(model.register_forward_hook(lambda *_: None))
    assert len(hooks) == 3 and _hook_counts(model, opt) == 3
    hooks.remove()
    hooks.remove()
    assert len(hooks) == 0 and _hook_counts(model, opt) == 0
