"""Activation statistics: correct numbers, hooks only on monitored steps, clean removal."""

from __future__ import annotations

import math

import httpx
import pytest
import torch
from torch import nn

from monitor_agent.settings import load_settings
from monitor_client import Monitor, MonitorSettings, WatchSettings
from monitor_client._activations import ActivationStats, default_filter, measure
from monitor_client._stats import StatsPack
from tests.live_server import LiveServer


def _decoded(acts: ActivationStats) -> dict:
    pack = StatsPack()
    acts.add_to(pack)
    vec = pack.vector()
    return pack.decode(vec.tolist()).get("activations", {}) if vec is not None else {}


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


def test_statistics_match_a_direct_computation():
    x = torch.randn(6, 5, 7)
    x[x < -0.5] = 0.0
    x[0, 0, 0] = math.inf
    x[1, 2, 3] = math.nan
    got = dict(zip(("mean", "std", "max_abs", "zero_frac", "dead_frac", "nonfinite"),
                   measure(x, dead=False).tolist(), strict=True))
    assert got["nonfinite"] == 2 and math.isnan(got["dead_frac"])
    assert math.isnan(got["mean"])  # a NaN activation makes the moments NaN: that is data
    y = torch.randn(6, 5, 7)
    y[y < 0.3] = 0.0
    mean, std, max_abs, zero, dead, bad = measure(y, dead=True).tolist()
    assert mean == pytest.approx(y.mean().item(), rel=1e-5)
    assert std == pytest.approx(y.std(correction=0).item(), rel=1e-5)
    assert max_abs == pytest.approx(y.abs().max().item())
    assert zero == pytest.approx((y == 0).float().mean().item())
    assert dead == pytest.approx((y == 0).all(dim=(0, 1)).float().mean().item()) and bad == 0


def test_dead_fraction_of_a_relu_with_killed_units():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 20), nn.ReLU(), nn.Linear(20, 3), nn.GELU())
    with torch.no_grad():
        model[0].bias[:5] = -1e3  # 5 of 20 units can never fire
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    acts = ActivationStats(model, opt, every=1).attach()
    model(torch.randn(64, 8)).sum().backward()
    opt.step()
    found = _decoded(acts)
    assert set(found) == {"1", "3"}
    assert found["1"]["dead_frac"] == pytest.approx(0.25) and found["3"]["dead_frac"] is None
    acts.detach()


def test_conv_dead_fraction_is_per_channel():
    x = torch.rand(4, 6, 5, 5)
    x[:, [1, 4]] = 0.0
    assert measure(x, dead=True)[4].item() == pytest.approx(2 / 6)


def test_hooks_exist_only_for_monitored_steps_and_first_micro_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    acts = ActivationStats(model, opt, every=3).attach()
    seen, measured = [], []
    for _ in range(7):
        seen.append(_hooks(model))
        first = torch.randn(5, 4)
        for micro in (first, torch.randn(5, 4) * 100):  # accumulation: 2 micro-batches
            model(micro).sum().backward()
        opt.step()
        opt.zero_grad()
        found = _decoded(acts)
        measured.append(bool(found))
        if found:
            relu = torch.relu(model[0](first))  # weights moved: compare the scale only
            assert found["1"]["max_abs"] < 10 * relu.abs().max().item() + 1
    assert seen == [1, 0, 0, 1, 0, 0, 1]
    assert measured == [True, False, False, True, False, False, True]
    acts.detach()
    assert _hooks(model) == 0 and not opt._optimizer_step_post_hooks


def test_eval_forwards_are_not_measured():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    acts = ActivationStats(model, opt, every=1).attach()
    model.eval()
    model(torch.full((2, 4), 1e6))
    assert _hooks(model) == 1  # still waiting for the training forward
    model.train()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert _decoded(acts)["1"]["max_abs"] < 1e3
    acts.detach()


def test_module_choice_and_cap():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.SiLU(), nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert ActivationStats(model, opt).names == ["1", "3", "4"]
    assert ActivationStats(model, opt, modules=nn.Linear).names == ["0", "2"]
    assert ActivationStats(model, opt, modules=lambda n, m: n == "3").names == ["3"]
    capped = ActivationStats(model, opt, max_modules=2)
    assert capped.names == ["1", "3"] and capped.skipped == 1

    class NewGELUActivation(nn.Module):  # transformers' naming
        def forward(self, x):
            return x

    assert default_filter("h.0.mlp.act", NewGELUActivation())


def _tiny_run(mon: Monitor, steps: int = 7) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon.watch(model, opt,
              settings=WatchSettings(layer_stats_every=4, activations=True, activation_every=3))
    for step in range(1, steps + 1):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss.detach(), samples=16)
    return model


def test_monitor_to_a_live_sidecar_shows_the_gauges(tmp_path):
    with LiveServer(load_settings(data_dir=tmp_path / "data")) as srv:
        mon = Monitor(url=srv.url, project="acts", run_id="acts-1",
                      settings=MonitorSettings(spool_dir=tmp_path / "spool", install_hooks=False,
                                               linger=0.02, timeout=(0.5, 5.0)))
        model = _tiny_run(mon)
        assert mon.close(timeout=20)
        assert _hooks(model) == 0  # close() removed every hook
        steps = httpx.get(f"{srv.url}/v1/runs/acts-1/records", params={"since_step": 0},
                          timeout=10).json()
        steps = steps.get("records", steps) if isinstance(steps, dict) else steps
        with_acts = [r["step"] for r in steps if r["kind"] == "step" and r.get("activations")]
        assert with_acts == [1, 4, 7]
        body = httpx.get(srv.url + "/metrics", timeout=10).text
    labels = 'project="acts",run_id="acts-1",rank="0",module="1"'
    for name in ("mean", "std", "max_abs", "zero_ratio", "dead_ratio", "nonfinite"):
        assert f"training_activation_{name}{{{labels}}}" in body, name
    assert f"training_activation_nonfinite{{{labels}}} 0.0" in body
