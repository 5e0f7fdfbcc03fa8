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
  just written ``<output_dir>/checkpoint-<global_step>``; rank 0 reports it). Its
  ``seconds`` is the client's default, the time since the step's record (or the
  evaluation's, when one ran at that step): the Trainer saves right after its step and
  evaluation, and calls ``on_save`` as soon as the save is done. An evaluation's
  ``seconds`` is the Trainer's own ``eval_runtime``.
- The data is counted by position (``monitor_client.DataStream``'s stream, put into the
  Trainer's own DataLoader at the start of training: its batch sampler for a map-style
  dataset, its iteration for an ``IterableDataset``, whose windows are then read past): each
  step's ``data_position`` goes to the sidecar, and each save leaves ``monitor_data.json``
  (the position, the windows skipped so far and the job's saves before it) in its
  ``checkpoint-<step>`` directory. A resume then restarts the data
  there, not where the Trainer's step count puts it (``args.ignore_data_skip`` is set for
  the run: its fast-forward by steps lands in the wrong place once a window was skipped, and
  a shuffled sampler's order would change with a shorter dataset); the checkpoint's RNG
  state is loaded as the Trainer's own skip would have. ``take_over_data=False`` leaves the
  data to the Trainer (then no window can be skipped). A resumed run vouches for the
  checkpoint it resumed from and the saves that file names: a later plan may go back there.
- A rollback plan stops training and is left for the launcher, not applied in place: the
  Trainer owns its loop, and only ``train(resume_from_checkpoint=...)`` restores model,
  optimizer, scheduler, RNG and data position together. So at the step every rank agreed on
  (``Monitor.rollback_plan()``), the callback writes ``<output_dir>/monitor_rollback.json``
  (the plan's fields and ``resume_from_checkpoint``), prints the rollback in the training
  log, sets ``control.should_training_stop``, ends the run ``stopped`` saying so and raises
  ``RollbackExit``: the process exits with code 75 (``exit_on_rollback=False``: training
  just returns). The job's launcher runs it again: under ``torchrun --max-restarts=N`` the
  script passes ``callback.resume_checkpoint(trainer)`` to ``trainer.train`` (the plan's
  checkpoint, or a restart's: the monitor's restart exits 75 too); without a launcher,
  ``python -m monitor_client.relaunch --dir <output_dir> -- python train.py ...`` relaunches
  it with ``--resume_from_checkpoint=<checkpoint>``. The relaunched callback takes the plan
  it was relaunched for (_resume.py): it marks it applied, resumes
  the data at the plan's position leaving every skipped window out, multiplies the LR by
  ``lr_factor`` for ``lr_steps`` steps (around each optimizer step, the scheduler left
  alone) and consumes the plan file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from monitor_client._callbacks import FrameworkCallback
from monitor_client._data import StreamBatches, attach, merge_windows
from monitor_client._hooks import Hooks
from monitor_client._monitor import Monitor
from monitor_client._plain_file import read_json
from monitor_client._resume import say_resumed
from monitor_client._rollback import RollbackPlan
from monitor_client.settings import MonitorSettings

IGNORE_INDEX = -100  # transformers' (and torch's cross_entropy's) default
DATA_FILE = "monitor_data.json"  # in each checkpoint-<step>: where its data resumes
log = logging.getLogger("monitor_client")


class MonitorCallback(FrameworkCallback, TrainerCallback):
    """Report a HuggingFace Trainer run to monitor_agent (``_callbacks.py``: what it shares
    with the Lightning callback).

    Without a ``monitor``, one is made at the start of training from the same arguments as
    ``Monitor(...)``: ``url``, ``project``, ``config`` (the hyperparameters; default: the
    Trainer's arguments), ``run_id``, ``token``,
    ``labels`` and ``settings`` (a ``MonitorSettings``, checked here). ``watch`` gets the
    monitor's ``WatchSettings`` with the clipping set by the Trainer's ``max_grad_norm``.

    Used as ``Trainer(..., callbacks=[MonitorCallback(project="gpt", settings=settings)])``
    (tests/client/test_hf.py trains with it). Until training starts it holds only the
    checked settings::

        >>> from monitor_client.settings import WatchSettings
        >>> settings = MonitorSettings(watch=WatchSettings(activations=True))
        >>> callback = MonitorCallback(project="gpt", settings=settings)
        >>> callback.monitor, callback.settings.project, callback.settings.watch.activations
        (None, 'gpt', True)
    """

    resume_argument = "resume_from_checkpoint"

    def __init__(self, monitor: Monitor | None = None, *, url: str | None = None,
                 project: str | None = None, config: Mapping[str, Any] | None = None,
                 run_id: str | None = None, token: str | None = None,
                 labels: Mapping[str, Any] | None = None, settings: MonitorSettings | None = None,
                 take_over_clipping: bool = True, take_over_data: bool = True,
                 exit_on_rollback: bool = True,
                 total_steps: int | None = None, loss_kind: str | None = None) -> None:
        super().__init__(monitor, url=url, project=project, config=config, run_id=run_id,
                         token=token, labels=labels, settings=settings,
                         exit_on_rollback=exit_on_rollback, total_steps=total_steps,
                         loss_kind=loss_kind)
        self.take_over_clipping = take_over_clipping
        self.take_over_data = take_over_data
        self._losses: list[Any] = []
        self._sum_losses = False
        self._tokens = self._samples = 0
        self._label_counts: list[Any] = []
        self._restore_clip: float | None = None
        self._hooks = Hooks()  # on the model: its inputs counted, its loss read
        self._data: StreamBatches | None = None
        self._position: int | None = None
        self._restore_skip: bool | None = None
        self._step_lr: Any = None

    def resume_checkpoint(self, trainer: Any, timeout: float = 30.0) -> str | None:
        """The checkpoint to pass to ``trainer.train(resume_from_checkpoint=...)`` when the
        job's launcher ran it again for the monitor: a restart's resume point (asked of the
        sidecar on every rank, together), else the rollback plan waiting in ``output_dir``;
        None on a first launch or a relaunch after a crash (resume as the script would).
        Call it on every rank, once, after making the ``Trainer``::

            trainer.train(resume_from_checkpoint=callback.resume_checkpoint(trainer))

        Under ``torchrun --max-restarts=N`` that is the whole relaunch: the rollback's and
        the restart's exit 75 is torchrun's to run again (docs/actions.md, "Under HF
        Trainer and Lightning")."""
        args = trainer.args
        return self._resume_checkpoint(args.output_dir, args.to_dict, timeout)

    def on_train_begin(self, args, state, control, model=None, optimizer=None,
                       train_dataloader=None, **kwargs):
        mon = self._start(args.to_dict, state.max_steps if state.max_steps and
                          state.max_steps > 0 else None)
        plan = self._relaunch.take(args.output_dir, mon._plans, state.global_step)
        saved = self._resumed_from(args, state, plan)
        if self.take_over_data and train_dataloader is not None:
            self._take_over_data(args, state, train_dataloader, plan, saved)
        elif plan is not None and plan.skip:
            log.warning("monitor_client: the rollback's windows (%s) are not skipped: "
                        "take_over_data=False", plan.skip)
        clip = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None
        take_over = self.take_over_clipping and clip is not None and not (
            args.deepspeed or args.fsdp)
        if take_over:
            self._restore_clip, args.max_grad_norm = args.max_grad_norm, 0.0
        opt = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer
        watch = mon.settings.watch
        seq_len = watch.seq_len or getattr(getattr(model, "config", None), "n_positions", None)
        # The Trainer decides the clipping; everything else is the monitor's WatchSettings.
        mon.watch(model, opt, settings=dataclasses.replace(
            watch, grad_clip=clip, apply_clip=take_over, seq_len=seq_len))
        guard = self._hooks.guard  # a failing hook must not end the Trainer's step
        self._hooks.add(model.register_forward_pre_hook(guard(self._count_inputs), with_kwargs=True),
                        model.register_forward_hook(guard(self._capture_loss), with_kwargs=True))

    def _resumed_from(self, args, state, plan: RollbackPlan | None) -> DataFile | None:
        """A resumed run (``state.global_step`` > 0): the checkpoint it resumed from (the
        plan's, else ``<output_dir>/checkpoint-<step>``) and what this callback left in it
        (``monitor_data.json``: where its data resumes, the job's saves before it). A
        checkpoint that holds that file was saved by this job: a later plan may send the
        run back to it, or to one of the saves it names."""
        if state.global_step <= 0:
            return None
        checkpoint = (plan.checkpoint_path if plan is not None else
                      os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))
        saved = _read_data_file(checkpoint)
        if saved is not None:
            self._mon().resumed_from(state.global_step, checkpoint, earlier=saved.checkpoints)
        return saved

    def _take_over_data(self, args, state, loader, plan: RollbackPlan | None,
                        saved: DataFile | None) -> None:
        """Count the Trainer's batches by data position, resumed where the checkpoint (or
        the plan) left the data, the windows left out (module docstring)."""
        position, skip = 0, () if plan is None else plan.skip
        if saved is not None and saved.position is not None:
            position, skip = saved.position, merge_windows([*saved.skip, *skip])
        elif plan is not None:
            position = plan.resume_position
        elif state.global_step > 0:  # a checkpoint from before positions: the Trainer's count
            position = state.global_step * args.gradient_accumulation_steps
        seed = args.data_seed if args.data_seed is not None else args.seed
        # Several processes over a stream: accelerate reads it on the main process and
        # dispatches each step's batches, so no process's batches are its own to count.
        dispatched = args.world_size > 1 and _streamed(loader)
        self._data = None if dispatched else attach(loader, position, skip, seed=seed)
        if self._data is None:
            if skip:
                log.warning("monitor_client: the rollback's windows (%s) cannot be skipped: "
                            "the training data is %s", skip, "a stream dispatched to several "
                            "processes" if dispatched else "not in a DataLoader")
            return
        self._mon()._counting_data(self._data.stream.skips_by)
        if plan is not None:
            say_resumed(plan, position, self._data.stream.windows, self._data.stream.skips_by)
        self._position = position
        # Its fast-forward by steps would land elsewhere: the data resumes by position.
        self._restore_skip, args.ignore_data_skip = args.ignore_data_skip, True
        if state.global_step > 0:
            _load_rng(plan.checkpoint_path if plan is not None else os.path.join(
                args.output_dir, f"checkpoint-{state.global_step}"), args.process_index)

    def _count_inputs(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if module.training and hasattr(ids, "shape") and len(ids.shape) >= 1:
            self._tokens += ids.numel()
            self._samples += ids.shape[0]
        if module.training and self._data is not None:
            self._position = self._data.took()  # the micro-batch being trained
        labels = kwargs.get("labels")
        if module.training and hasattr(labels, "ne") and labels.numel():
            self._label_counts.append(labels.ne(IGNORE_INDEX).sum())  # stays on the device

    def _capture_loss(self, module, args, kwargs, output):
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if module.training and loss is not None:
            self._losses.append(loss.detach())
            self._sum_losses = kwargs.get("num_items_in_batch") is not None

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        opt = getattr(optimizer, "optimizer", optimizer)
        self._relaunch.lr.apply(opt, state.global_step + 1)
        # The LR this step uses (a plan's factor included): on_step_end comes after the
        # scheduler stepped, when the group holds the next step's.
        groups = getattr(opt, "param_groups", None)
        self._step_lr = groups[0].get("lr") if groups else None

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._relaunch.lr.restore()

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        loss = None
        if self._losses:
            stacked = torch.stack(self._losses)
            loss = stacked.sum() if self._sum_losses else stacked.mean()
        extra: dict[str, Any] = {}
        if self._label_counts:
            extra["min_label_count"] = torch.stack(self._label_counts).min()
        if isinstance(self._step_lr, int | float):
            extra["lr"] = float(self._step_lr)
        mon = self._mon()
        mon.log_step(state.global_step, loss=loss, tokens=self._tokens or None,
                     samples=self._samples or None, data_position=self._position, **extra)
        self._losses, self._tokens, self._samples = [], 0, 0
        self._label_counts = []
        self._relaunch.consume_once(state.is_world_process_zero)
        self._honour_actions(args.output_dir, state.is_world_process_zero,
                             stop=lambda: setattr(control, "should_training_stop", True),
                             save=lambda: setattr(control, "should_save", True))
        return control

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            mon = self._mon()
            # Where this checkpoint resumes the data, and the job's saves before it.
            _write_data_file(checkpoint, DataFile(
                self._position or 0, self._data.stream.windows if self._data else (),
                mon.job_checkpoints()), counted=self._data is not None)
            mon.checkpoint_saved(state.global_step, checkpoint, tag="hf",
                                 data_position=self._position)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        metrics = dict(metrics or {})
        val = metrics.pop("eval_loss", None)
        # The Trainer timed the evaluation loop itself (``<prefix>_runtime``): its own
        # measure, which also holds for an evaluation before the first step or after the
        # last (the client's default, the time since its previous record, would not).
        runtime = next((v for k, v in metrics.items() if k.endswith("_runtime")
                        and isinstance(v, int | float) and v >= 0), None)
        extra = {k.removeprefix("eval_"): v for k, v in metrics.items()
                 if isinstance(v, int | float) and not k.endswith(("_runtime", "per_second"))}
        self._mon().log_eval(state.global_step, val_loss=val, epoch=state.epoch, metrics=extra,
                             seconds=runtime)

    def on_train_end(self, args, state, control, **kwargs):
        self._hooks.remove()
        if self._restore_clip is not None:
            args.max_grad_norm, self._restore_clip = self._restore_clip, None
        if self._restore_skip is not None:
            args.ignore_data_skip, self._restore_skip = self._restore_skip, None
        self._end()


@dataclasses.dataclass(frozen=True)
class DataFile:
    """What ``monitor_data.json`` in a ``checkpoint-<step>`` holds: the data position that
    state resumes after, the windows skipped so far (a crash-resume from it skips them too),
    and the job's checkpoints saved before it (``Monitor.job_checkpoints``)."""

    position: int | None  # None: the data was not counted
    skip: tuple[tuple[int, int], ...]
    checkpoints: list[Any]


def _write_data_file(checkpoint: str, data: DataFile, counted: bool) -> None:
    """``checkpoint/monitor_data.json`` (``counted``: the data was counted by position;
    else the file holds the job's checkpoints only)."""
    found: dict[str, Any] = {"checkpoints": data.checkpoints}
    if counted and data.position is not None:
        found.update(data_position=int(data.position), skip=[list(w) for w in data.skip])
    try:
        os.makedirs(checkpoint, exist_ok=True)
        with open(os.path.join(checkpoint, DATA_FILE), "w", encoding="utf-8") as out:
            json.dump(found, out)
    except OSError as exc:
        log.warning("monitor_client: could not write %s in %s: %r", DATA_FILE, checkpoint, exc)


def _read_data_file(checkpoint: str) -> DataFile | None:
    """What the callback left in ``checkpoint`` (a regular file of bounded size:
    _plain_file.py), or None; a file without a position resumes the data by steps."""
    try:
        found = read_json(os.path.join(checkpoint, DATA_FILE))
        if not isinstance(found, dict):
            return None
        position = found.get("data_position")
        return DataFile(int(position) if position is not None else None,
                        merge_windows(found.get("skip") or ()),
                        found.get("checkpoints") or [])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _streamed(loader: Any) -> bool:
    """Whether the Trainer's DataLoader reads an ``IterableDataset``."""
    import torch

    return isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset)


def _load_rng(checkpoint: str, process_index: int) -> None:
    """The checkpoint's RNG states, as the Trainer loads them when it skips the data itself
    (with ``ignore_data_skip`` it does not, mid-epoch)."""
    import random

    import numpy as np
    import torch

    for name in (f"rng_state_{process_index}.pth", "rng_state.pth"):
        path = os.path.join(checkpoint, name)
        if os.path.isfile(path):
            break
    else:
        return
    try:
        state = torch.load(path, weights_only=False)
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.random.set_rng_state(state["cpu"])
        if torch.cuda.is_available() and "cuda" in state:
            cuda = state["cuda"]
            if isinstance(cuda, list | tuple):
                torch.cuda.random.set_rng_state_all(cuda)
            else:
                torch.cuda.random.set_rng_state(cuda)
    except Exception as exc:  # noqa: BLE001 - a resume without it still resumes the data
        log.warning("monitor_client: could not load the RNG state of %s: %r", checkpoint, exc)
