"""The client never raises into training, whatever the parameters' dtype or the shape of
the optimizer step (issue 45 point 1): each loop below is written the way a user writes it
from README.md and docs/client.md, runs real steps under ``watch()``, and its records go
through the client's real sender to a loopback endpoint that validates them with the
sidecar's own schema. Every step arrives, not skipped, with its measured gradient norm.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn

from monitor_client import Monitor, MonitorSettings, WatchSettings

STEPS = 6


def _monitor(receiver, tmp_path, run_id: str, **watch) -> Monitor:
    return Monitor(receiver.url, "shapes", run_id=run_id, settings=MonitorSettings(
        spool_dir=tmp_path, install_hooks=False, linger=0.02,
        watch=WatchSettings(layer_stats_every=2, hist_every=3, **watch)))


def _mlp(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).to(dtype)


def _steps(receiver, run_id: str) -> list[dict]:
    steps = sorted((r for r in receiver.of_kind("step") if r["run_id"] == run_id),
                   key=lambda r: r["step"])
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert not any(r.get("skipped") for r in steps)
    return steps


def _plain_loop(mon: Monitor, model: nn.Module, opt: torch.optim.Optimizer,
                dtype: torch.dtype) -> list[float]:
    """forward, backward, step, zero_grad, log_step; returns each step's gradient norm."""
    norms = []
    for step in range(1, STEPS + 1):
        x = torch.randn(16, 4, dtype=dtype)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        loss.backward()
        norms.append(torch.linalg.vector_norm(torch.stack(
            [p.grad.double().norm() for p in model.parameters()])).item())
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss, samples=16)
    return norms


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16],
                         ids=["float64", "bfloat16", "float16"])
@pytest.mark.parametrize("clip", [None, 1.0], ids=["no_clip", "clip"])
def test_every_floating_dtype_trains_and_reports_its_gradient_norm(receiver, tmp_path, dtype,
                                                                  clip):
    model = _mlp(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run_id = f"dtype-{str(dtype)[6:]}-{clip}"
    mon = _monitor(receiver, tmp_path, run_id)
    mon.watch(model, opt, grad_clip=clip)
    norms = _plain_loop(mon, model, opt, dtype)
    assert mon.close(timeout=10)
    steps = _steps(receiver, run_id)
    for record, norm in zip(steps, norms, strict=True):
        assert record["grad_norm"] == pytest.approx(norm, rel=1e-2)
    monitored = [r for r in steps if r.get("layers")]
    assert monitored and all(math.isfinite(layer["grad_norm"]) and "update_norm" in layer
                             for r in monitored for layer in r["layers"].values())
    assert any(r.get("grad_hist") for r in steps)


def test_float64_keeps_what_float32_cannot_hold(receiver, tmp_path):
    """A float64 model's numbers past float32's range stay finite on the wire."""
    model = nn.Linear(2, 1, bias=False).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    mon = _monitor(receiver, tmp_path, "f64-range")
    mon.watch(model, opt)
    with torch.no_grad():
        model.weight.fill_(1e100)
    for step in range(1, STEPS + 1):
        loss = model(torch.ones(1, 2, dtype=torch.float64)).sum() * 1e-100
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss)
    assert mon.close(timeout=10)
    steps = _steps(receiver, "f64-range")
    layer = steps[0]["layers"]["weight"]  # float32 would hold inf and 0.0 here
    assert layer["param_norm"] == pytest.approx(math.sqrt(2) * 1e100)
    assert layer["grad_norm"] == pytest.approx(math.sqrt(2) * 1e-100)
    assert steps[0]["loss"] == pytest.approx(2.0)


