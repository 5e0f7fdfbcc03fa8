"""Where a fault started, as the client reports it: per-parameter gradient norms on the
steps that matter, the forward pass's first non-finite module output, and the pre-flight
memory estimate. Real models, real hooks, the real HTTP receiver."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from monitor_agent.records.schemas import parse_record
from monitor_client import Monitor, MonitorSettings, WatchSettings
from monitor_client._finite import WHOLE_ELEMENTS, FiniteFlags
from monitor_client._gate import NormGate
from monitor_client._preflight import Preflight, optimizer_state_bytes


class Faulty(nn.Linear):
    """A Linear whose output turns NaN in one chosen element when ``fire`` is set."""

    fire = False
    at = (0, 0)

    def forward(self, x):
        out = super().forward(x)
        if self.fire:
            out = out.clone()
            out[self.at] = float("nan")
        return out


class NanGrad(torch.autograd.Function):
    """Identity forward; the gradient that flows back through it becomes NaN."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


class BackwardFault(nn.Module):
    fire = False

    def forward(self, x):
        return NanGrad.apply(x) if self.fire else x


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), Faulty(16, 16), BackwardFault(),
                         nn.Tanh(), nn.Linear(16, 4))


def _run(receiver, tmp_path, run_id, fault_at, kind, steps=6, every=1000, scale_at=None):
    mon = Monitor(url=receiver.url, project="origin", run_id=run_id,
                  settings=MonitorSettings(spool_dir=tmp_path, install_hooks=False, linger=0.02,
                                           timeout=(0.5, 5.0)))
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, opt, settings=WatchSettings(layer_stats_every=every))
    gen = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        model[2].fire = kind == "forward" and step == fault_at
        model[3].fire = kind == "backward" and step == fault_at
        loss = model(torch.randn(16, 8, generator=gen)).pow(2).mean()
        if kind == "loss" and step == fault_at:  # after every module: the loss arithmetic
            loss = loss + torch.log(-loss.detach())
        (loss * (10.0 if step == scale_at else 1.0)).backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss.detach())
    mon.close(timeout=10)
    return {r["step"]: r for r in receiver.of_kind("step")}


def test_forward_nan_names_the_module_whose_output_went_non_finite_first(receiver, tmp_path):
    steps = _run(receiver, tmp_path, "fwd-nan", fault_at=4, kind="forward")
    bad = steps[4]
    assert bad["loss"] == "NaN"
    # Forward order: the Faulty Linear "2", then what is downstream of it (the Tanh "4"
    # cannot create a NaN, so it is not checked).
    assert bad["nonfinite_modules"] == ["2", "3", "5"]
    assert bad["nonfinite_module_count"] == 3 and bad["nonfinite_check"] == "sampled"
    # Every gradient is poisoned: they cannot tell where it was born, but they go out.
    assert set(bad["grad_norms"]) == {f"{i}.{w}" for i in (0, 2, 5) for w in ("weight", "bias")}
    assert all(v == "NaN" for v in bad["grad_norms"].values())
    for step in (1, 2, 3):  # healthy steps: no finite report, no per-parameter norms
        assert "nonfinite_modules" not in steps[step] and "grad_norms" not in steps[step]
    rec = parse_record(bad)
    assert rec.nonfinite_modules == ("2", "3", "5")
    assert math.isnan(rec.grad_norms.stats["grad_norm"][0])


def test_a_nan_made_in_the_loss_reports_every_module_output_finite(receiver, tmp_path):
    steps = _run(receiver, tmp_path, "loss-nan", fault_at=4, kind="loss")
    bad = steps[4]
    assert bad["loss"] == "NaN"
    # The check ran and found every output finite: a measurement, sent where it matters.
    assert bad["nonfinite_module_count"] == 0 and "nonfinite_modules" not in bad
    assert parse_record(bad).nonfinite_check == "sampled"
    for step in (1, 2, 3):  # healthy steps stay as small as before
        assert "nonfinite_module_count" not in steps[step]
        assert "nonfinite_check" not in steps[step]
    assert parse_record(bad).nonfinite_module_count == 0


def test_backward_nan_leaves_the_output_side_gradients_finite(receiver, tmp_path):
    steps = _run(receiver, tmp_path, "bwd-nan", fault_at=3, kind="backward")
    bad = steps[3]
    assert isinstance(bad["loss"], float) and math.isfinite(bad["loss"])
    assert "nonfinite_modules" not in bad
    norms = bad["grad_norms"]
    assert all(norms[n] == "NaN" for n in ("0.weight", "0.bias", "2.weight", "2.bias"))
    assert all(math.isfinite(norms[n]) for n in ("5.weight", "5.bias"))


