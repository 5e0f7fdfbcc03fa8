"""The client's public surface: a few keywords for the common case, the other knobs in
``settings=`` (MonitorSettings / WatchSettings), ``config=`` meaning the hyperparameters and
nothing else, any other keyword refused as by any function, implementation modules
private."""

from __future__ import annotations

import pkgutil
import warnings

import pytest
import torch
from training_steps import log_steps

import monitor_client
from monitor_client import Monitor, MonitorSettings, WatchSettings
from monitor_client._arguments import watch_settings

# Keywords that are settings fields, not Monitor(...) or watch(...) arguments: refused.
MONITOR_FIELDS = ("rank", "world_size", "rank0_only", "layer_stats_every", "hist_every",
                  "spool_dir", "spool_max_bytes", "spool_max_age", "max_queue", "linger",
                  "timeout", "close_timeout", "gpu_probe", "install_hooks", "enabled")
WATCH_FIELDS = ("apply_clip", "seq_len", "flops_per_token", "peak_flops", "compute_dtype",
                "layer_stats_every", "hist_every", "pre_hook", "snapshot_budget_bytes",
                "sharded", "activations", "activation_every", "max_activation_modules",
                "finite_flags")


def _model_and_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


# -- the public API --------------------------------------------------------------------------

def test_all_lists_the_public_api_and_no_module():
    assert sorted(monitor_client.__all__) == [
        "CategoryLoss", "Counters", "DataStream", "GuardSettings", "Monitor", "MonitorClientError",
        "MonitorSettings", "RollbackPlan", "WatchSettings"]
    for name in monitor_client.__all__:
        assert not isinstance(getattr(monitor_client, name), type(monitor_client)), name
    namespace: dict = {}
    exec("from monitor_client import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(monitor_client.__all__)


def test_implementation_modules_are_private():
    found = {m.name for m in pkgutil.iter_modules(monitor_client.__path__)}
    public = {name for name in found if not name.startswith("_")}
    assert public == {"settings", "hf", "lightning", "relaunch"}
    for name in ("sender", "spool", "transport", "encode", "gate", "pending", "counters",
                 "finite", "alarming", "warn", "exit_hooks", "preflight", "run_info",
                 "monitor", "stats", "flops", "actions"):
        assert f"_{name}" in found and name not in found, name
        assert name not in monitor_client.__all__ and f"_{name}" not in monitor_client.__all__


# -- the small surface -----------------------------------------------------------------------

def test_the_small_surface_reports_a_run_without_a_warning(receiver, tmp_path):
    model, opt = _model_and_optimizer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mon = Monitor(receiver.url, "surface", {"lr": 0.1}, run_id="small", token="t0k3n",
                      labels={"team": "x"}, settings=MonitorSettings(
                          spool_dir=tmp_path, install_hooks=False, linger=0.02,
                          watch=WatchSettings(layer_stats_every=2, hist_every=0)))
        mon.watch(model, opt, grad_clip=1.0)
        log_steps(mon, model, opt, range(1, 4))
        assert mon.close(timeout=10)
    assert (mon.settings.url, mon.settings.project, mon.settings.token) == (
        receiver.url, "surface", "t0k3n")
    run = receiver.of_kind("run")[0]
    assert run["run_id"] == "small" and run["labels"]["team"] == "x"
    assert run["config"] == {"lr": 0.1, "grad_clip": 1.0, "layer_stats_every": 2,
                             "hist_every": 0}
    steps = receiver.of_kind("step")
    assert [bool(r.get("layers")) for r in steps] == [True, False, True]
    assert all(r["clip_threshold"] == 1.0 for r in steps)


def test_watch_settings_replace_the_monitors_and_take_grad_clip():
    base = WatchSettings(hist_every=0)
    assert watch_settings(base, None, {"grad_clip": None, "guard": None}) == base
    assert watch_settings(base, None, {"grad_clip": 2.0, "guard": None}) == WatchSettings(
        hist_every=0, grad_clip=2.0)
    assert watch_settings(base, WatchSettings(activations=True), {"grad_clip": 2.0}) == \
        WatchSettings(activations=True, grad_clip=2.0)


def test_an_unknown_keyword_is_a_type_error_as_for_any_function():
    with pytest.raises(TypeError, match="unexpected keyword argument 'lingr'"):
        Monitor(lingr=0.1)
    mon = Monitor(settings=MonitorSettings(enabled=False))
    model, opt = _model_and_optimizer()
    with pytest.raises(TypeError, match="unexpected keyword argument 'grad_clipping'"):
        mon.watch(model, opt, grad_clipping=1.0)


@pytest.mark.parametrize("name", MONITOR_FIELDS)
def test_a_settings_field_is_no_monitor_keyword(name):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        Monitor(**{name: None})


@pytest.mark.parametrize("name", WATCH_FIELDS)
def test_a_watch_settings_field_is_no_watch_keyword(name):
    mon = Monitor(settings=MonitorSettings(enabled=False))
    model, opt = _model_and_optimizer()
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        mon.watch(model, opt, **{name: None})


def test_config_is_the_hyperparameters_never_settings():
    with pytest.raises(TypeError, match="run's hyperparameters, a dict, not MonitorSettings"):
        Monitor(config=MonitorSettings(enabled=False))  # type: ignore[arg-type]
    mon = Monitor(settings=MonitorSettings(enabled=False))
    model, opt = _model_and_optimizer()
    with pytest.raises(TypeError, match="unexpected keyword argument 'config'"):
        mon.watch(model, opt, config=WatchSettings())  # type: ignore[call-arg]
    assert not hasattr(mon, "monitor_config")


def test_watch_takes_what_is_watched_a_model_its_optimizer_and_its_name():
    """watch(model, optimizer=None, *, name=None, ...): the optimizer may be left out (a
    loop that updates its parameters by hand) and a name given (several models per run);
    everything else stays a keyword."""
    import inspect

    params = inspect.signature(Monitor.watch).parameters
    assert list(params)[:3] == ["self", "model", "optimizer"]
    assert params["optimizer"].default is None
    assert params["name"].kind is inspect.Parameter.KEYWORD_ONLY and params["name"].default is None
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for n, p in params.items()
               if n not in ("self", "model", "optimizer"))
    mon = Monitor(settings=MonitorSettings(enabled=False))
    model, opt = _model_and_optimizer()
    mon.watch(model, opt, name="D")  # inactive: accepted, nothing hooked
    mon.watch(model)
    with pytest.raises(TypeError, match="positional"):
        mon.watch(model, opt, "D")  # type: ignore[misc]
