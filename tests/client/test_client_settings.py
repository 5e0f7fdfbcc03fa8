"""MonitorSettings / WatchSettings: the keywords of ``Monitor``/``watch`` are a few of their
fields, with the same names and defaults, and ``settings=`` carries the rest; ``config=`` is
the run's hyperparameters and nothing else; one place rejects nonsense; settings and keywords
that contradict them are a TypeError; and a run reported through a settings object is the run
the keywords report."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from training_steps import log_steps

from monitor_client import Monitor, MonitorSettings, WatchSettings


def _defaults(func, skip=()) -> dict:
    return {name: p.default for name, p in inspect.signature(func).parameters.items()
            if p.default is not inspect.Parameter.empty and name not in skip}


def _fields(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING}


def test_monitor_keywords_are_the_settings_fields_with_the_same_defaults():
    keywords = _defaults(Monitor.__init__, skip={"config", "settings"})
    fields = _fields(MonitorSettings)
    assert keywords == {k: fields[k] for k in keywords}
    # Monitor(config={...}) is the hyperparameters: no setting of that name or meaning
    assert _defaults(Monitor.__init__)["config"] is None
    assert not {"config", "hparams"} & set(fields)


def test_watch_keywords_are_the_watch_settings_fields_with_the_same_defaults():
    # not settings: the optimizer (None: parameters updated by hand) and the model's name
    # (several models per run) say what is watched, not how
    keywords = _defaults(Monitor.watch, skip={"settings", "scaler", "optimizer", "name"})
    fields = _fields(WatchSettings)
    assert keywords == {k: fields[k] for k in keywords} == {"grad_clip": None, "guard": None}
    assert _defaults(Monitor.watch)["optimizer"] is None and _defaults(Monitor.watch)["name"] is None


def test_keywords_build_the_settings_the_object_states():
    cfg = MonitorSettings(project="p", run_id="r1", linger=0.1, enabled=False,
                          watch=WatchSettings(layer_stats_every=7, hist_every=0))
    by_keywords = Monitor(project="p", config={"lr": 0.1}, run_id="r1", settings=MonitorSettings(
        linger=0.1, enabled=False, watch=WatchSettings(layer_stats_every=7, hist_every=0)))
    by_object = Monitor(config={"lr": 0.1}, settings=cfg)
    assert by_keywords.settings == cfg == by_object.settings
    for mon in (by_keywords, by_object):
        assert (mon.run_id, mon.project, mon.config) == ("r1", "p", {"lr": 0.1})
        assert (mon.layer_stats_every, mon.hist_every, mon.active) == (7, 0, False)
    hparams = {"lr": 0.1}
    mon = Monitor(config=hparams, settings=MonitorSettings(enabled=False))
    mon.config["grad_clip"] = 1.0  # the Monitor's copy: the caller's dict is left alone
    assert hparams == {"lr": 0.1}


def test_settings_and_keywords_that_contradict_them_are_a_type_error():
    cfg = MonitorSettings(project="p", enabled=False, watch=WatchSettings(layer_stats_every=5))
    with pytest.raises(TypeError, match=r"project='q' \(settings has 'p'\)"):
        Monitor(project="q", settings=cfg)
    # Repeating the settings' value, or leaving a keyword at its default, is no conflict.
    assert Monitor(None, "p", settings=cfg).settings is cfg
    # A keyword fills a field the settings leave at its default.
    assert Monitor(url="http://h:1", settings=cfg).settings == dataclasses.replace(
        cfg, url="http://h:1")


def test_watch_takes_watch_settings_and_refuses_contradicting_keywords(tmp_path):
    mon = Monitor(url="http://127.0.0.1:1", run_id="w", settings=MonitorSettings(
        spool_dir=tmp_path, install_hooks=False, watch=WatchSettings(layer_stats_every=3)))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"grad_clip=2\.0 \(settings has 1\.0\)"):
        mon.watch(model, opt, settings=WatchSettings(grad_clip=1.0), grad_clip=2.0)
    with pytest.raises(TypeError, match="takes a WatchSettings"):
        mon.watch(model, opt, settings={"grad_clip": 1.0})  # type: ignore[arg-type]
    mon.watch(model, opt, grad_clip=0.5)  # keywords apply over the Monitor's WatchSettings
    assert (mon.config["grad_clip"], mon.config["layer_stats_every"]) == (0.5, 3)
    assert mon.config["hist_every"] == 50
    mon.close(timeout=0)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: MonitorSettings(max_queue=0), "MonitorSettings.max_queue must be a finite number >= 1"),
    (lambda: MonitorSettings(linger=-1), "linger"),
    (lambda: MonitorSettings(spool_max_bytes=0), "spool_max_bytes"),
    (lambda: MonitorSettings(spool_max_age=0), "spool_max_age must be > 0"),
    (lambda: MonitorSettings(timeout=(1.0, -1.0)), "timeout must be seconds > 0"),
    (lambda: MonitorSettings(rank=2, world_size=2), "rank=2 must be below world_size=2"),
    (lambda: WatchSettings(layer_stats_every=0), "WatchSettings.layer_stats_every"),
    (lambda: WatchSettings(hist_every=-1), "hist_every"),
    (lambda: WatchSettings(grad_clip=-1.0), "grad_clip must be > 0"),
    (lambda: WatchSettings(peak_flops=float("inf")), "peak_flops must be > 0"),
])
def test_nonsense_is_refused_where_the_settings_are_built(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(("build", "message"), [
    (lambda: Monitor(config=[("lr", 1)]), r"Monitor\(config=...\) is the run's hyperparameters, "
                                          "a dict, not list"),
    (lambda: MonitorSettings(labels=[("team", "x")]), "labels must be a dict, not list"),
    (lambda: MonitorSettings(watch={"grad_clip": 1.0}), "watch must be a WatchSettings"),
    (lambda: WatchSettings(layer_stats_every="10"), "must be a number, not '10'"),
    (lambda: WatchSettings(hist_every=float("nan")), "must be a number"),
])
def test_wrong_types_are_type_errors(build, message):
    with pytest.raises(TypeError, match=message):
        build()


def test_values_that_mean_something_pass():
    WatchSettings(grad_clip=float("inf"), hist_every=0, snapshot_budget_bytes=1)
    # 0 is how scripts say "no clipping" (nanoGPT: grad_clip = 0.0 "disables")
    assert WatchSettings(grad_clip=0.0) == WatchSettings(grad_clip=0) == WatchSettings()
    MonitorSettings(spool_max_age=None, linger=0, timeout=3, close_timeout=0, rank=0,
                    world_size=1, labels={"team": "x"})


def test_settings_are_frozen_values():
    cfg = MonitorSettings(project="p")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.project = "q"  # type: ignore[misc]
    assert dataclasses.replace(cfg, project="q") == MonitorSettings(project="q")


def test_a_run_reported_through_settings_matches_the_keywords(receiver, tmp_path):
    def run(mon: Monitor) -> dict:
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model, opt)
        log_steps(mon, model, opt, range(1, 4))
        assert mon.close(timeout=10)
        return next(r for r in receiver.of_kind("run") if r["run_id"] == mon.run_id)

    common = dict(spool_dir=tmp_path, install_hooks=False, linger=0.02,
                  watch=WatchSettings(hist_every=0, layer_stats_every=2))
    by_keywords = run(Monitor(url=receiver.url, project="p", config={"lr": 0.1}, run_id="kw",
                              labels={"team": "x"}, settings=MonitorSettings(**common)))
    cfg = MonitorSettings(url=receiver.url, project="p", run_id="obj", labels={"team": "x"},
                          **common)
    by_object = run(Monitor(config={"lr": 0.1}, settings=cfg))
    assert by_object["config"] == by_keywords["config"] == {
        "lr": 0.1, "grad_clip": None, "layer_stats_every": 2, "hist_every": 0}
    assert by_object["labels"] == by_keywords["labels"]
    steps = [r for r in receiver.of_kind("step") if r["run_id"] == "obj"]
    assert [bool(r.get("layers")) for r in steps] == [True, False, True]


def test_loss_kind_is_sent_in_the_run_config_and_checked_before_training():
    mon = Monitor(loss_kind="rl", settings=MonitorSettings(enabled=False))
    assert mon.config == {"loss_kind": "rl"} and mon.settings.loss_kind == "rl"
    assert "loss_kind" not in Monitor(settings=MonitorSettings(enabled=False)).config
    with pytest.raises(ValueError, match="loss_kind='reward'"):
        MonitorSettings(loss_kind="reward")