@pytest.mark.parametrize("watched", [False, True], ids=["no_watch", "float32_model"])
def test_a_float64_loss_tensor_is_not_narrowed(receiver, tmp_path, watched):
    """A loss computed in float64 and passed as the tensor (the LBFGS time-series example
    without ``watch()``, or a float32 model whose loss is summed in double) arrives with its
    own value: a finite 1e+44 was packed as float32 and arrived as inf (paged as NaN)."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    mon = _monitor(receiver, tmp_path, f"f64-loss-{watched}")
    if watched:
        mon.watch(model, opt)
    losses = [1e44 * step for step in range(1, STEPS + 1)]
    for step, value in enumerate(losses, 1):
        loss = model(torch.ones(1, 4)).double().sum() * 0 + value
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss)
    assert mon.close(timeout=10)
    steps = _steps(receiver, f"f64-loss-{watched}")
    assert [r["loss"] for r in steps] == pytest.approx(losses)


def test_the_device_copy_keeps_a_float64_value():
    """The copy made on an accelerator (one vector of every value) widens to float64 when a
    value is float64, rather than narrowing it to float32."""
    from monitor_client._pack import StatsPack

    pack = StatsPack()
    pack.add("grad_norm", torch.tensor(3.0))
    pack.add("loss", torch.tensor(1e44, dtype=torch.float64))
    pack.add("output_sum", torch.tensor([1.0, 2.0]), layers=["a", "b"])
    vector = pack.vector()
    assert vector is not None and vector.dtype == torch.float64
    assert vector.tolist() == [3.0, 1e44, 1.0, 2.0]


@pytest.mark.parametrize("kind", ["fused", "foreach"])
def test_fused_and_foreach_adamw(receiver, tmp_path, kind):
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **{kind: True})
    mon = _monitor(receiver, tmp_path, f"adamw-{kind}")
    mon.watch(model, opt, grad_clip=1.0)
    norms = _plain_loop(mon, model, opt, torch.float32)
    assert mon.close(timeout=10)
    steps = _steps(receiver, f"adamw-{kind}")
    assert [r["grad_norm"] for r in steps] == pytest.approx(norms, rel=1e-5)


def test_lbfgs_with_a_closure_reports_the_gradient_its_step_computed(receiver, tmp_path):
    """LBFGS computes its gradients inside ``step(closure)``: they are measured once the step
    ran (the last evaluation's), not before, when there are none yet."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1)).double()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    x = torch.randn(32, 3, dtype=torch.float64)
    y = x.sum(dim=1, keepdim=True).sin()
    mon = _monitor(receiver, tmp_path, "lbfgs")
    mon.watch(model, opt)
    last = []

    def closure():
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        last[:] = [torch.linalg.vector_norm(torch.stack(
            [p.grad.norm() for p in model.parameters()])).item()]
        return loss

    for step in range(1, STEPS + 1):
        loss = opt.step(closure)
        mon.log_step(step, loss=loss, samples=32)
        expected = last[0]
        assert expected > 0
    assert mon.close(timeout=10)
    steps = _steps(receiver, "lbfgs")
    assert steps[-1]["grad_norm"] == pytest.approx(expected, rel=1e-6)
    assert all(r["grad_norm"] > 0 for r in steps)
    assert steps[0]["lr"] == 0.5


def test_a_loop_without_torch_optim(receiver, tmp_path):
    """Parameters updated by hand: ``watch(model)`` with no optimizer; gradients are read at
    ``before_optimizer_step()`` (where the update begins), else at ``log_step``."""
    model = _mlp()
    mon = _monitor(receiver, tmp_path, "by-hand")
    mon.watch(model)
    norms = []
    for step in range(1, STEPS + 1):
        x = torch.randn(16, 4)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        loss.backward()
        norms.append(torch.linalg.vector_norm(torch.stack(
            [p.grad.norm() for p in model.parameters()])).item())
        if step % 2:
            mon.before_optimizer_step()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad
        mon.log_step(step, loss=loss, lr=0.05)
        model.zero_grad()
    assert mon.close(timeout=10)
    steps = _steps(receiver, "by-hand")
    assert [r["grad_norm"] for r in steps] == pytest.approx(norms, rel=1e-5)
    monitored = [r for r in steps if r.get("layers")]
    assert monitored and all(r["param_norm"] > 0 for r in monitored)
    # measured before the update: the update's size is known (lr x the gradient)
    first = steps[0]
    assert first["update_norm"] == pytest.approx(0.05 * norms[0], rel=1e-4)


class SignSGD:
    """A user's own optimizer, not a torch.optim.Optimizer: ``step()`` and ``param_groups``,
    none of torch's hook API."""

    def __init__(self, params, lr: float) -> None:
        self.param_groups = [{"params": list(params), "lr": lr}]

    def step(self) -> None:
        with torch.no_grad():
            for p in self.param_groups[0]["params"]:
                p.add_(p.grad.sign(), alpha=-self.param_groups[0]["lr"])

    def zero_grad(self) -> None:
        for p in self.param_groups[0]["params"]:
            p.grad = None


def test_an_optimizer_of_the_users_own_is_hooked_and_clipped(receiver, tmp_path):
    """watch(model, SignSGD(...), grad_clip=0.1): its step is hooked as torch's would be, so
    the gradients are measured and clipped before it (the clip is what the step sees), and
    the update's size is measured after it. Before: one warning about a missing
    ``register_step_pre_hook``, no statistics and no clipping."""
    model = _mlp()
    opt = SignSGD(model.parameters(), lr=0.01)
    mon = _monitor(receiver, tmp_path, "sign-sgd")
    mon.watch(model, opt, grad_clip=0.1)
    seen = []
    for step in range(1, STEPS + 1):
        x = torch.randn(16, 4)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        loss.backward()
        before = [p.grad.clone() for p in model.parameters()]
        opt.step()  # (the client clips in its pre-hook: the step's gradients are clipped)
        seen.append(torch.linalg.vector_norm(torch.stack(
            [p.grad.norm() for p in model.parameters()])).item())
        raw = torch.linalg.vector_norm(torch.stack([g.norm() for g in before])).item()
        assert raw > 0.1  # so the clip did something to see
        opt.zero_grad()
        mon.log_step(step, loss=loss)
    assert mon.close(timeout=10)
    assert seen == pytest.approx([0.1] * STEPS, rel=1e-4)  # clipped to grad_clip
    steps = _steps(receiver, "sign-sgd")
    assert all(r["grad_norm"] > 0.1 for r in steps)  # the norm before the clip
    assert all(r["lr"] == 0.01 for r in steps)
    monitored = [r for r in steps if r.get("layers")]
    assert monitored and all(r["update_norm"] > 0 for r in monitored)


def test_an_optimizer_that_cannot_be_hooked_is_said_so_and_the_model_watched(receiver,
                                                                             tmp_path,
                                                                             caplog):
    """No ``param_groups``: not hookable; the warning says so and that grad_clip= is not
    applied, and the gradients are still read at log_step."""
    class Bare:
        def __init__(self, params) -> None:
            self.params = list(params)

        def step(self) -> None:
            with torch.no_grad():
                for p in self.params:
                    p -= 0.01 * p.grad

    model = _mlp()
    opt = Bare(model.parameters())
    mon = _monitor(receiver, tmp_path, "bare-opt")
    mon.watch(model, opt, grad_clip=1.0)
    for step in range(1, STEPS + 1):
        loss = (model(torch.randn(16, 4)) - 1.0).pow(2).mean()
        loss.backward()
        opt.step()
        mon.log_step(step, loss=loss)
        model.zero_grad()
    assert mon.close(timeout=10)
    said = [r.getMessage() for r in caplog.records if "cannot be hooked" in r.getMessage()]
    assert len(said) == 1 and "Bare" in said[0] and "no param_groups" in said[0]
    assert "grad_clip= is NOT applied" in said[0]
    assert all(r["grad_norm"] > 0 for r in _steps(receiver, "bare-opt"))


def test_a_parameter_group_added_later_is_measured_from_then_on(receiver, tmp_path):
    model = _mlp()
    head = model[2]
    head.requires_grad_(False)
    opt = torch.optim.SGD(model[0].parameters(), lr=0.01)
    extra = nn.Parameter(torch.ones(3))  # not the model's: a learnable scale of the loss
    mon = _monitor(receiver, tmp_path, "groups")
    mon.watch(model, opt)
    for step in range(1, STEPS + 1):
        if step == 3:
            head.requires_grad_(True)
            opt.add_param_group({"params": list(head.parameters()), "lr": 0.02})
            opt.add_param_group({"params": [extra], "lr": 0.02})
        x = torch.randn(16, 4)
        loss = (model(x) - x[:, :1]).pow(2).mean() * extra.sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss)
    assert mon.close(timeout=10)
    steps = _steps(receiver, "groups")
    before, after = steps[0]["layers"], steps[4]["layers"]
    assert set(before) == {"0.weight", "0.bias"}
    assert set(after) == {"0.weight", "0.bias", "2.weight", "2.bias", "param_groups.2.0"}
    assert all(not entry.get("grad_none") for entry in after.values())


