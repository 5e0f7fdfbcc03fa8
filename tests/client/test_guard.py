"""The step guard (_guard.py) decides on the device and skips exactly: a guarded run's
parameters and optimizer state equal those of a run that never called step() on the
skipped steps, for fused and non-fused optimizers, NaN gradients, a GradScaler and
clipping; each skipped step is a step record with its reason."""

from __future__ import annotations

import pytest
import torch

from monitor_client import Monitor, MonitorSettings, WatchSettings
from monitor_client._guard import StepGuard
from monitor_client._stats import GradStats
from monitor_client.settings import GuardSettings

STEPS = 40
CONFIG = GuardSettings(min_history=16, window=32)


@pytest.fixture(autouse=True)
def _no_guard_hook_failed(caplog):
    """A guard hook that raised is contained (_hooks.py): the step goes on without its
    decision, and a warning says so. None may, in any of these tests."""
    yield
    failed = [r.getMessage() for r in caplog.get_records("call") if "failed;" in r.getMessage()]
    assert not failed


class _LegacyAmpSGD(torch.optim.SGD):
    """An optimizer of the older AMP protocol: it says it supports AMP scaling, but takes
    the scaler as step()'s argument and reads no ``found_inf`` attribute."""

    _step_supports_amp_scaling = True

    def step(self, closure=None, grad_scaler=None):
        return super().step(closure)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _batch(step: int, faults: dict[int, str]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(torch.get_default_device()).manual_seed(step)
    x = torch.randn(64, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    if faults.get(step) == "spike":
        y = y * 1e3  # one corrupted batch (labels x1000): its gradient is ~1e3x the usual
    if faults.get(step) == "nan":
        y = y * float("nan")
    return x, y


def _optimizer(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = model.parameters()
    return {"adamw_fused": lambda: torch.optim.AdamW(params, lr=1e-2, fused=True),
            "adamw": lambda: torch.optim.AdamW(params, lr=1e-2, foreach=True),
            "sgd_fused": lambda: torch.optim.SGD(params, lr=1e-2, momentum=0.9, fused=True),
            "sgd": lambda: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
            "sgd_legacy_amp": lambda: _LegacyAmpSGD(params, lr=1e-2, momentum=0.9)}[kind]()


def _train(kind: str, faults: dict[int, str], *, guard: bool, skip: set[int] = frozenset(),
           clip: float | None = None, scaler: bool = False, growth_interval: int = 2000):
    """Train STEPS steps; with ``guard`` the guard decides, else ``skip`` lists the steps
    on which step() is simply not called (the reference). Returns the skip reasons seen,
    the parameters and the optimizer state."""
    model = _model()
    opt = _optimizer(kind, model)
    amp = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10,
                               growth_interval=growth_interval) if scaler else None
    stats = GradStats(model, opt, grad_clip=clip).attach() if guard or clip else None
    step_guard = StepGuard(stats, opt, CONFIG).attach() if guard else None
    reasons: dict[int, str] = {}
    for step in range(STEPS):
        x, y = _batch(step, faults)
        loss = (model(x) - y).pow(2).mean()
        if amp is not None:
            amp.scale(loss).backward()
            if step not in skip:
                amp.step(opt)
                amp.update()
        else:
            loss.backward()
            if step not in skip:
                opt.step()
        opt.zero_grad()
        if stats is not None:
            pack = stats.take()
            if step_guard is not None:
                step_guard.add_to(pack)
            host = pack.vector()  # None: step() was not called and the grads are zeroed
            reason = pack.decode(host.tolist()).get("skip_reason") if host is not None else None
            if reason:
                reasons[step] = reason
    assert not hasattr(opt, "found_inf"), "the guard must not leave its flag behind"
    params = [p.detach().clone() for p in model.parameters()]
    state = [{k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
             for s in opt.state.values()]
    return reasons, params, state


def _same(a, b) -> bool:
    _, pa, sa = a
    _, pb, sb = b
    if not all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True)):
        return False
    return all(s1.keys() == s2.keys() and all(
        torch.equal(s1[k], s2[k]) if torch.is_tensor(s1[k]) else s1[k] == s2[k] for k in s1)
        for s1, s2 in zip(sa, sb, strict=True))


@pytest.mark.parametrize("kind", ["adamw_fused", "adamw", "sgd_fused", "sgd", "sgd_legacy_amp"])
def test_spikes_and_nans_are_skipped_exactly_and_nothing_else(kind):
    faults = {20: "spike", 27: "nan", 33: "spike"}
    guarded = _train(kind, faults, guard=True)
    assert guarded[0] == {20: "grad_norm_outlier", 27: "nonfinite_grad",
                          33: "grad_norm_outlier"}
    reference = _train(kind, faults, guard=False, skip=set(faults))
    assert _same(guarded, reference)  # parameters, moments and step counts: bit-identical
    assert not _same(guarded, _train(kind, {}, guard=False))  # and the steps were taken


def test_nothing_is_judged_an_outlier_before_the_minimum_history():
    reasons, *_ = _train("adamw_fused", {5: "spike", 6: "nan"}, guard=True)
    assert reasons == {6: "nonfinite_grad"}


def test_with_clipping_the_guard_judges_the_pre_clip_norm_and_skips_exactly():
    faults = {25: "spike"}
    guarded = _train("adamw_fused", faults, guard=True, clip=0.5)
    assert guarded[0] == {25: "grad_norm_outlier"}
    assert _same(guarded, _train("adamw_fused", faults, guard=False, skip={25}, clip=0.5))


@pytest.mark.parametrize("kind", ["adamw_fused", "adamw"])
def test_under_a_grad_scaler_an_overflow_is_the_scalers_and_a_spike_is_ours(kind):
    faults = {22: "spike", 30: "nan"}
    guarded = _train(kind, faults, guard=True, scaler=True)
    # fused: the scaler sets found_inf and step() runs, so the guard names the reason;
    # non-fused: the scaler never calls step() on an overflow (the Monitor says loss_scale)
    expected = {22: "grad_norm_outlier"} | ({30: "loss_scale"} if kind == "adamw_fused" else {})
    assert guarded[0] == expected
    assert all(torch.isfinite(p).all() for p in guarded[1])
    # and exactly: the overflow skipped once (AdamW's step count too), the spike like a
    # step never taken
    assert _same(guarded, _train(kind, faults, guard=False, skip={22}, scaler=True))


def test_under_a_grad_scaler_a_fused_optimizer_is_judged_on_unscaled_norms():
    # A scale that doubles every step: the still-scaled gradients a fused optimizer sees
    # grow 2x a step, the run's own do not, and nothing but the spike is skipped.
    assert _train("adamw_fused", {}, guard=True, scaler=True, growth_interval=1)[0] == {}
    faults = {30: "spike"}
    assert _train("adamw_fused", faults, guard=True, scaler=True,
                  growth_interval=1)[0] == {30: "grad_norm_outlier"}


@pytest.mark.parametrize("kind", ["adamw_fused", "sgd_fused", "adamw", "sgd"])
def test_a_fused_optimizer_is_skipped_in_its_kernel_and_any_other_without_its_gradients(kind):
    # What step() itself sees of a skip: a fused optimizer, once it has taken a step, gets
    # the guard's found_inf flag (no host read) and keeps its gradients; any other, and a
    # fused one before its first step, runs with no gradient at all.
    model = _model()
    opt = _optimizer(kind, model)
    stats = GradStats(model, opt).attach()
    step_guard = StepGuard(stats, opt, CONFIG).attach()
    seen: list[tuple[float | None, bool]] = []
    opt.register_step_pre_hook(lambda o, *_: seen.append((
        float(o.found_inf) if hasattr(o, "found_inf") else None,
        all(p.grad is not None for p in model.parameters()))))
    faults = {0: "nan", 20: "spike"}
    for step in range(24):
        x, y = _batch(step, faults)
        (model(x) - y).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        pack = stats.take()
        step_guard.add_to(pack)
    fused = kind.endswith("_fused")
    assert seen[0] == (None, False)  # before any step taken: skipped on the host
    assert seen[1] == (None, True)  # the first taken step: decided on the host too
    assert seen[2] == ((0.0, True) if fused else (None, True))
    assert seen[20] == ((1.0, True) if fused else (None, False))
    assert not hasattr(opt, "found_inf")


def test_the_gradients_of_a_step_skipped_on_the_host_are_the_users_again_after_it():
    model = _model()
    opt = _optimizer("sgd", model)
    stats = GradStats(model, opt).attach()
    step_guard = StepGuard(stats, opt, CONFIG).attach()
    for step in range(4):
        x, y = _batch(step, {1: "nan"})
        (model(x) - y).pow(2).mean().backward()
        grads = [p.grad for p in model.parameters()]
        opt.step()
        assert all(p.grad is g for p, g in zip(model.parameters(), grads, strict=True)), step
        opt.zero_grad()
        pack = stats.take()
        step_guard.add_to(pack)
        assert pack.decode(pack.vector().tolist()).get("skip_reason") == (
            "nonfinite_grad" if step == 1 else None)


def test_after_the_step_the_optimizer_holds_the_grad_scalers_own_flag_again():
    # The guard puts its found_inf in the scaler's place for the fused step, then puts the
    # scaler's back: what a later step hook reads is the scaler's, skip or not.
    model = _model()
    opt = _optimizer("adamw_fused", model)
    theirs: list[object] = []
    opt.register_step_pre_hook(lambda o, *_: theirs.append(o.found_inf))  # before the guard
    stats = GradStats(model, opt).attach()
    step_guard = StepGuard(stats, opt, CONFIG).attach()
    after: list[object] = []
    opt.register_step_post_hook(lambda o, *_: after.append(o.found_inf))
    amp = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for step in range(24):
        x, y = _batch(step, {20: "spike", 22: "nan"})
        amp.scale((model(x) - y).pow(2).mean()).backward()
        amp.step(opt)
        amp.update()
        opt.zero_grad()
        pack = stats.take()
        step_guard.add_to(pack)
    assert len(after) == 24 and all(a is t for a, t in zip(after, theirs, strict=True))
    assert not hasattr(opt, "found_inf")


def test_a_step_without_gradients_after_grad_scaler_steps_leaves_no_flag_behind():
    # A step with no gradient is not judged: what the guard put back for the scaler's
    # last step must not be put back again on it.
    model = _model()
    opt = _optimizer("adamw_fused", model)
    stats = GradStats(model, opt).attach()
    StepGuard(stats, opt, CONFIG).attach()
    amp = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for step in range(3):
        x, y = _batch(step, {})
        amp.scale((model(x) - y).pow(2).mean()).backward()
        amp.step(opt)
        amp.update()
        opt.zero_grad()
        stats.take()
    opt.step()  # no backward since: nothing to judge
    assert not hasattr(opt, "found_inf")


def test_a_step_logged_before_any_optimizer_step_carries_no_skip_decision():
    model = _model()
    opt = _optimizer("adamw_fused", model)
    stats = GradStats(model, opt).attach()
    step_guard = StepGuard(stats, opt, CONFIG).attach()
    (model(torch.ones(2, 8)) - 1).pow(2).mean().backward()  # logged before step() ran
    pack = stats.take()
    step_guard.add_to(pack)
    assert "skip_reason" not in pack.decode(pack.vector().tolist())


def test_the_monitor_logs_each_skipped_step_with_its_reason(receiver, tmp_path):
    mon = Monitor(url=receiver.url, project="guard", run_id="guard-1",
                  settings=MonitorSettings(spool_dir=tmp_path, install_hooks=False, linger=0.02,
                                           watch=WatchSettings(guard=CONFIG)))
    model = _model()
    opt = _optimizer("adamw_fused", model)
    mon.watch(model, opt)
    faults = {20: "spike", 31: "nan"}
    for step in range(STEPS):
        x, y = _batch(step, faults)
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step + 1, loss=loss.detach())
    mon.close(timeout=10)
    steps = receiver.of_kind("step")
    assert len(steps) == STEPS
    assert {r["step"]: r["skip_reason"] for r in steps if r.get("skipped")} == {
        21: "grad_norm_outlier", 32: "nonfinite_grad"}
    run = receiver.of_kind("run")[0]
    assert run["config"]["guard"]["k"] == 10.0


