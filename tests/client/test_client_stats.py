import math

import pytest
import torch

from monitor_client._stats import GradStats


def _model(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Flatten(),
                                torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model.add_module("unused", torch.nn.Linear(3, 3))
    return model


def _loss(model, seed=1):
    g = torch.Generator(torch.get_default_device()).manual_seed(seed)
    x = torch.randint(0, 10, (4, 2), generator=g)  # 8 ids < 10 rows: some unused
    return model[:5](x).pow(2).mean()


def _run_step(model, opt, stats, seed=1):
    loss = _loss(model, seed)
    opt.zero_grad()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.step()
    pack = stats.take()
    return pack.decode(pack.vector().tolist()), grads, before


def test_per_layer_statistics_match_a_naive_reference():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = GradStats(model, opt, layer_stats_every=1).attach()
    out, grads, before = _run_step(model, opt, stats)
    total = math.sqrt(sum(float(g.norm()) ** 2 for g in grads.values()))
    assert out["grad_norm"] == pytest.approx(total, rel=1e-5)
    params = dict(model.named_parameters())
    for name, g in grads.items():
        layer = out["layers"][name]
        assert layer["grad_norm"] == pytest.approx(float(g.norm()), rel=1e-5)
        assert layer["grad_mean"] == pytest.approx(float(g.mean()), rel=1e-4, abs=1e-9)
        assert layer["grad_std"] == pytest.approx(float(g.std()), rel=1e-3)
        assert layer["grad_max_abs"] == pytest.approx(float(g.abs().max()), rel=1e-6)
        assert layer["grad_zero_frac"] == pytest.approx(float((g == 0).float().mean()))
        assert layer["param_norm"] == pytest.approx(float(params[name].detach().norm()), rel=1e-5)
        upd = float((params[name].detach() - before[name]).norm())
        assert layer["update_norm"] == pytest.approx(upd, rel=1e-4)
    assert out["layers"]["0.weight"]["grad_zero_frac"] > 0  # unused embedding rows
    assert out["layers"]["unused.weight"] == {
        "param_norm": pytest.approx(float(params["unused.weight"].detach().norm())),
        "update_norm": 0.0, "grad_none": True}


def test_clipping_matches_clip_grad_norm_and_norm_is_pre_clip():
    ours, ref = _model(), _model()
    opt_a = torch.optim.SGD(ours.parameters(), lr=0.5)
    opt_b = torch.optim.SGD(ref.parameters(), lr=0.5)
    stats = GradStats(ours, opt_a, grad_clip=0.05).attach()
    out, grads, _ = _run_step(ours, opt_a, stats)
    loss = _loss(ref)
    loss.backward()
    pre = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    opt_b.step()
    assert out["grad_norm"] == pytest.approx(float(pre), rel=1e-6)
    assert out["grad_norm"] > 0.05
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_layer_stats_only_every_n_steps_global_norm_every_step():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = GradStats(model, opt, layer_stats_every=3).attach()
    outs = [_run_step(model, opt, stats, seed=i)[0] for i in range(7)]
    assert [("layers" in o) for o in outs] == [True, False, False, True, False, False, True]
    assert all(o["grad_norm"] > 0 for o in outs)
    assert all(("param_norm" in o) == ("layers" in o) for o in outs)


def test_nonfinite_gradients_are_reported_not_hidden():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = GradStats(model, opt, grad_clip=1.0, layer_stats_every=1).attach()
    loss = _loss(model) * float("nan")
    loss.backward()
    opt.step()
    pack = stats.take()
    out = pack.decode(pack.vector().tolist())
    assert math.isnan(out["grad_norm"])
    assert math.isnan(out["layers"]["4.weight"]["grad_norm"])
    assert math.isnan(out["layers"]["4.weight"]["update_norm"])


def test_snapshot_budget_rotates_chunks_and_never_reports_nan_for_the_rest():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    budget = 600  # bytes: smaller than all parameters together (~1.3 KB)
    stats = GradStats(model, opt, layer_stats_every=1, snapshot_budget_bytes=budget).attach()
    covered = set()
    for i in range(6):
        out = _run_step(model, opt, stats, seed=i)[0]
        assert "update_norm" not in out  # global needs every layer
        has = {n for n, layer in out["layers"].items() if "update_norm" in layer}
        assert has and all(not math.isnan(out["layers"][n]["update_norm"]) for n in has)
        covered |= has
    assert covered == set(dict(model.named_parameters()))


def test_no_step_means_skipped_and_gradients_measured_at_take():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = GradStats(model, opt).attach()
    _loss(model).backward()  # e.g. a GradScaler found inf and did not call step()
    pack = stats.take()
    assert not pack.stepped
    assert pack.decode(pack.vector().tolist())["grad_norm"] > 0


def _spy_host_copies(monkeypatch, calls):
    for name in ("item", "tolist", "__float__", "__bool__", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _n=name, _o=original, **k):
            calls.append(_n)
            return _o(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)


def test_hooks_never_copy_to_host(monkeypatch):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stats = GradStats(model, opt, grad_clip=1.0, layer_stats_every=1)  # hooks called by hand
    _loss(model).backward()
    calls = []
    _spy_host_copies(monkeypatch, calls)
    stats.before_step()
    monkeypatch.undo()
    opt.step()  # AdamW itself may read its step counter; that is not ours to count
    _spy_host_copies(monkeypatch, calls)
    stats.after_step()
    pack = stats.take()
    monkeypatch.undo()
    assert calls == []
    vector = pack.vector()  # the one host copy, made later by the sender thread
    assert vector.ndim == 1 and vector.numel() > 5 * 7


def test_sharded_norms_are_all_reduced_across_the_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        stats = GradStats(model, opt, grad_clip=0.05, layer_stats_every=1,
                          reduce_group=dist.group.WORLD).attach()
        out, grads, _ = _run_step(model, opt, stats)
        total = math.sqrt(sum(float(g.norm()) ** 2 for g in grads.values()))
        assert out["grad_norm"] == pytest.approx(total, rel=1e-5)
        assert out["param_norm"] > 0 and out["update_norm"] > 0
    finally:
        dist.destroy_process_group()
