"""What the HF and Lightning callbacks share (``_callbacks.py``): the arguments of
``Monitor(...)`` checked when the callback is made, contradictions and settings fields
refused, ``config=`` the hyperparameters only, and the hyperparameters a framework gives
kept to its plain values. Training with each callback: test_hf.py, test_lightning.py."""

from __future__ import annotations

import importlib

import pytest

from monitor_client import MonitorSettings, WatchSettings
from monitor_client._callbacks import plain_values


def _callback_class(framework: str) -> type:
    pytest.importorskip({"hf": "transformers", "lightning": "lightning.pytorch"}[framework])
    return importlib.import_module(f"monitor_client.{framework}").MonitorCallback


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_a_callback_checks_the_monitors_arguments_when_made(framework):
    callback_class = _callback_class(framework)
    settings = MonitorSettings(project="gpt", watch=WatchSettings(hist_every=0))
    callback = callback_class(url="http://127.0.0.1:1", config={"lr": 0.1}, settings=settings)
    assert callback.monitor is None and callback.config == {"lr": 0.1}
    assert callback.settings == MonitorSettings(url="http://127.0.0.1:1", project="gpt",
                                                watch=WatchSettings(hist_every=0))
    with pytest.raises(TypeError, match=r"project='bert' \(settings has 'gpt'\)"):
        callback_class(project="bert", settings=settings)
    with pytest.raises(TypeError, match="unexpected keyword argument 'linger'"):
        callback_class(project="p", linger=0.1)
    with pytest.raises(TypeError, match="run's hyperparameters, a dict, not MonitorSettings"):
        callback_class(config=MonitorSettings())
    with pytest.raises(RuntimeError, match="training has not started"):
        callback._mon()


def test_a_frameworks_hyperparameters_are_kept_to_plain_values():
    assert plain_values({"lr": 1e-3, "tags": ["a"], "fp16": True, "seed": None,
                         "optim": object()}) == {"lr": 1e-3, "fp16": True, "seed": None}