def test_a_failing_measurement_is_contained_and_reported_once(receiver, tmp_path, caplog):
    """A parameter the statistics cannot handle (complex, here) costs its measurements,
    never the training step: the step runs, the failure is logged once with its traceback,
    and close() says how many hook calls failed."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2).to(torch.complex64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = _monitor(receiver, tmp_path, "complex")
    mon.watch(model, opt)
    before = model.weight.detach().clone()
    with caplog.at_level(logging.WARNING, logger="monitor_client"):
        for step in range(1, STEPS + 1):
            x = torch.randn(8, 3, dtype=torch.complex64)
            loss = model(x).abs().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log_step(step, loss=loss)
        assert mon.close(timeout=10)
    assert not torch.equal(model.weight.detach(), before)  # training went on
    failures = [r for r in caplog.records if "hook" in r.getMessage() and r.exc_info]
    assert len(failures) >= 1
    assert len({r.getMessage() for r in failures}) == len(failures)  # each site once
    summary = [r.getMessage() for r in caplog.records if "hook calls failed" in r.getMessage()]
    assert summary and "ignored" in summary[0]
    _steps(receiver, "complex")


def test_a_loop_that_logs_every_few_steps_clips_and_measures_every_step(receiver, tmp_path):
    """A loop that calls ``log_step`` every third optimizer step (a common habit, though the
    docs ask for one per step): ``grad_clip=`` clips every step's gradients, not only the
    first of each record's, and each record carries its last step's gradient norm; a
    layer-statistics step that is not the record's last still reaches the record."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the gradients alone change
    mon = _monitor(receiver, tmp_path, "every-third")
    mon.watch(model, opt, grad_clip=1.0)
    clipped, last_norms = [], []
    for step in range(1, 3 * STEPS + 1):
        x = torch.full((16, 4), 10.0 * step)  # each step's gradient larger than the last
        loss = (model(x) - 1.0).pow(2).mean()
        loss.backward()
        raw = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        opt.step()
        clipped.append(torch.linalg.vector_norm(torch.stack(
            [p.grad.norm() for p in model.parameters()])).item())
        opt.zero_grad()
        if step % 3 == 0:
            last_norms.append(raw.item())
            mon.log_step(step // 3, loss=loss)
    assert mon.close(timeout=10)
    assert max(clipped) == pytest.approx(1.0, rel=1e-4)  # every one of the 18 steps
    steps = _steps(receiver, "every-third")
    assert [r["grad_norm"] for r in steps] == pytest.approx(last_norms, rel=1e-5)
    # layer statistics every 2 optimizer steps (0, 2, 4, ... counted from 0): records 2, 4
    # and 6 (steps 3-5, 9-11, 15-17) have theirs from a step before their last
    assert all(r.get("layers") and r["param_norm"] > 0 for r in steps)


def test_a_sparse_embedding_gradient_is_measured_and_clipped(receiver, tmp_path):
    """``nn.Embedding(sparse=True)`` (a recommender's table) hands the optimizer a sparse
    gradient: its norm and statistics are the dense gradient's, and ``grad_clip=`` scales
    it like the others."""
    torch.manual_seed(0)
    emb, head = nn.Embedding(50, 4, sparse=True), nn.Linear(4, 1)
    model = nn.ModuleDict({"emb": emb, "head": head})
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # SGD takes sparse gradients too
    mon = _monitor(receiver, tmp_path, "sparse")
    mon.watch(model, opt, grad_clip=0.5)
    norms, clipped, emb_mean = [], [], []
    for step in range(1, STEPS + 1):
        ids = torch.tensor([[1, 2, 2], [7, 1, 9]])  # a repeated id: duplicate entries
        loss = head(emb(ids).mean(1)).pow(2).mean() * 100
        loss.backward()
        dense = [p.grad.to_dense() for p in (emb.weight, head.weight, head.bias)]
        norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in dense])).item())
        emb_mean.append(dense[0].mean().item())
        opt.step()
        clipped.append(torch.linalg.vector_norm(torch.stack(
            [p.grad.to_dense().norm() for p in model.parameters()])).item())
        opt.zero_grad()
        mon.log_step(step, loss=loss)
    assert mon.close(timeout=10)
    steps = _steps(receiver, "sparse")
    assert [r["grad_norm"] for r in steps] == pytest.approx(norms, rel=1e-5)
    assert max(norms) > 0.5 and max(clipped) == pytest.approx(0.5, rel=1e-4)
    monitored = [(r, mean) for r, mean in zip(steps, emb_mean, strict=True) if r.get("layers")]
    assert monitored
    for record, mean in monitored:  # over all 50 x 4 entries, not the 4 rows it touched
        assert record["layers"]["emb.weight"]["grad_mean"] == pytest.approx(mean, rel=1e-4)
        assert record["layers"]["emb.weight"]["grad_zero_frac"] == pytest.approx(1 - 4 * 4 / 200)


