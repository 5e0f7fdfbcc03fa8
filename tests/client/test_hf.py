import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from client_shapes import step_shape  # noqa: E402

from monitor_client import Monitor, MonitorSettings, WatchSettings  # noqa: E402
from monitor_client.hf import MonitorCallback  # noqa: E402
from tests.eventually import eventually  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=64, seq=16, vocab=64, poison_from=None):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(tmp_path, callback, steps=6, accum=2, model=None, **overrides):
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                     n_positions=16)
    torch.manual_seed(0)
    model = model or transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(**{
        "output_dir": str(tmp_path / "out"), "max_steps": steps, "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": accum, "learning_rate": 1e-3, "max_grad_norm": 0.5,
        "logging_steps": 1, "eval_strategy": "steps", "eval_steps": 3, "save_strategy": "no",
        "report_to": [], "use_cpu": True, "disable_tqdm": True, "dataloader_num_workers": 0,
        **overrides})
    return transformers.Trainer(model=model, args=args, train_dataset=Tokens(),
                                eval_dataset=Tokens(n=8), callbacks=[callback])


def _monitor(receiver, tmp_path, run_id):
    return Monitor(url=receiver.url, run_id=run_id,
                   settings=MonitorSettings(spool_dir=tmp_path / "spool", install_hooks=False,
                                            linger=0.02, watch=WatchSettings(layer_stats_every=4)))


def test_hf_trainer_run_has_the_plain_loop_shape(receiver, tmp_path, plain_loop_shape):
    callback = MonitorCallback(_monitor(receiver, tmp_path, "hf-1"))
    trainer = _trainer(tmp_path, callback)
    trainer.train()
    steps = receiver.of_kind("step")
    assert [r["step"] for r in steps] == list(range(1, 7))
    assert step_shape(receiver.records) == plain_loop_shape
    assert all(r["tokens"] == 2 * 4 * 16 and r["samples"] == 8 for r in steps)
    assert all(r["clip_threshold"] == 0.5 for r in steps)
    assert [r["step"] for r in receiver.of_kind("eval")] == [3, 6]
    assert receiver.of_kind("end")[0]["status"] == "completed"
    assert trainer.args.max_grad_norm == 0.5  # restored after the run
    # the Trainer's plan reaches the run's config: progress and the ETA come from it
    assert receiver.of_kind("run")[0]["config"]["total_steps"] == 6
    # The Trainer's own log of the same steps agrees with the raw loss we recorded.
    logged = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    for r in steps:
        assert r["loss"] == pytest.approx(logged[r["step"]], rel=1e-3)


def test_hf_grad_norm_is_pre_clip_and_matches_the_trainers(receiver, tmp_path):
    callback = MonitorCallback(_monitor(receiver, tmp_path, "hf-2"), take_over_clipping=True)
    trainer = _trainer(tmp_path, callback, steps=3, accum=1)
    trainer.train()
    ours = [r["grad_norm"] for r in receiver.of_kind("step")]
    assert len(ours) == 3 and all(g > 0.5 for g in ours), ours  # measured before clipping


def test_hf_nan_loss_is_recorded_raw_despite_the_nan_filter(receiver, tmp_path):
    calls = []

    def nan_after_three(module, args, output):
        calls.append(1)
        if module.training and len(calls) > 3:
            output.loss = output.loss * float("nan")
        return output

    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64,
                                     n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    model.register_forward_hook(nan_after_three)  # runs before the callback's own hook
    callback = MonitorCallback(_monitor(receiver, tmp_path, "hf-nan"))
    trainer = _trainer(tmp_path, callback, steps=5, accum=1, model=model)
    trainer.train()
    losses = [r["loss"] for r in receiver.of_kind("step")]
    assert isinstance(losses[0], float) and losses[-1] == "NaN"
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert logged and all(not math.isnan(v) for v in logged)  # the Trainer hid it; we did not


class MaskedFrom(Tokens):
    """Samples from ``masked`` on have every label -100: a batch of them counts no label."""

    def __init__(self, masked: int, **kw):
        super().__init__(**kw)
        self.masked = masked

    def __getitem__(self, i):
        labels = self.ids[i] if i < self.masked else torch.full_like(self.ids[i], -100)
        return {"input_ids": self.ids[i], "labels": labels}