def test_a_step_far_above_its_median_carries_its_per_parameter_norms(receiver, tmp_path):
    steps = _run(receiver, tmp_path, "band", fault_at=None, kind=None, steps=30, scale_at=25)
    assert [s for s, r in steps.items() if "grad_norms" in r] == [25]
    assert steps[25]["grad_norms"]["5.weight"] > 0


def test_monitored_steps_carry_norms_in_layers_only(receiver, tmp_path):
    steps = _run(receiver, tmp_path, "monitored", fault_at=2, kind="backward", every=1)
    assert "grad_norms" not in steps[2]
    assert steps[2]["layers"]["0.weight"]["grad_norm"] == "NaN"


def test_gate_rule():
    gate = NormGate(ratio=2.0, window=20)
    assert [gate.keep(1.0 + 0.01 * i) for i in range(15)] == [False] * 15
    assert gate.keep(2.5) is True
    assert gate.keep(1.5) is False
    assert gate.keep(float("nan")) is True and gate.keep(None) is False
    for _ in range(20):  # a new level becomes the band within half a window
        gate.keep(5.0)
    assert gate.keep(5.0) is False


def test_finite_flags_skip_eval_forwards_and_detach_cleanly():
    model = _model()
    flags = FiniteFlags(model).attach()
    model.eval()
    model[2].fire = True
    model(torch.randn(2, 8))
    assert flags._sums == []
    flags.detach()
    assert all(not m._forward_hooks for m in model.modules())


class Block(nn.Module):
    """A repeated block: a linear map on the residual stream, then a norm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.norm = Faulty(16, 16), nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(x + self.fc(x))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.head = nn.Linear(8, 16), nn.Linear(16, 4)
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _flagged(flags: FiniteFlags, model: nn.Module, x: torch.Tensor) -> dict:
    from monitor_client._stats import StatsPack

    model(x)
    pack = StatsPack()
    flags.add_to(pack)
    return pack.decode(pack.vector().tolist())


def test_the_default_check_names_the_block_and_the_full_check_the_module_in_it():
    model = Stack()
    sampled, full = FiniteFlags(model), FiniteFlags(model, full=True)
    # Each element of a ModuleList is one unit; the leaves outside the blocks stay.
    assert sorted(sampled.names) == ["blocks.0", "blocks.1", "blocks.2", "head", "inp"]
    assert {"blocks.0.fc", "blocks.0.norm"} < set(full.names) and len(full.names) == 8
    model.blocks[1].fc.fire = True
    for flags, first in ((sampled, "blocks.1"), (full, "blocks.1.fc")):
        flags.attach()
        got = _flagged(flags, model, torch.randn(4, 8))
        flags.detach()
        assert got["nonfinite_modules"][0] == first, got
        assert got["nonfinite_check"] == flags.check


def test_a_value_outside_each_rows_sample_is_named_where_a_module_first_mixes_it():
    # 64 float32 features a row: the sample reads the first 8. A NaN in feature 40 of one
    # row is not read in the module that made it; the next linear map spreads it over its
    # whole output row, where the sample sees it. The full check names the maker. An
    # output of at most WHOLE_ELEMENTS is summed whole by the sampled check too (a small
    # batch here): it names the maker as well.
    torch.manual_seed(0)
    model = nn.Sequential(Faulty(8, 64), nn.Linear(64, 4))
    model[0].fire, model[0].at = True, (1, 40)
    rows = WHOLE_ELEMENTS // 64 + 1
    for full, batch, named in ((False, rows, ["1"]), (True, rows, ["0", "1"]),
                               (False, 4, ["0", "1"])):
        flags = FiniteFlags(model, full=full).attach()
        got = _flagged(flags, model, torch.randn(batch, 8))
        flags.detach()
        assert got["nonfinite_modules"] == named, (full, batch, got)


def test_finite_flags_settings():
    assert WatchSettings().finite_flags == "sampled"
    assert WatchSettings(finite_flags=True).finite_flags == "sampled"
    assert WatchSettings(finite_flags="full").finite_flags == "full"
    assert not WatchSettings(finite_flags=False).finite_flags
    with pytest.raises(ValueError, match="finite_flags must be"):
        WatchSettings(finite_flags="every")


class FakeCuda:
    """The memory probe of a small GPU (_memory.py's interface): the boundary we fake."""

    def __init__(self, total: int, allocated: int, peak: int) -> None:
        self.total, self.allocated, self.peak = total, allocated, peak

    def read(self) -> dict:
        return {"device": "cuda:0", "allocated_bytes": self.allocated, "reserved_bytes": None,
                "peak_allocated_bytes": self.peak, "total_bytes": self.total}


def _adam_step(model):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return opt


def test_preflight_counts_the_optimizers_own_state_and_warns_when_it_will_not_fit():
    model = _model()
    params = sum(p.numel() * 4 for p in model.parameters())
    said = []
    probe = FakeCuda(total=4 * params, allocated=params, peak=params)
    pre = Preflight(model, probe, said.append)
    assert said == []  # params + grads = half the device: fine so far
    opt = _adam_step(model)
    assert optimizer_state_bytes(opt) >= 2 * params  # Adam: two moments per parameter
    probe.peak = 3 * params  # the first step's activations on top
    est = pre.after_first_step(opt)
    assert est["optimizer_state"] >= 2 * params and est["activations"] >= 0
    assert est["need"] > 0.9 * probe.total
    assert len(said) == 1 and "will not fit" in said[0] and "optimizer state" in said[0]
    assert pre.after_first_step(opt) is None and len(said) == 1  # once


def test_preflight_is_quiet_when_it_fits():
    model = _model()
    said = []
    pre = Preflight(model, FakeCuda(total=1 << 34, allocated=1 << 20, peak=1 << 21),
                    said.append)
    est = pre.after_first_step(_adam_step(model))
    assert said == [] and est["need"] < est["total"]


def test_preflight_warns_at_watch_when_the_weights_alone_do_not_fit():
    model = _model()
    said = []
    Preflight(model, FakeCuda(total=100, allocated=90, peak=90), said.append)
    assert len(said) == 1 and "will not fit" in said[0]


def test_monitor_warns_once_at_start_on_a_small_device(receiver, tmp_path, monkeypatch, caplog):
    import monitor_client._monitor as monitor_module

    model = _model()
    params = sum(p.numel() * 4 for p in model.parameters())
    probe = FakeCuda(total=3 * params, allocated=params, peak=3 * params)
    monkeypatch.setattr(monitor_module, "memory_probe", lambda device: probe)
    mon = Monitor(url=receiver.url, project="origin", run_id="preflight",
                  settings=MonitorSettings(spool_dir=tmp_path, install_hooks=False, linger=0.02))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mon.watch(model, opt)
    for step in (1, 2, 3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=1.0)
    mon.close(timeout=10)
    assert caplog.text.count("pre-flight") == 1


def test_a_batch_without_a_label_that_counts_is_warned_about(receiver, tmp_path, caplog):
    mon = Monitor(url=receiver.url, project="origin", run_id="labels",
                  settings=MonitorSettings(spool_dir=tmp_path, install_hooks=False, linger=0.02))
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, opt)
    for step, labels in ((1, torch.tensor([3, -100])), (2, torch.tensor([-100, -100]))):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=1.0, min_label_count=labels.ne(-100).sum())
    mon.close(timeout=10)
    assert "step 2: a batch has no label that counts" in caplog.text
    assert "step 1:" not in caplog.text
    steps = receiver.of_kind("step")
    assert steps and all("min_label_count" not in r for r in steps), steps


