"""What the HF and Lightning callbacks share (``_callbacks.py``): the arguments of
``Monitor(...)`` checked when the callback is made, contradictions and settings fields
refused, ``config=`` the hyperparameters only, and the hyperparameters a framework gives
kept to its plain values. Training with each callback: test_hf.py, test_lightning.py."""

from __future__ import annotations

import importlib
import inspect
from types import SimpleNamespace

import pytest

from monitor_client import Monitor, MonitorSettings, WatchSettings
from monitor_client._callbacks import plain_values
from monitor_client._rollback import RollbackPlan, write_resume_file


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


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_a_callback_takes_every_keyword_monitor_takes(framework):
    """docs/client.md: the callbacks "take Monitor's keywords" (a Lightning GAN's
    ``loss_kind="gan"`` was refused with a TypeError)."""
    callback_class = _callback_class(framework)
    wanted = set(inspect.signature(Monitor.__init__).parameters) - {"self"}
    assert wanted <= set(inspect.signature(callback_class.__init__).parameters)
    callback = callback_class(project="gan", loss_kind="gan", total_steps=500)
    assert (callback.settings.loss_kind, callback.settings.total_steps) == ("gan", 500)


def test_a_frameworks_hyperparameters_are_kept_to_plain_values():
    assert plain_values({"lr": 1e-3, "tags": ["a"], "fp16": True, "seed": None,
                         "optim": object()}) == {"lr": 1e-3, "fp16": True, "seed": None}


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_a_relaunched_script_is_told_the_checkpoint_of_the_plan_waiting(framework, tmp_path,
                                                                       monkeypatch):
    """``resume_checkpoint``: None on a first launch, then the checkpoint of the rollback plan
    the callback left before its exit 75, in the framework's resume argument (torchrun
    relaunched the command as it was). With a sidecar's restart:
    tests/e2e/test_framework_torchrun.py."""
    monkeypatch.setenv("MONITOR_AGENT_SPOOL_DIR", str(tmp_path / "spool"))
    callback = _callback_class(framework)(url="http://127.0.0.1:9", project="p", run_id="r")
    trainer = SimpleNamespace(args=SimpleNamespace(output_dir=str(tmp_path), to_dict=dict),
                              default_root_dir=str(tmp_path))
    try:
        assert callback.resume_checkpoint(trainer, timeout=0.1) is None
        plan = RollbackPlan.from_action({"id": 3, "action": "rollback", "plan": {
            "checkpoint_step": 10, "checkpoint_path": str(tmp_path / "a"), "skip_from": 11,
            "skip_to": 15}})
        assert plan is not None
        write_resume_file(tmp_path, plan, **{callback.resume_argument: str(tmp_path / "b")})
        assert callback.resume_checkpoint(trainer, timeout=0.1) == str(tmp_path / "b")
    finally:
        callback.monitor.close()