def _wrapped_run(receiver, tmp_path, run_id: str, wrap) -> list[dict]:
    """A user's loop over ``wrap(model)``, watched as the loop holds it; a NaN input row at
    step 4."""
    model = _mlp()
    trained = wrap(model)
    opt = torch.optim.SGD(trained.parameters(), lr=0.01)
    mon = _monitor(receiver, tmp_path, run_id)
    mon.watch(trained, opt)
    for step in range(1, STEPS + 1):
        x = torch.randn(16, 4)
        if step == 4:
            x[0, 0] = float("nan")
        loss = (trained(x) - x[:, :1]).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss, samples=16)
    assert mon.close(timeout=10)
    return sorted((r for r in receiver.records if r.get("run_id") == run_id),
                  key=lambda r: (r["kind"] != "run", r.get("step", 0)))


def _ddp(model: nn.Module) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


@pytest.mark.parametrize("wrap", ["compile", "ddp"])
def test_a_compiled_or_ddp_wrapped_model_is_named_as_the_users_model(receiver, tmp_path, wrap):
    """``torch.compile(model)`` and ``DistributedDataParallel(model)`` prefix every name with
    ``_orig_mod.`` or ``module.``: the records name layers and modules as the user's model
    does, and the run record describes the user's model, not the wrapper."""
    import torch.distributed as dist

    torch._dynamo.reset()
    if wrap == "ddp":
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                                world_size=1)
    try:
        records = _wrapped_run(receiver, tmp_path, f"wrapped-{wrap}",
                               _ddp if wrap == "ddp" else
                               lambda m: torch.compile(m, backend="eager"))
    finally:
        if wrap == "ddp":
            dist.destroy_process_group()
    run = next(r for r in records if r["kind"] == "run")
    assert run["model"]["name"] == "Sequential", run["model"]
    assert run["model"]["layer_order"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    steps = [r for r in records if r["kind"] == "step"]
    layered = [r for r in steps if r.get("layers")]
    assert layered and all(set(r["layers"]) == set(run["model"]["layer_order"])
                           for r in layered)
    nan = next(r for r in steps if r["step"] == 4)
    assert nan["nonfinite_modules"][0] == "0", nan


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class _Blocks(nn.Module):
    """A model whose blocks are wrapped the way large-model scripts wrap them: one under
    activation checkpointing's ``checkpoint_wrapper``, one compiled on its own."""

    def __init__(self) -> None:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([checkpoint_wrapper(_Block()),
                                     torch.compile(_Block(), backend="eager")])
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.mark.parametrize("check", ["sampled", "full"])
def test_blocks_wrapped_inside_the_model_are_named_as_the_users_model(receiver, tmp_path,
                                                                       check):
    """``checkpoint_wrapper`` and a compiled block insert ``_checkpoint_wrapped_module`` and
    ``_orig_mod`` into every name below them: the layers, the run record and the module a
    NaN came from are named without them."""
    torch._dynamo.reset()  # a graph compiled by an earlier test, without these hooks
    model = _Blocks()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run_id = f"wrapped-blocks-{check}"
    mon = _monitor(receiver, tmp_path, run_id, finite_flags=check)
    mon.watch(model, opt)
    for step in range(1, STEPS + 1):
        x = torch.randn(8, 4)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == 4:
            with torch.no_grad():
                model.blocks[1]._orig_mod.fc.bias[0] = float("nan")  # step 5 goes NaN there
        mon.log_step(step, loss=loss, samples=8)
    assert mon.close(timeout=10)
    run = next(r for r in receiver.records if r["kind"] == "run" and r["run_id"] == run_id)
    assert run["model"]["layer_order"] == [f"{m}.{p}" for m in ("blocks.0.fc", "blocks.1.fc",
                                                                   "head")
                                           for p in ("weight", "bias")]
    steps = _steps(receiver, run_id)
    assert {name for r in steps for name in r.get("layers", {})} == set(
        run["model"]["layer_order"])
    made_nan = "blocks.1" if check == "sampled" else "blocks.1.fc"
    assert steps[4]["nonfinite_modules"][0] == made_nan, steps[4]
