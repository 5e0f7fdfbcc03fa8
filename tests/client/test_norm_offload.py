"""The every-step gradient norms read beside the optimizer's step on the CPU
(``_norm_worker.py``) send the records the training thread's own read sends: the same
scripts, through the real client and the real HTTP receiver, with the worker on and off."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from monitor_client import Monitor, MonitorSettings
from monitor_client._norm_worker import WayChooser
from tests.eventually import eventually

# What a step record says that depends on the clock or the machine, not on the training.
_CLOCKED = {"time", "step_time", "samples_per_second", "tokens_per_second", "memory",
            "run_id", "attempt", "data_time"}
STEPS = 56  # past the trial, a layer-statistics step (25, 50) and a distributions step (50)


def _mlp(seed: int, out: int = 1) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, out))


def _batches(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)


def _train(mon: Monitor, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """The plain loop, under ``mon``: forward, backward, step, zero, log."""
    mon.watch(model, opt)
    _loop(mon, model, opt)


def _loop(mon: Monitor, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    for step, (x, y) in zip(range(STEPS), _batches(), strict=False):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss.detach())


def adamw(mon: Monitor) -> None:
    model = _mlp(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _train(mon, model, opt)


def sgd_maximize(mon: Monitor) -> None:
    model = _mlp(0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=0.01,
                          maximize=True)
    mon.watch(model, opt)
    for step, (x, y) in zip(range(STEPS), _batches(), strict=False):
        loss = -nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss.detach())


def lbfgs_closure(mon: Monitor) -> None:
    model = _mlp(0)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    mon.watch(model, opt)
    for step, (x, y) in zip(range(STEPS), _batches(), strict=False):
        def closure(x=x, y=y):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        loss = opt.step(closure)
        mon.log_step(step, loss=loss.detach())


def no_optimizer(mon: Monitor) -> None:
    model = _mlp(0)
    mon.watch(model)
    for step, (x, y) in zip(range(STEPS), _batches(), strict=False):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        mon.before_optimizer_step()
        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-2 * p.grad
                p.grad = None
        mon.log_step(step, loss=loss.detach())


def accumulation(mon: Monitor) -> None:
    model = _mlp(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon.watch(model, opt)
    batches = _batches()
    for step in range(STEPS):
        for _ in range(2):  # two micro-batches a step, the gradients zeroed in place
            x, y = next(batches)
            loss = nn.functional.mse_loss(model(x), y) / 2
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        mon.log_step(step, loss=loss.detach())


def gan(mon: Monitor) -> None:
    g, d = _mlp(0, out=8), _mlp(1)
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=1e-3, betas=(0.5, 0.999))
    mon.watch(g, opt_g, name="G")
    mon.watch(d, opt_d, name="D")
    bce = nn.BCEWithLogitsLoss()
    for step, (z, _) in zip(range(STEPS), _batches(), strict=False):
        real = torch.randn(16, 8) + 2.0
        fake = g(z)
        loss_d = bce(d(real), torch.ones(16, 1)) + bce(d(fake.detach()), torch.zeros(16, 1))
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        loss_g = bce(d(fake), torch.ones(16, 1))  # also fills D's gradients, zeroed above
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        mon.log_step(step, loss=loss_g.detach(), loss_d=loss_d.detach())


class ScaledInPlace(torch.optim.Optimizer):
    """A custom optimizer (plain SGD) that scales the gradients in place inside its step
    (its own clipping) from step ``from_step`` on: before it, its steps leave them alone.
    (Not a subclass of SGD calling ``super().step()``: torch would run the step hooks
    twice once another SGD has been made in the process.)"""

    def __init__(self, params, from_step: int, through_data: bool = False) -> None:
        super().__init__(params, {"lr": 1e-3})
        self.from_step, self.count, self.through_data = from_step, 0, through_data

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if self.count >= self.from_step:
                    # (through .data: a write torch's version count of p.grad misses)
                    (p.grad.data if self.through_data else p.grad).mul_(0.5)
                p.add_(p.grad, alpha=-group["lr"])
        self.count += 1


def in_place(mon: Monitor, from_step: int = 1, through_data: bool = False) -> None:
    """From its second step on (its first is a layer-statistics step, read before it)."""
    model = _mlp(0)
    opt = ScaledInPlace(model.parameters(), from_step, through_data)
    _train(mon, model, opt)


def through_data(mon: Monitor) -> None:
    in_place(mon, through_data=True)


def _run(receiver, tmp_path, script: Callable[[Monitor], None], beside: bool,
         run_id: str, way: bool | None = None) -> tuple[dict[int, dict], Monitor]:
    """``way``: each eligible step read beside it (True) or on the training thread (False)
    instead of the faster way measured (None, the default)."""
    receiver.records.clear()
    mon = Monitor(url=receiver.url, project="beside", run_id=run_id,
                  settings=MonitorSettings(spool_dir=tmp_path / run_id, install_hooks=False,
                                           linger=0.02, timeout=(0.5, 5.0)))
    original = mon.watch

    def watch(*args, **kwargs):  # the training thread's own read when not beside
        original(*args, **kwargs)
        for entry in mon._models.entries:
            entry.stats._offload.off = entry.stats._offload.off or not beside
            if way is not None:
                entry.stats._offload.ways = WayChooser(fixed=way)

    mon.watch = watch  # type: ignore[method-assign]
    script(mon)
    mon.close(timeout=10)
    steps = {r["step"]: {k: v for k, v in r.items() if k not in _CLOCKED}
             for r in receiver.of_kind("step")}
    return steps, mon


@pytest.mark.parametrize("script", [adamw, sgd_maximize, lbfgs_closure, no_optimizer,
                                    accumulation, gan, in_place, through_data],
                         ids=lambda f: f.__name__)
def test_the_norms_read_beside_the_step_send_the_same_records(receiver, tmp_path, script):
    beside, mon = _run(receiver, tmp_path, script, True, "beside")
    alone, _ = _run(receiver, tmp_path, script, False, "alone")
    assert sorted(beside) == sorted(alone) == list(range(STEPS))
    for step in alone:
        assert beside[step] == alone[step], step
    if script is not gan:  # (a run of several models names each one's norm apart)
        assert all(isinstance(r.get("grad_norm"), float) for r in beside.values())
    offloads = [entry.stats._offload for entry in mon._models.entries]
    # Read beside the step exactly where that is exact: after the trial, for an optimizer
    # whose step leaves the gradients alone (never for a closure, none, or one that writes).
    read_beside = [o.worker is not None for o in offloads]
    expected = script in (adamw, sgd_maximize, accumulation, gan)
    assert read_beside == [expected] * len(offloads), read_beside
    # close() ends this Monitor's workers: a Monitor made and closed leaves no thread behind
    threads = [o.worker._thread for o in offloads if o.worker is not None]
    assert all(t is not None and t.name == "monitor-grad-norms" for t in threads)
    eventually(lambda: not any(t.is_alive() for t in threads), what="the workers end")


def test_a_step_that_writes_to_the_gradients_after_the_trial_has_no_norm(receiver,
                                                                         tmp_path):
    """An optimizer seen leaving the gradients alone through the trial, and scaling them in
    place on step 20: the norms read beside that step may be of either, so the step is
    sent without one (a gap, as the detectors read it); every later step is read on the
    training thread and is the same as without the worker."""
    def script(mon: Monitor) -> None:
        in_place(mon, from_step=20)

    beside, mon = _run(receiver, tmp_path, script, True, "late-beside", way=True)
    alone, _ = _run(receiver, tmp_path, script, False, "late-alone")
    assert beside[20].get("grad_norm") is None and beside[20].get("param_grad_norm") is None
    assert isinstance(alone[20]["grad_norm"], float)
    for step in alone:
        if step != 20:
            assert beside[step] == alone[step], step
    assert mon._models.first.stats._offload.off  # on the training thread from then on


def test_a_step_read_here_as_the_faster_way_is_checked_as_one_read_beside(receiver,
                                                                          tmp_path):
    """The same optimizer, each eligible step read on the training thread because that way
    was measured faster: step 20's norm was read before the step wrote to the gradients,
    so it is the step's own (no gap), and the write is seen all the same: from then on
    every step is read before the optimizer steps, as after a write seen beside it."""
    def script(mon: Monitor) -> None:
        in_place(mon, from_step=20)

    here, mon = _run(receiver, tmp_path, script, True, "late-here", way=False)
    alone, _ = _run(receiver, tmp_path, script, False, "late-alone")
    assert here == alone
    offload = mon._models.first.stats._offload
    assert offload.off and offload.worker is None  # never handed to a worker


def test_each_way_is_tried_and_the_faster_kept(receiver, tmp_path):
    """Past the trial, the eligible steps alternate between the two ways until each was
    timed ``SAMPLES`` times, and the records are the training thread's own either way."""
    ways: list[WayChooser] = []

    def script(mon: Monitor) -> None:
        model = _mlp(0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon.watch(model, opt)
        chooser = mon._models.first.stats._offload.ways
        assert chooser is not None
        ways.append(chooser)
        taken: list[bool] = []
        original = chooser.took
        chooser.took = lambda beside, seconds: (taken.append(beside),  # type: ignore
                                                original(beside, seconds))
        _loop(mon, model, opt)
        comparison = taken[:2 * WayChooser.SAMPLES]
        assert comparison == [True, False] * WayChooser.SAMPLES, taken
        assert set(taken[2 * WayChooser.SAMPLES:]) == {chooser.beside}, taken

    chosen, mon = _run(receiver, tmp_path, script, True, "ways")
    alone, _ = _run(receiver, tmp_path, adamw, False, "ways-alone")
    assert chosen == alone
    assert ways and not mon._models.first.stats._offload.off