@pytest.mark.parametrize("accum", [1, 3])
def test_each_micro_batch_is_checked(accum):
    model = _model()
    flags = FiniteFlags(model).attach()
    from monitor_client._stats import StatsPack

    for i in range(accum):
        model[2].fire = i == accum - 1
        model(torch.randn(2, 8))
    pack = StatsPack()
    flags.add_to(pack)
    decoded = pack.decode(pack.vector().tolist())
    assert decoded["nonfinite_modules"][0] == "2"


def test_a_skipped_amp_step_carries_its_unscaled_per_parameter_norms(receiver, tmp_path):
    mon = Monitor(url=receiver.url, project="origin", run_id="amp-origin",
                  settings=MonitorSettings(spool_dir=tmp_path, install_hooks=False, linger=0.02,
                                           timeout=(0.5, 5.0)))
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    mon.watch(model, opt, scaler=scaler)
    gen = torch.Generator().manual_seed(1)
    for step in range(1, 5):
        model[3].fire = step == 3  # the backward pass makes NaN from layer "3" inward
        opt.zero_grad()
        loss = model(torch.randn(16, 8, generator=gen)).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        mon.log_step(step, loss=loss.detach())
    mon.close(timeout=10)
    steps = {r["step"]: r for r in receiver.of_kind("step")}
    bad = steps[3]
    assert bad["skipped"] is True and math.isfinite(bad["loss"])
    norms = bad["grad_norms"]
    assert norms["2.weight"] == "NaN" and norms["0.weight"] == "NaN"
    # Unscaled (divided by the loss scale), not the scaled values the backward produced.
    assert 0 < norms["5.weight"] < 2  # scaled by 1024 it would be in the hundreds