def test_guard_settings_are_checked_before_training():
    assert WatchSettings(guard=True).guard == GuardSettings()
    assert WatchSettings(guard=False).guard is None
    with pytest.raises(ValueError, match="pre_hook"):
        WatchSettings(guard=True, pre_hook=False)
    with pytest.raises(TypeError, match="GuardSettings"):
        WatchSettings(guard="yes")
    with pytest.raises(ValueError, match="floor"):
        GuardSettings(floor=-1)


@pytest.mark.parametrize("kind", ["adamw_fused", "adamw", "sgd_fused", "sgd"])
def test_a_nan_on_the_very_first_step_is_skipped_exactly(kind):
    # fused SGD allocates its momentum with empty_like on its first step: a found_inf skip
    # there would leave garbage behind, so the guard skips the first steps on the host
    faults = {0: "nan", 1: "nan", 24: "spike"}
    guarded = _train(kind, faults, guard=True)
    assert guarded[0] == {0: "nonfinite_grad", 1: "nonfinite_grad", 24: "grad_norm_outlier"}
    assert _same(guarded, _train(kind, faults, guard=False, skip=set(faults)))
    assert all(torch.isfinite(p).all() for p in guarded[1])


def test_the_guard_keyword_fills_the_monitors_watch_settings(tmp_path, monkeypatch):
    mon = Monitor(project="guard", settings=MonitorSettings(
        enabled=False, spool_dir=tmp_path, watch=WatchSettings(guard=GuardSettings(k=5.0))))
    seen: list[WatchSettings] = []
    monkeypatch.setattr(mon, "_watch", lambda model, opt, scaler, cfg, *_: seen.append(cfg))
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, opt)                          # the Monitor's own
    mon.watch(model, opt, guard=True)              # the defaults
    mon.watch(model, opt, guard=GuardSettings(k=4.0))
    assert [cfg.guard for cfg in seen] == [GuardSettings(k=5.0), GuardSettings(),
                                           GuardSettings(k=4.0)]
