"""Gradient/weight distributions: numpy-exact on the sample, bounded cost, one host copy,
and the whole way through a real Monitor and a live sidecar."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest
import torch
from test_client_stats import _loss, _model, _spy_host_copies

from monitor_agent.settings import load_settings
from monitor_client import Monitor, MonitorSettings, WatchSettings
from monitor_client._distributions import QUANTILES, Distributions, decode_rows
from monitor_client._stats import GradStats
from tests.live_server import LiveServer


def _tensors():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(300, 20, generator=g),              # sampled (6000 > 1024)
            torch.randn(7, generator=g) * 3 + 1,            # enumerated (7 <= 1024)
            torch.zeros(50),                                # collapsed
            torch.randn(4000, generator=g).pow(3).t()]      # heavy-tailed


def test_quantiles_and_histogram_agree_with_numpy_on_the_sample():
    dist = Distributions(sample=512, bins=8)
    tensors = _tensors()
    rows = dist.measure(tensors)
    sample = dist.gather(tensors).numpy().astype(np.float64)
    assert rows.shape == (4, len(QUANTILES) + 8)
    ref_q = np.quantile(sample, QUANTILES, axis=1).T
    np.testing.assert_allclose(rows[:, :8].numpy(), ref_q, rtol=1e-5, atol=1e-6)
    for i in (0, 1, 3):  # np.histogram's bins are [lo, hi) with the last closed: the same
        ref_c, _ = np.histogram(sample[i], bins=8, range=(sample[i].min(), sample[i].max()))
        np.testing.assert_array_equal(rows[i, 8:].numpy(), ref_c)
    assert rows[2, 8:].sum() == 512 and (rows[2, :8] == 0).all()


def test_small_tensors_are_covered_whole_and_large_ones_sampled_within_range():
    dist = Distributions(sample=256)
    small = torch.arange(10.0)
    assert set(dist.gather([small])[0].tolist()) == set(range(10))
    big = torch.randn(100_000, generator=torch.Generator().manual_seed(7))
    row = dist.measure([big])[0]
    assert big.min() <= row[0] <= row[3] <= row[7] <= big.max()
    # The median of n = 256 draws of N(0, 1) has a standard error of sqrt(pi / 2n) ~ 0.078;
    # five of them leave a right sampler no chance to fail, and a biased one no room.
    assert abs(float(row[3]) - float(big.median())) < 5 * (math.pi / (2 * 256)) ** 0.5


def test_sample_width_is_bounded_for_a_huge_tensor():
    dist = Distributions()
    huge = torch.empty(50_000_000)  # 200 MB: the sample stays 1024 wide
    huge.normal_(generator=torch.Generator().manual_seed(1))
    idx = dist.indices(0, huge.numel(), huge.device)
    assert idx.shape == (1024,) and int(idx.max()) < huge.numel()
    assert dist.gather([huge, torch.ones(3)]).shape == (2, 1024)
    assert dist.indices(0, huge.numel(), huge.device) is idx  # drawn once, cached


def test_indices_are_fixed_by_the_seed():
    a, b = Distributions(seed=3), Distributions(seed=3)
    assert torch.equal(a.indices(5, 10**6, torch.device("cpu")),
                       b.indices(5, 10**6, torch.device("cpu")))
    assert not torch.equal(a.indices(5, 10**6, torch.device("cpu")),
                           a.indices(6, 10**6, torch.device("cpu")))


def test_decode_rows_rebuilds_edges_from_min_and_max():
    row = [-1.0, -0.9, -0.2, 0.0, 0.2, 0.6, 0.9, 1.0] + [1.0, 2.0, 3.0, 4.0]
    out = decode_rows(["w"], row, bins=4)["w"]
    assert out["edges"] == [-1.0, -0.5, 0.0, 0.5, 1.0]
    assert out["counts"] == [1.0, 2.0, 3.0, 4.0] and out["quantiles"] == row[:8]


def _step(model, opt, stats, seed):
    opt.zero_grad()
    _loss(model, seed).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    pack = stats.take()
    return pack.decode(pack.vector().tolist()), grads


def test_grad_stats_adds_pre_clip_grad_and_post_step_weight_distributions():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    stats = GradStats(model, opt, grad_clip=1e-3, hist_every=2).attach()
    outs = [_step(model, opt, stats, seed) for seed in range(3)]
    assert [("grad_hist" in o, "param_hist" in o) for o, _ in outs] == [
        (True, True), (False, False), (True, True)]
    out, grads = outs[2]
    params = dict(model.named_parameters())
    assert set(out["grad_hist"]) == set(grads)  # parameters with a gradient
    assert set(out["param_hist"]) == set(params)  # every watched parameter
    for name, g in grads.items():  # 3.weight has 24 entries: enumerated, exact min/max
        hist = out["grad_hist"][name]
        if g.numel() <= 1024:  # raw (pre-clip) gradient, not the clipped one
            assert hist["quantiles"][0] == pytest.approx(float(g.min()), rel=1e-6)
            assert hist["quantiles"][-1] == pytest.approx(float(g.max()), rel=1e-6)
        assert len(hist["edges"]) == 17 and sum(hist["counts"]) == 1024
    w = params["2.weight"].detach()
    assert out["param_hist"]["2.weight"]["quantiles"][-1] == pytest.approx(float(w.max()))


def test_distributions_add_no_host_copy_to_the_hooks(monkeypatch):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stats = GradStats(model, opt, grad_clip=1.0, hist_every=1)
    _loss(model).backward()
    calls = []
    _spy_host_copies(monkeypatch, calls)
    stats.before_step()
    monkeypatch.undo()
    opt.step()
    _spy_host_copies(monkeypatch, calls)
    stats.after_step()
    pack = stats.take()
    monkeypatch.undo()
    assert calls == []
    names = [entry.name for entry in pack.layout]
    assert names.count("grad_hist") == 1 and names.count("param_hist") == 1
    decoded = pack.decode(pack.vector().tolist())  # the one host copy, by the sender thread
    assert len(decoded["grad_hist"]["2.weight"]["quantiles"]) == 8


def test_monitor_to_live_sidecar_exposes_quantiles_and_stores_grad_hist(tmp_path):
    with LiveServer(load_settings(data_dir=tmp_path / "data")) as srv:
        mon = Monitor(url=srv.url, project="dist", run_id="dist-1",
                      settings=MonitorSettings(spool_dir=tmp_path / "s", install_hooks=False,
                                               linger=0.02, watch=WatchSettings(hist_every=3)))
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon.watch(model, opt, grad_clip=1.0)
        for step in range(1, 8):
            opt.zero_grad()
            loss = _loss(model, step)
            loss.backward()
            opt.step()
            mon.log_step(step, loss=loss.detach(), tokens=8)
        assert mon.flush(timeout=20)
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        records = httpx.get(f"{srv.url}/v1/runs/dist-1/records",
                            params={"since_step": 0, "kind": "step"}, timeout=10).json()
        mon.close(timeout=10)
    assert 'training_layer_grad_quantile{project="dist",run_id="dist-1",rank="0",' \
           'layer="2.weight",q="0.5"}' in metrics
    assert 'layer="4.bias",q="0.99"}' in metrics
    assert "training_layer_param_quantile{" in metrics
    steps = {r["step"]: r for r in records["records"]}
    assert sorted(s for s, r in steps.items() if "grad_hist" in r) == [1, 4, 7]
    hist = steps[4]["grad_hist"]["2.weight"]
    assert len(hist["quantiles"]) == 8 and len(hist["counts"]) == 16
    assert "param_hist" in steps[4] and "grad_hist" not in steps[5]