def test_hf_warns_when_a_batch_has_no_label_that_counts(receiver, tmp_path, caplog):
    callback = MonitorCallback(_monitor(receiver, tmp_path, "hf-masked"))
    trainer = _trainer(tmp_path, callback, steps=4, accum=1)
    # In order, 4 per batch: batches 1-2 have labels, batch 3 has none (0/0 = NaN loss).
    trainer.train_dataset = MaskedFrom(masked=8, n=16)
    trainer.args.dataloader_drop_last = True
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(
        trainer.train_dataset)
    trainer.train()
    assert "step 3: a batch has no label that counts" in caplog.text
    assert "step 1: a batch" not in caplog.text and "step 2: a batch" not in caplog.text
    steps = receiver.of_kind("step")
    assert steps and all("min_label_count" not in r for r in steps), steps


def test_hf_callback_passes_monitor_settings_through(receiver, tmp_path):
    cfg = MonitorSettings(url=receiver.url, run_id="hf-cfg", spool_dir=tmp_path / "spool",
                          install_hooks=False, linger=0.02,
                          watch=WatchSettings(layer_stats_every=2, hist_every=0))
    trainer = _trainer(tmp_path, MonitorCallback(settings=cfg), steps=3, accum=1)
    trainer.train()
    run = receiver.of_kind("run")[0]
    assert run["run_id"] == "hf-cfg" and run["config"]["learning_rate"] == 1e-3  # Trainer args
    assert (run["config"]["layer_stats_every"], run["config"]["hist_every"]) == (2, 0)
    assert run["config"]["grad_clip"] == 0.5  # the Trainer's max_grad_norm, taken over
    assert trainer.args.max_grad_norm == 0.5
    assert [bool(r.get("layers")) for r in receiver.of_kind("step")] == [True, False, True]


def test_hf_callback_takes_the_monitors_keywords_and_config_is_the_hyperparameters(
        receiver, tmp_path):
    callback = MonitorCallback(url=receiver.url, project="hf", config={"lr": 1e-3},
                               run_id="hf-kw", settings=MonitorSettings(
                                   spool_dir=tmp_path / "spool", install_hooks=False,
                                   linger=0.02, watch=WatchSettings(hist_every=0)))
    _trainer(tmp_path, callback, steps=2, accum=1).train()
    run = receiver.of_kind("run")[0]
    assert run["run_id"] == "hf-kw" and run["labels"]["project"] == "hf"
    # the given hyperparameters, not the Trainer's; and the Trainer's plan
    assert run["config"] == {"lr": 1e-3, "grad_clip": 0.5, "layer_stats_every": 25,
                             "hist_every": 0, "total_steps": 2}


