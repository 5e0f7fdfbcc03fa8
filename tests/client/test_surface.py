"""The client's public surface: a few keywords for the common case, the other knobs in
``settings=`` (MonitorSettings / WatchSettings), ``config=`` meaning the hyperparameters, the
old spellings working with a DeprecationWarning for one release, implementation modules
private."""

from __future__ import annotations

import dataclasses
import pkgutil
import re
import warnings

import pytest
import torch

import monitor_client
from monitor_client import Monitor, MonitorSettings, WatchSettings
from monitor_client._arguments import LEGACY_MONITOR_KEYWORDS, LEGACY_WATCH_KEYWORDS

# One value per removed keyword, none of them the field's default.
MONITOR_VALUES = {
    "rank": 1, "world_size": 2, "rank0_only": True, "layer_stats_every": 7, "hist_every": 0,
    "spool_dir": "/tmp/elsewhere", "spool_max_bytes": 1000, "spool_max_age": 60.0,
    "max_queue": 5, "linger": 0.1, "timeout": 3.0, "close_timeout": 0.5, "gpu_probe": None,
    "install_hooks": False, "enabled": False,
}
WATCH_VALUES = {
    "apply_clip": False, "seq_len": 64, "flops_per_token": 1e6, "peak_flops": 1e12,
    "compute_dtype": torch.bfloat16, "layer_stats_every": 7, "hist_every": 0,
    "pre_hook": False, "snapshot_budget_bytes": 1024, "sharded": True, "activations": True,
    "activation_every": 5, "max_activation_modules": 8, "finite_flags": False,
}


def _model_and_optimizer():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _watched(mon: Monitor, monkeypatch) -> list[WatchSettings]:
    """The WatchSettings each later ``watch()`` resolves to (the hooking itself skipped)."""
    seen: list[WatchSettings] = []
    monkeypatch.setattr(mon, "_watch", lambda model, opt, scaler, cfg: seen.append(cfg))
    return seen


# -- the public API --------------------------------------------------------------------------

