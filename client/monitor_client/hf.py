"""``MonitorCallback`` for the HuggingFace ``Trainer``: pass it in the Trainer's callbacks,
``Trainer(model, args, train_dataset=ds, callbacks=[MonitorCallback(project="gpt")])``.
tests/client/test_hf.py drives it with a real Trainer.

What it does, and why:
- The loss is read raw from the model's forward output (a forward hook), never from the
  Trainer's logs: with ``logging_nan_inf_filter`` (on by default) the Trainer replaces a
  NaN/inf loss by the running average in what it logs, hiding exactly what we look for.
  Micro-batch losses are combined per optimizer step (mean, or sum when the model
  normalises by ``num_items_in_batch``), still on the device.
- Gradient statistics come from the optimizer hooks of ``Monitor.watch``. The Trainer
  clips before the optimizer step, which would leave us only post-clip gradients, so by
  default the callback takes clipping over: it sets ``args.max_grad_norm`` to 0 for the
  run and clips in its pre-step hook by the same rule (restored at the end of training).
  ``take_over_clipping=False`` leaves the Trainer's clipping alone (grad norms are then
  post-clip). With DeepSpeed or FSDP the Trainer's own clipping is kept regardless.
- Tokens and samples are counted from ``input_ids`` shapes (no device sync).
- Labels that count (not ``-100``, the ignore index of transformers' losses) are counted
  per micro-batch on the device; the fewest of the step goes out as ``min_label_count``
  with the step's one host copy, and a batch with none (every label masked: a mean loss of
  0/0 = NaN, a classic source of a NaN loss) is warned about in the training log.
- Actions from alert rules are honoured after each step: ``stop`` sets
  ``control.should_training_stop`` (the run ends ``stopped``), ``checkpoint`` sets
  ``control.should_save``.
- Every save is reported to the sidecar's checkpoint ledger (``on_save``: the Trainer has
  just written ``<output_dir>/checkpoint-<global_step>``; rank 0 reports it).
- A rollback plan stops training and is left for the launcher, not applied in place: the
  Trainer owns its loop, and only ``train(resume_from_checkpoint=...)`` restores model,
  optimizer, scheduler, RNG and data position together. So at the step every rank agreed on
  (``Monitor.rollback_plan()``), the callback writes ``<output_dir>/monitor_rollback.json``
  (the plan's fields and ``resume_from_checkpoint``), sets
  ``control.should_training_stop``, and the run ends ``stopped`` saying so. The launcher
  relaunches with ``trainer.train(resume_from_checkpoint=plan["resume_from_checkpoint"])``;
  the relaunched callback finds the file and marks that plan applied, so it is not taken
  again. The Trainer's resume replays the batches after the checkpoint in their original
  order: skipping the window (``skip_batches`` optimizer steps' worth) is the launcher's, by
  the dataset it passes (README, "Closing the loop").
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from monitor_client._arguments import monitor_settings
from monitor_client._monitor import Monitor
from monitor_client._rollback import RollbackPlan, read_resume_file, write_resume_file
from monitor_client.config import MonitorConfig

IGNORE_INDEX = -100  # transformers' (and torch's cross_entropy's) default


class MonitorCallback(TrainerCallback):
    """Report a HuggingFace Trainer run to monitor_agent.

    Without a ``monitor``, one is made at the start of training from the same arguments as
    ``Monitor(...)``: ``url``, ``project``, ``config`` (the hyperparameters; default: the
    Trainer's arguments, unless ``settings.hparams`` names them), ``run_id``, ``token``,
    ``labels`` and ``settings`` (a ``MonitorConfig``, checked here). ``watch`` gets the
    monitor's ``WatchConfig`` with the clipping set by the Trainer's ``max_grad_norm``.

    Used as ``Trainer(..., callbacks=[MonitorCallback(project="gpt", settings=settings)])``
    (tests/client/test_hf.py trains with it). Until training starts it holds only the
    checked settings::

        >>> from monitor_client.config import WatchConfig
        >>> settings = MonitorConfig(watch=WatchConfig(activations=True))
        >>> callback = MonitorCallback(project="gpt", settings=settings)
        >>> callback.monitor, callback.settings.project, callback.settings.watch.activations
        (None, 'gpt', True)
    """

    def __init__(self, monitor: Monitor | None = None, *, url: str | None = None,
                 project: str | None = None, config: Mapping[str, Any] | None = None,
                 run_id: str | None = None, token: str | None = None,
                 labels: Mapping[str, Any] | None = None, settings: MonitorConfig | None = None,
                 take_over_clipping: bool = True, **legacy: Any) -> None:
        self.monitor = monitor
        self.take_over_clipping = take_over_clipping
        self.settings = monitor_settings("MonitorCallback", config, settings, dict(
            url=url, project=project, run_id=run_id, token=token, labels=labels), legacy)
        self._losses: list[Any] = []
        self._sum_losses = False
        self._tokens = self._samples = 0
        self._label_counts: list[Any] = []
        self._restore_clip: float | None = None
        self._handles: list[Any] = []
        self.rollback: RollbackPlan | None = None  # the plan this process stopped for

    def _mon(self) -> Monitor:
        """The run's Monitor (made at the start of training when none was given)."""
        if self.monitor is None:
            raise RuntimeError("MonitorCallback: training has not started")
        return self.monitor

    def _make_monitor(self, args: Any) -> Monitor:
        settings = self.settings
        if settings.hparams is None:
            hparams = {k: v for k, v in args.to_dict().items() if _plain_value(v)}
            settings = dataclasses.replace(settings, hparams=hparams)
        return Monitor(settings=settings)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        mon = self.monitor if self.monitor is not None else self._make_monitor(args)
        self.monitor = mon
        left = read_resume_file(args.output_dir)
        if left is not None:  # relaunched for that plan: it is done, not an order again
            mon._plans.applied(left["id"])
        if state.max_steps and state.max_steps > 0:  # the plan, for progress and the ETA
            mon.config.setdefault("total_steps", int(state.max_steps))
        clip = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None
        take_over = self.take_over_clipping and clip is not None and not (
            args.deepspeed or args.fsdp)
        if take_over:
            self._restore_clip, args.max_grad_norm = args.max_grad_norm, 0.0
        opt = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer
        watch = mon.settings.watch
        seq_len = watch.seq_len or getattr(getattr(model, "config", None), "n_positions", None)
        # The Trainer decides the clipping; everything else is the monitor's WatchConfig.
        mon.watch(model, opt, settings=dataclasses.replace(
            watch, grad_clip=clip, apply_clip=take_over, seq_len=seq_len))
        self._handles = [
            model.register_forward_pre_hook(self._count_inputs, with_kwargs=True),
            model.register_forward_hook(self._capture_loss, with_kwargs=True)]

    def _count_inputs(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if module.training and hasattr(ids, "shape") and len(ids.shape) >= 1:
            self._tokens += ids.numel()
            self._samples += ids.shape[0]
        labels = kwargs.get("labels")
        if module.training and hasattr(labels, "ne") and labels.numel():
            self._label_counts.append(labels.ne(IGNORE_INDEX).sum())  # stays on the device

    def _capture_loss(self, module, args, kwargs, output):
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if module.training and loss is not None:
            self._losses.append(loss.detach())
            self._sum_losses = kwargs.get("num_items_in_batch") is not None

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        loss = None
        if self._losses:
            stacked = torch.stack(self._losses)
            loss = stacked.sum() if self._sum_losses else stacked.mean()
        extra: dict[str, Any] = {}
        if self._label_counts:
            extra["min_label_count"] = torch.stack(self._label_counts).min()
        mon = self._mon()
        mon.log_step(state.global_step, loss=loss, tokens=self._tokens or None,
                     samples=self._samples or None, **extra)
        self._losses, self._tokens, self._samples = [], 0, 0
        self._label_counts = []
        if mon.should_stop():
            control.should_training_stop = True
        if mon.should_checkpoint():
            control.should_save = True
        plan = mon.rollback_plan()
        if plan is not None and self.rollback is None:
            self.rollback = plan
            if state.is_world_process_zero:
                write_resume_file(args.output_dir, plan,
                                  resume_from_checkpoint=plan.checkpoint_path)
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._mon().checkpoint_saved(state.global_step, os.path.join(
                args.output_dir, f"checkpoint-{state.global_step}"), tag="hf")

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        metrics = dict(metrics or {})
        val = metrics.pop("eval_loss", None)
        extra = {k.removeprefix("eval_"): v for k, v in metrics.items()
                 if isinstance(v, int | float) and not k.endswith(("_runtime", "per_second"))}
        self._mon().log_eval(state.global_step, val_loss=val, epoch=state.epoch, metrics=extra)

    def on_train_end(self, args, state, control, **kwargs):
        for handle in self._handles:
            handle.remove()
        if self._restore_clip is not None:
            args.max_grad_norm, self._restore_clip = self._restore_clip, None
        if self.rollback is not None:
            self._mon().close(status="stopped", error=f"stopped to roll back: "
                              f"{self.rollback.message or self.rollback.checkpoint_path}")
        else:
            self._mon().close()


def _plain_value(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)