def test_hf_reports_saves_and_stops_for_a_rollback_leaving_the_plan_for_the_launcher(
        tmp_path, capfd):
    import json

    from actions_stand_in import StandIn, rollback_action

    from monitor_client._resume import RollbackExit

    stand_in = StandIn()
    out = tmp_path / "out"
    # Back to step 2 (data position 2), leaving out batches 3-6; LR x0.5 for 3 steps.
    action = rollback_action(checkpoint_step=2, checkpoint_path=str(out / "checkpoint-2"),
                             skip_from=3, skip_to=6, resume_position=2, skip=[[3, 6]],
                             positions="positions", lr_factor=0.5, lr_steps=3)

    def trainer(**train):
        mon = Monitor(url=stand_in.url, run_id="hf-rollback", settings=MonitorSettings(
            spool_dir=tmp_path / "spool", install_hooks=False, linger=0.02))

        class Decide(transformers.TrainerCallback):
            """The sidecar decides after step 3 (runs after the monitor's callback)."""

            def on_step_end(self, args, state, control, **kw):
                if state.global_step == 3 and not stand_in.actions:
                    stand_in.publish(action)
                    eventually(mon.actions, what="the published plan reached the client")

        made = _trainer(tmp_path, MonitorCallback(mon), steps=12, accum=1, eval_strategy="no",
                        save_strategy="steps", save_steps=2)
        made.add_callback(Decide())
        return made, mon

    try:
        first, mon = trainer()
        with pytest.raises(RollbackExit) as exited:
            first.train()
        left = json.loads((out / "monitor_rollback.json").read_text())
        relaunched, mon2 = trainer()
        relaunched.train(resume_from_checkpoint=left["resume_from_checkpoint"])
    finally:
        stand_in.close()
    # It stopped at the next step, the one the plan was in hand at, said why, and exited
    # with the code a launcher relaunches on.
    assert first.state.global_step == 4 and exited.value.code == 75
    assert "rollback 1/2 (rule RollBack)" in capfd.readouterr().err
    assert [(r["step"], r["path"], r["data_position"]) for r in stand_in.of_kind("checkpoint")
            if r["attempt"] == mon.attempt] == [(2, str(out / "checkpoint-2"), 2),
                                                (4, str(out / "checkpoint-4"), 4)]
    # Each save names the job's saves before it, and the plan file the ones the process
    # vouched for when it stopped: a relaunched process inherits them and vouches for the
    # one it resumed from (a second plan to it acts there, before any save of its own).
    ckpt = {step: str(out / f"checkpoint-{step}") for step in (2, 4, 6)}
    assert json.loads((out / "checkpoint-2" / "monitor_data.json").read_text()) == {
        "data_position": 2, "skip": [], "checkpoints": []}
    assert left["checkpoints"] == [[2, ckpt[2]]]
    assert mon2.job_checkpoints()[:3] == [[2, ckpt[2]], [4, ckpt[4]], [6, ckpt[6]]]
    assert json.loads((out / "checkpoint-6" / "monitor_data.json").read_text())[
        "checkpoints"] == [[2, ckpt[2]], [4, ckpt[4]]]
    assert (left["id"], left["checkpoint_step"], left["skip_to"]) == (5, 2, 6)
    assert left["resume_from_checkpoint"] == str(out / "checkpoint-2")
    [end] = [r for r in stand_in.of_kind("end") if r["attempt"] == mon.attempt]
    assert end["status"] == "stopped" and "rolled back to step 20" in end["error"]
    # The relaunch resumes from the checkpoint, does not take the same plan again, resumes
    # the data after batch 2 leaving 3-6 out, halves the LR for 3 steps, and consumes the
    # plan file.
    assert relaunched.state.global_step == 12
    steps = {r["step"]: r for r in stand_in.of_kind("step") if r["attempt"] == mon2.attempt}
    assert sorted(steps) == list(range(3, 13))
    assert [steps[s]["data_position"] for s in range(3, 13)] == list(range(7, 17))
    before = {r["step"]: r["lr"] for r in stand_in.of_kind("step") if r["attempt"] == mon.attempt}
    assert [steps[s]["lr"] for s in (3, 4)] == pytest.approx([before[3] / 2, before[4] / 2])
    assert steps[6]["lr"] > steps[5]["lr"]  # the factor ended, the schedule goes on
    assert [r["status"] for r in stand_in.of_kind("end") if r["attempt"] == mon2.attempt] == [
        "completed"]
    assert not (out / "monitor_rollback.json").exists()
    assert (out / "monitor_rollback.5.applied.json").exists()


class SlowTokens(Tokens):
    """An evaluation set that takes 0.05 s a sample to read: an evaluation of known length."""

    def __getitem__(self, i):
        import time

        time.sleep(0.05)  # the slow read that makes the evaluation's length known
        return super().__getitem__(i)


def test_hf_eval_seconds_is_the_trainers_runtime_and_a_save_times_itself(receiver, tmp_path):
    mon = _monitor(receiver, tmp_path, "hf-seconds")
    trainer = _trainer(tmp_path, MonitorCallback(mon), steps=6, accum=1, save_strategy="steps",
                       save_steps=3)
    trainer.eval_dataset = SlowTokens(n=8)
    trainer.train()
    runtimes = {h["step"]: h["eval_runtime"] for h in trainer.state.log_history
                if "eval_runtime" in h}
    evals = {r["step"]: r for r in receiver.of_kind("eval")}
    assert sorted(evals) == [3, 6]
    for step, ev in evals.items():
        assert ev["seconds"] == pytest.approx(runtimes[step]) and ev["seconds"] >= 0.4
    # Each save follows its step's evaluation: its seconds run from the eval's record (the
    # default, the time since the previous record), so they hold the save alone.
    saves = receiver.of_kind("checkpoint")
    assert [s["step"] for s in saves] == [3, 6], saves
    for save in saves:
        ev = evals[save["step"]]
        assert 0 < save["seconds"] <= save["time"] - ev["time"] + 0.01
