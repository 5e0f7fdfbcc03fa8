"""The client's split of a data-parallel step: all-reduce wait and own compute
(``_timings.py``), through a real Monitor and a loopback receiver."""

from __future__ import annotations

import time

import torch

from monitor_client import Monitor, MonitorConfig
from monitor_client._timings import StepTimings

WAIT = 0.05


def _train(url: str, tmp_path, world_size: int, steps: int = 4, **log) -> None:
    mon = Monitor(url=url, project="timings", run_id=f"timings-{world_size}",
                  settings=MonitorConfig(spool_dir=tmp_path, world_size=world_size, rank=0,
                                         install_hooks=False, gpu_probe=None))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, opt)
    batches = [torch.randn(4, 8) for _ in range(steps)]
    for step, x in enumerate(mon.timed(batches), 1):
        model(x).pow(2).mean().backward()
        time.sleep(WAIT)  # where DDP's end-of-backward waits for the peers' all-reduce
        opt.step()
        opt.zero_grad()
        mon.log_step(step, **log)
    mon.close()


def test_a_distributed_step_is_split_into_wait_and_compute(receiver, tmp_path):
    _train(receiver.url, tmp_path, world_size=4)
    steps = receiver.of_kind("step")
    assert len(steps) == 4
    for r in steps:
        assert r["sync_wait_time"] >= WAIT
        assert r["compute_time"] >= 0
        parts = r["sync_wait_time"] + r["compute_time"] + (r["data_time"] or 0)
        assert abs(parts - r["step_time"]) < 1e-9


def test_a_single_process_run_sends_no_split(receiver, tmp_path):
    _train(receiver.url, tmp_path, world_size=1)
    steps = receiver.of_kind("step")
    assert steps and all(r.get("sync_wait_time") is None for r in steps)
    assert all(r.get("compute_time") is None for r in steps)


def test_the_scripts_own_figures_win(receiver, tmp_path):
    _train(receiver.url, tmp_path, world_size=4, sync_wait_time=0.5, compute_time=0.25)
    steps = receiver.of_kind("step")
    assert steps and {(r["sync_wait_time"], r["compute_time"]) for r in steps} == {(0.5, 0.25)}


def test_a_closure_step_has_no_gap_to_measure():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=1)
    timings = StepTimings(list(model.parameters()), opt).attach()

    def closure():
        opt.zero_grad()
        loss = model(torch.ones(2, 3)).sum()
        loss.backward()  # inside step(): after the optimizer's pre-hook
        return loss

    opt.step(closure)
    assert timings.take() is None
    model(torch.ones(2, 3)).sum().backward()
    opt.step(closure)  # an earlier backward does not count as this step's wait either
    assert timings.take() is None
    timings.detach()
