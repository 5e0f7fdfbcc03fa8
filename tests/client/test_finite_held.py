"""The forward check on the CPU holds each output and reads it only on a step that needs it
(``_finite.py``, "Held on the CPU"); the device path, run here on CPU tensors, sends the
same records. Real models, real hooks, the real HTTP receiver."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from monitor_client import Monitor, MonitorSettings, WatchSettings, _finite
from monitor_client._finite import FiniteFlags
from monitor_client._pack import StatsPack

# What a step record says that depends on the clock or the machine, not on the training.
_CLOCKED = {"time", "step_time", "samples_per_second", "tokens_per_second", "memory",
            "run_id", "attempt"}


class Ops(TorchDispatchMode):
    """The names of the torch operators run inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class Sqrt(nn.Module):
    """NaN for an input below -100; its gradient there is NaN even where the NaN is masked
    later (0 times the NaN derivative)."""

    def forward(self, x):
        return (x + 100.0).sqrt()


class Masked(nn.Module):
    """Zero where the input is NaN: a finite output, and so a finite loss."""

    def forward(self, x):
        return torch.where(x.isnan(), torch.zeros_like(x), x)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), Sqrt(), Masked(), nn.Linear(16, 4))


@pytest.mark.parametrize("hold_bytes", [_finite.HOLD_BYTES, 0])
def test_a_cpu_forward_holds_its_outputs_and_a_clean_step_reads_none(monkeypatch, hold_bytes):
    monkeypatch.setattr(_finite, "HOLD_BYTES", hold_bytes)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    flags = FiniteFlags(model).attach()
    with Ops() as ops:
        model(torch.randn(4, 8))
    # Held (within the budget): no operator of ours ran in the forward pass; past the
    # budget each output is summed at once, as on a device.
    assert ops.names.count("sum") == (0 if hold_bytes else 2), ops.names
    pack = StatsPack()
    flags.add_to(pack, clean=True)  # loss and gradients finite: nothing to report
    assert pack.values == [] and pack.layout == []
    model[0].weight.data[0, 0] = float("nan")
    model(torch.randn(4, 8))
    pack = StatsPack()
    flags.add_to(pack)  # not known clean: the held outputs are read now
    assert pack.decode(pack.host())["nonfinite_modules"] == ["0", "2"]
    assert flags._sums == [] and not flags.holding  # nothing is kept past its step
    flags.detach()


def _run(receiver, tmp_path, run_id: str) -> dict[int, dict]:
    """Steps 1-2 healthy; 3 a NaN masked before the loss (finite loss, NaN gradients); 4
    a NaN weight in the last layer (the loss sees it); 5 healthy again."""
    mon = Monitor(url=receiver.url, project="held", run_id=run_id,
                  settings=MonitorSettings(spool_dir=tmp_path, install_hooks=False,
                                           linger=0.02, timeout=(0.5, 5.0)))
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, opt, settings=WatchSettings(layer_stats_every=1000))
    gen = torch.Generator(torch.get_default_device()).manual_seed(1)
    for step in range(1, 6):
        x = torch.randn(16, 8, generator=gen)
        with torch.no_grad():
            if step == 3:  # one pre-activation far below zero: its sqrt is NaN, masked
                model[0].bias[0] -= 1000.0
            if step == 4:
                model[3].weight[0, 0] = float("nan")
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step in (3, 4):  # the update was NaN: the model starts again for the next steps
            model.load_state_dict(_model().state_dict())
        mon.log_step(step, loss=loss.detach())
    mon.close(timeout=10)
    return {r["step"]: r for r in receiver.of_kind("step")}


def test_a_masked_forward_nan_is_reported_on_the_step_its_gradients_go_nan(receiver, tmp_path):
    steps = _run(receiver, tmp_path, "held-masked")
    masked = steps[3]
    assert isinstance(masked["loss"], float) and masked["grad_norm"] == "NaN"
    # The loss is finite, the gradients are not: the held outputs are read, and the sqrt
    # that made the NaN is named (not only the gradients' backward order).
    assert masked["nonfinite_modules"][0] == "1", masked
    assert steps[4]["loss"] == "NaN" and steps[4]["nonfinite_modules"] == ["3"]
    for step in (1, 2, 5):
        assert "nonfinite_modules" not in steps[step]
        assert "nonfinite_module_count" not in steps[step]


def test_the_device_path_on_cpu_tensors_sends_the_same_records(receiver, tmp_path,
                                                              monkeypatch):
    host = _run(receiver, tmp_path / "host", "held-host")
    receiver.records.clear()
    # Every tensor as if on a device: outputs summed at once, norms left unstacked for
    # the sender's copy, nothing read on the training thread.
    monkeypatch.setattr(_finite, "on_host", lambda tensor: False)
    device = _run(receiver, tmp_path / "device", "held-device")
    assert sorted(host) == sorted(device) == [1, 2, 3, 4, 5]
    for step in host:
        mine = {k: v for k, v in host[step].items() if k not in _CLOCKED}
        theirs = {k: v for k, v in device[step].items() if k not in _CLOCKED}
        assert mine == theirs, step


def test_on_a_device_a_sampled_module_reduces_once_and_the_step_totals_all_in_one_call(
        monkeypatch):
    """The device path of the sampled check: one reduction a hooked module in the forward
    (its rows' sums), and one fused call for every module's rows at ``log_step``; a NaN in
    a row's sample is still named where it was made."""
    monkeypatch.setattr(_finite, "on_host", lambda tensor: False)
    model = nn.Sequential(nn.Linear(8, 64), nn.Linear(64, 64))
    flags = FiniteFlags(model).attach()
    x = torch.randn(_finite.WHOLE_ELEMENTS // 64 + 1, 8)  # outputs past the whole-sum size
    for bad in (False, True):
        if bad:
            with torch.no_grad():
                model[0].bias[0] = float("nan")  # every row's first feature
        with Ops() as ops:
            model(x)
        assert ops.names.count("sum") == 2, ops.names
        pack = StatsPack()
        with Ops() as ops:
            flags.add_to(pack)
        assert ops.names == ["_foreach_norm"], ops.names
        got = pack.decode(pack.vector().tolist())
        assert got.get("nonfinite_modules") == (["0", "1"] if bad else None), got
    flags.detach()
