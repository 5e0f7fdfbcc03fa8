import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from client_shapes import step_shape  # noqa: E402

from monitor_client import DataStream, Monitor, MonitorSettings, WatchSettings  # noqa: E402
from monitor_client.lightning import MonitorCallback  # noqa: E402
from tests.eventually import eventually  # noqa: E402


class Regressor(pl.LightningModule):
    def __init__(self, fail_at: int | None = None):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        if self.fail_at is not None and self.global_step >= self.fail_at:
            raise RuntimeError("exploded in training_step")
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _loader(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    return torch.utils.data.DataLoader(data, batch_size=8)


def _fit(receiver, tmp_path, run_id, model, steps=6, accum=2):
    mon = Monitor(url=receiver.url, run_id=run_id,
                  settings=MonitorSettings(spool_dir=tmp_path / "spool", install_hooks=False,
                                           linger=0.02, watch=WatchSettings(layer_stats_every=4)))
    trainer = pl.Trainer(max_steps=steps, accumulate_grad_batches=accum,
                         gradient_clip_val=0.05, val_check_interval=4, limit_val_batches=2,
                         callbacks=[MonitorCallback(mon, tokens_per_sample=4)],
                         accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(model, DataStream(_loader()), _loader(16))
    return trainer


def test_lightning_run_has_the_plain_loop_shape(receiver, tmp_path, plain_loop_shape):
    _fit(receiver, tmp_path, "pl-1", Regressor())
    steps = receiver.of_kind("step")
    assert [r["step"] for r in steps] == list(range(1, 7))
    assert step_shape(receiver.records) == plain_loop_shape
    assert all(r["samples"] == 16 and r["tokens"] == 64 for r in steps)
    assert all(r["clip_threshold"] == 0.05 for r in steps)
    assert all(r["grad_norm"] > 0.05 for r in steps)  # measured before Lightning clips
    assert len(receiver.of_kind("eval")) >= 1
    assert receiver.of_kind("end")[0]["status"] == "completed"
    # the trainer's plan reaches the run's config: progress and the ETA come from it
    assert receiver.of_kind("run")[0]["config"]["total_steps"] == 6


def test_lightning_exception_ends_the_run_failed(receiver, tmp_path):
    with pytest.raises(RuntimeError, match="exploded"):
        _fit(receiver, tmp_path, "pl-fail", Regressor(fail_at=3))
    end = receiver.of_kind("end")[0]
    assert end["status"] == "failed" and "exploded in training_step" in end["error"]
    assert [r["step"] for r in receiver.of_kind("step")] == [1, 2, 3]


def test_lightning_callback_passes_monitor_settings_through(receiver, tmp_path):
    cfg = MonitorSettings(url=receiver.url, run_id="pl-cfg", spool_dir=tmp_path / "spool",
                          install_hooks=False, linger=0.02,
                          watch=WatchSettings(layer_stats_every=3, hist_every=0))
    trainer = pl.Trainer(max_steps=4, gradient_clip_val=0.05, limit_val_batches=0,
                         callbacks=[MonitorCallback(settings=cfg, tokens_per_sample=4)],
                         accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(Regressor(), _loader())
    run = receiver.of_kind("run")[0]
    assert run["run_id"] == "pl-cfg"  # the module saved no hparams: only the watch settings
    assert run["config"] == {"grad_clip": 0.05, "layer_stats_every": 3, "hist_every": 0,
                             "total_steps": 4}  # the trainer's plan
    steps = receiver.of_kind("step")
    assert all(r["clip_threshold"] == 0.05 for r in steps)  # Lightning's clip, recorded
    assert [bool(r.get("layers")) for r in steps] == [True, False, False, True]


def test_lightning_callback_takes_the_monitors_keywords_and_config_is_the_hyperparameters(
        receiver, tmp_path):
    callback = MonitorCallback(url=receiver.url, project="pl", config={"lr": 1e-2},
                               run_id="pl-kw", tokens_per_sample=4, settings=MonitorSettings(
                                   spool_dir=tmp_path / "spool", install_hooks=False,
                                   linger=0.02, watch=WatchSettings(hist_every=0)))
    trainer = pl.Trainer(max_steps=2, limit_val_batches=0, callbacks=[callback],
                         accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(Regressor(), _loader())
    run = receiver.of_kind("run")[0]
    assert run["run_id"] == "pl-kw" and run["labels"]["project"] == "pl"
    assert run["config"] == {"lr": 1e-2, "grad_clip": None, "layer_stats_every": 25,
                             "hist_every": 0, "total_steps": 2}


def test_lightning_reports_saves_and_stops_for_a_rollback_leaving_the_plan_for_the_launcher(
        tmp_path, capfd):
    import json

    from actions_stand_in import StandIn, rollback_action

    from monitor_client._resume import RollbackExit

    stand_in = StandIn()
    ckpts = tmp_path / "ckpts"
    saved = str(ckpts / "epoch=0-step=2.ckpt")
    action = rollback_action(checkpoint_step=2, checkpoint_path=saved, skip_from=3, skip_to=6,
                             resume_position=2, skip=[[3, 6]], positions="positions",
                             lr_factor=0.5, lr_steps=3)

    def trainer(kw_seen: list, dirpath=ckpts, steps=12):
        mon = Monitor(url=stand_in.url, run_id="pl-rollback", settings=MonitorSettings(
            spool_dir=tmp_path / "spool", install_hooks=False, linger=0.02))

        class Decide(pl.Callback):
            """The sidecar decides after step 3 (runs after the monitor's callback)."""

            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                kw_seen.append(batch[0][:, 0].tolist())
                if trainer.global_step == 3 and not stand_in.actions:
                    stand_in.publish(action)
                    eventually(mon.actions, what="the published plan reached the client")

        saves = pl.callbacks.ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2,
                                             save_top_k=-1)
        made = pl.Trainer(max_steps=steps, callbacks=[MonitorCallback(mon), Decide(), saves],
                          accelerator="cpu", logger=False, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=tmp_path,
                          limit_val_batches=0)
        return made, mon

    def data():
        loader = _loader(128)
        return DataStream(torch.utils.data.DataLoader(loader.dataset, batch_size=8,
                                                      shuffle=True))

    reference: list = []
    ref_trainer, _ = trainer(reference, dirpath=tmp_path / "reference", steps=16)
    stand_in.actions.append({"id": 99, "action": "checkpoint"})  # no rollback for it
    first_seen: list = []
    relaunch_seen: list = []
    try:
        ref_trainer.fit(Regressor(), data())
        first, mon = trainer(first_seen)
        stand_in.actions.clear()
        with pytest.raises(RollbackExit) as exited:
            first.fit(Regressor(), data())
        left = json.loads((tmp_path / "monitor_rollback.json").read_text())
        relaunched, mon2 = trainer(relaunch_seen)
        relaunched.fit(Regressor(), data(), ckpt_path=left["ckpt_path"])
    finally:
        stand_in.close()
    assert first.global_step == 4 and exited.value.code == 75  # stopped where it had the plan
    assert "rollback 1/2 (rule RollBack)" in capfd.readouterr().err
    assert [(r["step"], r["path"]) for r in stand_in.of_kind("checkpoint")
            if r["attempt"] == mon.attempt] == [(2, saved), (4, str(ckpts / "epoch=0-step=4.ckpt"))]
    assert (left["id"], left["checkpoint_step"], left["ckpt_path"]) == (5, 2, saved)
    [end] = [r for r in stand_in.of_kind("end") if r["attempt"] == mon.attempt]
    assert end["status"] == "stopped" and "rolled back to step 20" in end["error"]
    # The relaunch resumes from the checkpoint and does not take the same plan again; its
    # data resumes after batch 2 (not at batch 1), batches 3-6 left out, the order the
    # reference run had; the LR is halved for 3 steps; the plan file is consumed.
    assert relaunched.global_step == 12
    steps = {r["step"]: r for r in stand_in.of_kind("step") if r["attempt"] == mon2.attempt}
    assert sorted(steps) == list(range(3, 13))
    assert [steps[s]["data_position"] for s in range(3, 13)] == list(range(7, 17))
    assert relaunch_seen == reference[6:16]
    before = {r["step"]: r["lr"] for r in stand_in.of_kind("step") if r["attempt"] == mon.attempt}
    assert [steps[s]["lr"] for s in (3, 4, 5, 6)] == pytest.approx(
        [before[3] / 2, before[4] / 2, before[4] / 2, before[4]])
    assert not (tmp_path / "monitor_rollback.json").exists()


# Records are stamped with time.time(), durations measured on the monotonic clock: what the
# two may differ by over a second (a resolution, not a speed).
CLOCKS = 0.01


class SlowValidation(Regressor):
    def validation_step(self, batch, batch_idx):
        import time

        time.sleep(0.1)  # a validation of known length
        return super().validation_step(batch, batch_idx)


def test_lightning_times_validation_and_saves_apart(receiver, tmp_path):
    """A save of 0.3 s (slow storage) right after step 2, then a validation of 0.2 s: the
    eval record's seconds hold the validation alone, the checkpoint's the save alone (the
    client's default would give the eval both, and the save the next batch's fetch)."""
    import time

    from lightning.pytorch.plugins.io import TorchCheckpointIO

    class SlowStorage(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            time.sleep(0.3)  # a save of known length
            super().save_checkpoint(checkpoint, path, storage_options)

    mon = Monitor(url=receiver.url, run_id="pl-seconds",
                  settings=MonitorSettings(spool_dir=tmp_path / "spool", install_hooks=False,
                                           linger=0.02))
    saves = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2,
                                         save_top_k=-1)
    trainer = pl.Trainer(max_steps=4, val_check_interval=2, limit_val_batches=2,
                         callbacks=[MonitorCallback(mon), saves], plugins=[SlowStorage()],
                         accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path,
                         num_sanity_val_steps=0)
    trainer.fit(SlowValidation(), DataStream(_loader()), _loader(16))
    evals = receiver.of_kind("eval")
    checkpoints = receiver.of_kind("checkpoint")
    assert [r["step"] for r in evals] == [2, 4]
    assert [r["step"] for r in checkpoints] == [2, 4]
    # Each holds at least its own sleep, and the two are apart: both fit, one after the
    # other, between the step's record and the later of theirs (an eval that held the save
    # too, or a save that held the validation, would count one sleep twice). The run's own
    # clock, not a speed limit: a loaded machine stretches the interval as much as them.
    steps = {r["step"]: r for r in receiver.of_kind("step")}
    for ev, ck in zip(evals, checkpoints, strict=True):
        assert ev["seconds"] >= 0.2 and ck["seconds"] >= 0.3, (ev, ck)
        span = max(ev["time"], ck["time"]) - steps[ev["step"]]["time"]
        assert ev["seconds"] + ck["seconds"] <= span + CLOCKS, (ev, ck, span)


class Numbers(torch.utils.data.IterableDataset):
    """A stream of samples ``(x, y, i)``, sample ``i`` the ``i``-th to arrive."""

    def __iter__(self):
        for i in range(400):
            g = torch.Generator().manual_seed(i)
            x = torch.randn(8, generator=g)
            yield x, x.sum(dim=0, keepdim=True), i


class Logged(Regressor):
    """Logs the first sample id of each batch it trains."""

    def __init__(self):
        super().__init__()
        self.trained: list[int] = []

    def training_step(self, batch, batch_idx):
        x, y, i = batch
        self.trained.append(int(i[0]))
        return super().training_step((x, y), batch_idx)


def test_lightning_counts_a_stream_by_the_batch_it_trains_and_resumes_there(receiver,
                                                                            tmp_path):
    # Lightning fetches a batch ahead of a loader without a length; the position each step
    # sends is the batch it trained, and a fit resumed from a save resumes the stream
    # after it, not at the stream's start. (A DataStream over a stream used to say its
    # length was 0.)
    def fit(run_id, ckpt_path=None, steps=6):
        mon = Monitor(url=receiver.url, run_id=run_id, settings=MonitorSettings(
            spool_dir=tmp_path / "spool", install_hooks=False, linger=0.02))
        module = Logged()
        saves = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3,
                                             save_top_k=-1)
        trainer = pl.Trainer(max_steps=steps, callbacks=[MonitorCallback(mon), saves],
                             accelerator="cpu", logger=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=tmp_path)
        trainer.fit(module, DataStream(torch.utils.data.DataLoader(Numbers(), batch_size=4)),
                    ckpt_path=ckpt_path)
        return module, mon
    first, mon = fit("pl-stream")
    assert first.trained == [0, 4, 8, 12, 16, 20]
    sent = [(r["step"], r["data_position"]) for r in receiver.of_kind("step")
            if r["attempt"] == mon.attempt]
    assert sent == [(s, s) for s in range(1, 7)]
    assert receiver.of_kind("run")[0]["data"] == {"skips_by": "reading"}
    again, _ = fit("pl-stream", ckpt_path=str(tmp_path / "ckpts" / "epoch=0-step=3.ckpt"))
    assert again.trained == [12, 16, 20]  # positions 4-6: the stream resumed after 3