def test_all_lists_the_public_api_and_no_module():
    assert sorted(monitor_client.__all__) == [
        "CategoryLoss", "Counters", "DataStream", "GuardSettings", "Monitor", "MonitorSettings",
        "RollbackPlan", "WatchSettings"]
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
        for step in range(1, 4):
            model(torch.ones(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            mon.log_step(step, loss=1.0)
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


def test_watch_settings_replace_the_monitors_and_take_grad_clip(monkeypatch):
    mon = Monitor(settings=MonitorSettings(enabled=False, watch=WatchSettings(hist_every=0)))
    seen = _watched(mon, monkeypatch)
    model, opt = _model_and_optimizer()
    mon.watch(model, opt)
    mon.watch(model, opt, grad_clip=2.0)
    mon.watch(model, opt, grad_clip=2.0, settings=WatchSettings(activations=True))
    assert seen == [WatchSettings(hist_every=0), WatchSettings(hist_every=0, grad_clip=2.0),
                    WatchSettings(activations=True, grad_clip=2.0)]


def test_an_unknown_keyword_is_a_type_error_as_for_any_function():
    with pytest.raises(TypeError, match="unexpected keyword argument 'lingr'"):
        Monitor(lingr=0.1)
    mon = Monitor(settings=MonitorSettings(enabled=False))
    model, opt = _model_and_optimizer()
    with pytest.raises(TypeError, match="unexpected keyword argument 'grad_clipping'"):
        mon.watch(model, opt, grad_clipping=1.0)


# -- the old spellings: they work, and warn naming the new one ------------------------------

@pytest.mark.parametrize("name", LEGACY_MONITOR_KEYWORDS)
def test_each_removed_monitor_keyword_still_works_and_warns(name):
    value = MONITOR_VALUES[name]
    extra = {} if name == "enabled" else {"enabled": False}
    settings = MonitorSettings(**extra)
    new = (f"watch=WatchSettings({name}=...)" if name in ("layer_stats_every", "hist_every")
           else f"{name}=...")
    with pytest.warns(DeprecationWarning, match=rf"Monitor\({name}=\.\.\.\) is deprecated .*"
                      rf"next release: pass settings=MonitorSettings\({re.escape(new)}\)") as got:
        mon = Monitor(settings=settings, **{name: value})
    assert got[0].filename == __file__  # points at the caller, not the client
    holder = mon.settings.watch if name in ("layer_stats_every", "hist_every") else mon.settings
    assert getattr(holder, name) == value
    target = (dataclasses.replace(settings, watch=WatchSettings(**{name: value}))
              if holder is mon.settings.watch else dataclasses.replace(settings, **{name: value}))
    assert mon.settings == target  # exactly what the new spelling states


def test_removed_monitor_keywords_together_warn_once_with_the_whole_new_spelling():
    with pytest.warns(DeprecationWarning) as got:
        old = Monitor(None, "p", {"lr": 1}, linger=0.1, hist_every=0, enabled=False)
    assert len(got) == 1
    assert ("pass settings=MonitorSettings(linger=..., enabled=..., "
            "watch=WatchSettings(hist_every=...))") in str(got[0].message)
    new = Monitor(None, "p", {"lr": 1}, settings=MonitorSettings(
        linger=0.1, enabled=False, watch=WatchSettings(hist_every=0)))
    assert old.settings == new.settings


@pytest.mark.parametrize("name", LEGACY_WATCH_KEYWORDS)
def test_each_removed_watch_keyword_still_works_and_warns(name, monkeypatch):
    mon = Monitor(settings=MonitorSettings(enabled=False, watch=WatchSettings(hist_every=3)))
    seen = _watched(mon, monkeypatch)
    model, opt = _model_and_optimizer()
    value = WATCH_VALUES[name]
    with pytest.warns(DeprecationWarning, match=rf"watch\({name}=\.\.\.\) is deprecated .*"
                      rf"settings=WatchSettings\({name}=\.\.\.\)") as got:
        mon.watch(model, opt, grad_clip=1.0, **{name: value})
    assert got[0].filename == __file__
    # over the Monitor's WatchSettings, as the keyword always applied
    assert seen == [dataclasses.replace(mon.settings.watch, grad_clip=1.0, **{name: value})]


def test_a_monitor_config_as_config_still_works_and_warns():
    cfg = MonitorSettings(project="p", hparams={"lr": 0.1}, enabled=False)
    with pytest.warns(DeprecationWarning, match=r"Monitor\(config=MonitorSettings\(\.\.\.\)\) is "
                      r"deprecated .*Monitor\(settings=MonitorSettings\(\.\.\.\)\)") as got:
        mon = Monitor(config=cfg)
    assert got[0].filename == __file__
    assert mon.settings is cfg and mon.config == {"lr": 0.1}
    with pytest.warns(DeprecationWarning, match="config=MonitorSettings"):
        assert Monitor(None, None, cfg).settings is cfg  # the third positional argument
    with pytest.raises(TypeError, match="both config= and settings="):
        Monitor(config=cfg, settings=cfg)


def test_a_watch_config_as_config_still_works_and_warns(monkeypatch):
    mon = Monitor(settings=MonitorSettings(enabled=False))
    seen = _watched(mon, monkeypatch)
    model, opt = _model_and_optimizer()
    wcfg = WatchSettings(grad_clip=1.0, hist_every=0)
    with pytest.warns(DeprecationWarning, match=r"watch\(config=WatchSettings\(\.\.\.\)\) is "
                      r"deprecated .*watch\(settings=WatchSettings\(\.\.\.\)\)") as got:
        mon.watch(model, opt, config=wcfg)
    assert got[0].filename == __file__
    assert seen == [wcfg]
    with pytest.raises(TypeError, match="both config= and settings="):
        mon.watch(model, opt, config=wcfg, settings=wcfg)


def test_monitor_config_attribute_is_settings_with_a_warning():
    mon = Monitor(settings=MonitorSettings(enabled=False))
    with pytest.warns(DeprecationWarning, match="use Monitor.settings"):
        assert mon.monitor_config is mon.settings
