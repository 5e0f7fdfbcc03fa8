"""The every-step gradient norm within its share of a CPU step (``_norm_budget.py``): the
stride decided from measured costs, the steps between still checked for NaN, inf and jumps,
and through a real sidecar a NaN gradient on a step without the norm paging on that step."""

from __future__ import annotations

import httpx
import pytest
import torch
from torch import nn

from monitor_agent.settings import load_settings
from monitor_client import Monitor, MonitorSettings, WatchSettings
from monitor_client._norm_budget import WINDOW, NormBudget, norm_stride
from monitor_client._stats import GradStats
from tests.eventually import eventually
from tests.live_server import LiveServer


@pytest.mark.parametrize(("norm_s", "step_s", "share", "most", "every"), [
    (40e-6, 10e-3, 0.005, 25, 1),     # within its share: every step
    (50e-6, 10e-3, 0.005, 25, 1),     # exactly its share
    (51e-6, 10e-3, 0.005, 25, 2),
    (150e-6, 10e-3, 0.005, 25, 3),
    (150e-6, 1e-3, 0.005, 25, 25),    # never rarer than the layer statistics
    (150e-6, 1e-3, 0.0, 25, 1),       # a share of 0: every step
    (150e-6, 0.0, 0.005, 25, 1),      # no step time measured yet
])
def test_the_stride_is_the_smallest_that_keeps_the_norm_in_its_share(norm_s, step_s, share,
                                                                     most, every):
    assert norm_stride(norm_s, step_s, share, most) == every


def test_a_budget_decides_from_the_medians_of_what_it_measured():
    budget = NormBudget(share=0.005, most=25)
    for i in range(WINDOW + 1):
        budget.begin(now=i * 10e-3)              # 10 ms steps
        assert budget.due()                     # every step until it has measured enough
        budget.spent(0.5 if i == 3 else 150e-6)  # one preempted norm does not count
    assert budget.every == 3
    due = []
    for _ in range(6):
        due.append(budget.due())
        if due[-1]:
            budget.spent(150e-6)
        else:
            budget.skipped()
    assert due == [False, False, True, False, False, True]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 1))


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, *,
          nan_grad: bool = False, scale: float = 1.0) -> torch.Tensor:
    """One step; ``nan_grad``: a finite loss whose gradients are NaN (a sqrt of a negative
    masked out of the forward, its backward NaN); ``scale``: the gradients times that."""
    hidden = model[1](model[0](x))
    if nan_grad:
        bad = torch.sqrt(hidden - 1e6)                  # NaN where the forward masks it
        hidden = torch.where(torch.isnan(bad), hidden, bad)
    loss = model[4](model[3](model[2](hidden))).pow(2).mean() * scale
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def test_steps_between_have_no_norm_but_a_nan_or_a_jump_gets_it_on_its_step():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    stats = GradStats(model, opt, layer_stats_every=1000, norm_budget=0.005).attach()
    stats.budget.every, stats.budget.share = 4, 0.0  # held at every 4th step
    stats._steps = 1  # past the first layer-statistics step
    gen = torch.Generator().manual_seed(1)
    got = {}
    for step in range(1, 25):
        x = torch.randn(32, 8, generator=gen)
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        loss = _step(model, opt, x, nan_grad=step == 18, scale=30.0 if step == 22 else 1.0)
        assert torch.isfinite(loss)
        model.load_state_dict(saved)  # the same weights every step: only the batch moves
        pack = stats.take()
        got[step] = pack.decode(pack.host()).get("grad_norm")
    assert [s for s in range(1, 18) if got[s] is not None] == [4, 8, 12, 16]
    assert got[18] != got[18]                  # NaN, on its own step (not due)
    assert got[22] is not None and got[22] > 0  # the jump, on its own step (not due)
    assert got[19] is None and got[23] is None


def test_a_guarded_or_clipped_model_has_its_norm_every_step():
    for kwargs in ({"grad_clip": 1.0}, {}):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        stats = GradStats(model, opt, layer_stats_every=1000, norm_budget=0.005,
                          **kwargs).attach()
        if not kwargs:
            stats.every_step_norm = True  # as Monitor.watch sets it for a guard
        stats.budget.every, stats.budget.share = 4, 0.0
        for _ in range(6):
            _step(model, opt, torch.randn(4, 8))
            pack = stats.take()
            assert pack.decode(pack.host()).get("grad_norm") is not None


def test_a_nan_gradient_on_a_step_without_the_norm_pages_on_that_step(tmp_path):
    """A tiny step under a budget no norm fits (a share of 1e-9): the norm comes every
    ``layer_stats_every`` steps, the run record says the share, and the NaN gradient of a
    step between (its loss finite) is a ``nan_inf`` finding at that step."""
    with LiveServer(load_settings(data_dir=tmp_path / "data")) as srv:
        mon = Monitor(url=srv.url, project="budget", run_id="norm-budget",
                      settings=MonitorSettings(
                          spool_dir=tmp_path / "s", install_hooks=False, linger=0.02,
                          watch=WatchSettings(grad_norm_budget=1e-9, layer_stats_every=8,
                                              hist_every=0)))
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        mon.watch(model, opt)
        gen = torch.Generator().manual_seed(2)
        bad = 30  # 21 steps after the window: between two norms (every 8th step)
        for step in range(1, 36):
            loss = _step(model, opt, torch.randn(32, 8, generator=gen), nan_grad=step == bad)
            if step == bad:
                model.load_state_dict(_model().state_dict())  # the NaN update undone
            mon.log_step(step, loss=loss)
        assert mon.flush(timeout=20)
        records = httpx.get(f"{srv.url}/v1/runs/norm-budget/records",
                            params={"since_step": 0, "kind": "step"}, timeout=10).json()
        steps = {r["step"]: r for r in records["records"]}

        def nan_finding():
            found = httpx.get(f"{srv.url}/v1/runs/norm-budget/findings",
                              timeout=10).json()["findings"]
            nan = [f for f in found if f["type"] == "nan_inf"]
            assert nan, found
            return nan

        found = eventually(nan_finding, timeout=20)
        run = httpx.get(f"{srv.url}/v1/runs/norm-budget", timeout=10).json()
        mon.close(timeout=10)
    without = [s for s in range(WINDOW + 2, 36) if steps[s].get("grad_norm") is None]
    assert len(without) >= 15, steps                      # most steps after the window
    assert steps[bad]["grad_norm"] == "NaN" and isinstance(steps[bad]["loss"], float)
    assert steps[bad - 1].get("grad_norm") is None and steps[bad + 1].get("grad_norm") is None
    assert [f["step"] for f in found] == [bad]
    assert '"grad_norm_budget": 1e-09' in str(run).replace("'", '"')
