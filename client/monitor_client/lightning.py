"""``MonitorCallback`` for Lightning (``lightning.pytorch``): pass it in the Trainer's
callbacks, ``L.Trainer(callbacks=[MonitorCallback(project="gpt")], gradient_clip_val=1.0)``.
tests/client/test_lightning.py drives it with a real Trainer.

Lightning runs the optimizer step with a closure (forward and backward happen inside
``optimizer.step``), so the torch step pre-hook would fire before the gradients exist.
The callback therefore measures the gradients in ``on_before_optimizer_step`` (after
backward and unscaling, before Lightning's clipping: the norms are pre-clip) and leaves the
parameter/update statistics to the step post-hook. Lightning keeps doing the clipping; we
record ``gradient_clip_val`` as the threshold.

Per optimizer step it logs the loss Lightning returned from ``training_step`` (summed
over accumulated micro-batches, which Lightning already divided by their number) and the
batch size as ``samples``; pass ``tokens_per_sample=`` for tokens/s and MFU. The run ends
``failed`` on an exception inside ``fit``.

Actions from alert rules are honoured after each optimizer step: ``stop`` sets
``trainer.should_stop`` (the run ends ``stopped``), ``checkpoint`` saves
``monitor-step<N>.ckpt`` under ``checkpoint_dir`` (default: the trainer's root dir).

Saves are reported to the sidecar's checkpoint ledger (rank 0). Lightning tells a callback
that a checkpoint is being made (``on_save_checkpoint``) before the file exists and without
its path, and names no public "file just written" (``last_model_path`` is set only with
``save_last``; ``best_model_path`` is the best by the monitored metric, not the newest). So
at the next batch start and at the end of fitting, after every ``ModelCheckpoint`` has run,
the callback reads each one's newest save (``_last_checkpoint_saved`` and
``_last_global_step_saved``, falling back to ``last_model_path``) and reports the ones not
reported yet; ``monitor-step<N>.ckpt`` saves are reported as they are written.

How long each took (the ``seconds`` of eval and checkpoint records, the goodput ledger's):
a save reported later is timed from ``on_save_checkpoint`` (its dict is being made, the
write comes next) to its file's modification time (the write done); a save whose file
cannot be read so (a remote path, a weights-only save, which calls no callback) gets the
client's default, the time since the previous record. A validation is timed from
``on_validation_start`` to ``on_validation_epoch_end``: the client's default would also
hold a ``ModelCheckpoint`` save that ran between the step and the validation.

The data: a plain DataLoader restarts its epoch from its first batch on ``fit(ckpt_path=)``
(Lightning warns, and only for a map-style dataset), so pass the train loader wrapped,
``trainer.fit(module, monitor_client.DataStream(loader))`` (or return one from
``train_dataloader()``): a stateful loader, whose position Lightning keeps in every
checkpoint and gives back on resume, counted by data position (each step's
``data_position`` goes to the sidecar), over a map-style dataset or a stream alike (a
stream's windows are read past). Lightning fetches a batch ahead of a loader without a
length, so the callback counts each batch as its step starts. Without it no position is sent
and no window can be skipped (a warning says so when a plan has one). Each checkpoint keeps
the job's saves before it (the callback's ``state_dict``): a fit resumed from it vouches for
them and for the checkpoint itself, so a later plan may go back there.

A rollback plan stops the fit and is left for the launcher, not applied in place: only
``fit(ckpt_path=...)`` restores module, optimizers, schedulers and loop progress together,
and a fit loop cannot be rewound from inside a callback. At the step every rank agreed on
(``Monitor.rollback_plan()``), it writes ``<checkpoint_dir>/monitor_rollback.json`` (the
plan's fields and ``ckpt_path``), prints the rollback in the training log, sets
``trainer.should_stop``, ends the run ``stopped`` saying so, and raises ``RollbackExit`` at
the end of the fit: the process exits with code 75 (``exit_on_rollback=False``: ``fit``
just returns). The job's launcher runs it again: under ``torchrun --max-restarts=N`` the
script passes ``callback.resume_checkpoint(trainer)`` to ``fit`` as ``ckpt_path`` (the plan's
checkpoint, or a restart's: the monitor's restart exits 75 too); without a launcher,
``python -m monitor_client.relaunch --dir <checkpoint_dir> -- python train.py ...``
relaunches it with ``--ckpt_path=<checkpoint>``. The relaunched callback takes the plan it
was relaunched for (_resume.py): marks it applied, leaves the plan's windows out of the
``DataStream`` (resumed where the checkpoint left it), multiplies the LR by ``lr_factor``
for ``lr_steps`` steps (around each optimizer step, the scheduler left alone) and consumes
the plan file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl

from monitor_client._callbacks import FrameworkCallback
from monitor_client._data import DataStream
from monitor_client._exit_hooks import outcome_of
from monitor_client._monitor import Monitor
from monitor_client._resume import RollbackExit, say_resumed
from monitor_client.settings import MonitorSettings

log = logging.getLogger("monitor_client")


class MonitorCallback(FrameworkCallback, pl.Callback):
    """Report a Lightning run to monitor_agent (``_callbacks.py``: what it shares with the
    HF callback).

    Without a ``monitor``, one is made when fitting starts from the same arguments as
    ``Monitor(...)``: ``url``, ``project``, ``config`` (the hyperparameters; default: the
    module's ``hparams``), ``run_id``, ``token``,
    ``labels`` and ``settings`` (a ``MonitorSettings``, checked here). ``watch`` gets the
    monitor's ``WatchSettings`` with Lightning's clipping value and ``pre_hook=False``.

    Used as ``L.Trainer(callbacks=[MonitorCallback(project="gpt", settings=settings)])``
    (tests/client/test_lightning.py fits with it). Until fitting starts it holds only the
    checked settings; a keyword that contradicts them is refused at once::

        >>> from monitor_client.settings import WatchSettings
        >>> settings = MonitorSettings(project="gpt", watch=WatchSettings(hist_every=0))
        >>> callback = MonitorCallback(tokens_per_sample=1024, settings=settings)
        >>> callback.monitor, callback.settings.project, callback.settings.watch.hist_every
        (None, 'gpt', 0)
        >>> MonitorCallback(project="bert", settings=settings)
        Traceback (most recent call last):
        monitor_client._errors.SettingsTypeError: MonitorCallback(): got settings=... that ...
    """

    resume_argument = "ckpt_path"

    def __init__(self, monitor: Monitor | None = None, *, url: str | None = None,
                 project: str | None = None, config: Mapping[str, Any] | None = None,
                 run_id: str | None = None, token: str | None = None,
                 labels: Mapping[str, Any] | None = None, settings: MonitorSettings | None = None,
                 tokens_per_sample: int | None = None, val_loss_key: str | None = None,
                 checkpoint_dir: str | None = None, exit_on_rollback: bool = True,
                 total_steps: int | None = None, loss_kind: str | None = None) -> None:
        super().__init__(monitor, url=url, project=project, config=config, run_id=run_id,
                         token=token, labels=labels, settings=settings,
                         exit_on_rollback=exit_on_rollback, total_steps=total_steps,
                         loss_kind=loss_kind)
        self.checkpoint_dir = checkpoint_dir
        self.tokens_per_sample = tokens_per_sample
        self.val_loss_key = val_loss_key
        self._losses: list[Any] = []
        self._samples = 0
        self._last_step = 0
        self._reported: set[tuple[int, str]] = set()
        self._streams: list[DataStream] = []
        self._val_start: float | None = None  # perf_counter at on_validation_start
        self._save_starts: deque[float] = deque(maxlen=16)  # time.time() of recent saves
        # The job's checkpoints the checkpoint resumed from kept (``load_state_dict``);
        # None when it kept none (not saved under this callback).
        self._inherited: list[Any] | None = None

    def resume_checkpoint(self, trainer: Any, timeout: float = 30.0) -> str | None:
        """The checkpoint to pass to ``trainer.fit(..., ckpt_path=...)`` when the job's
        launcher ran it again for the monitor: a restart's resume point (asked of this
        rank's sidecar), else the rollback plan waiting in ``checkpoint_dir`` (default the
        root dir); None on a first launch or a relaunch after a crash (resume as the
        script would). Call it on every rank, once, before ``fit``::

            trainer.fit(module, data, ckpt_path=callback.resume_checkpoint(trainer))

        Under ``torchrun --max-restarts=N`` that is the whole relaunch (docs/actions.md,
        "Under HF Trainer and Lightning"). Lightning starts torch.distributed inside
        ``fit``, so the ranks do not agree here as ``Monitor.resume_plan`` makes them
        elsewhere: each rank asks its own node's sidecar, which adopted the restart before
        its ranks left for it."""
        return self._resume_checkpoint(self._directory(trainer), dict, timeout)

    def on_fit_start(self, trainer, pl_module):
        self._start(lambda: dict(pl_module.hparams), _planned_steps(trainer))

    def state_dict(self) -> dict[str, Any]:
        """What each Lightning checkpoint keeps of this callback: the job's checkpoints
        saved before it (``Monitor.job_checkpoints``), which a fit resumed from it inherits."""
        return {"checkpoints": self.monitor.job_checkpoints() if self.monitor else []}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._inherited = state_dict.get("checkpoints") or []

    def on_train_start(self, trainer, pl_module):
        """After the checkpoint restored the loop and the DataStream's position (module
        docstring): the checkpoint resumed from, the plan this process was relaunched for,
        and the data, counted as Lightning consumes it."""
        mon = self._mon()
        self._streams = _streams(trainer)
        for stream in self._streams:
            # Lightning fetches a batch ahead of a loader without a length (already, by
            # now): the batch being trained is the one consumed (on_train_batch_start).
            stream.report_consumption()
            mon._counting_data(stream.skips_by)
        # Watched once the data is known: the run record, which watch() sends, says how
        # the data leaves windows out. Lightning clips, and steps through a closure; the
        # rest is the monitor's WatchSettings.
        mon.watch(pl_module, trainer.optimizers[0], settings=dataclasses.replace(
            mon.settings.watch, grad_clip=trainer.gradient_clip_val or None, apply_clip=False,
            pre_hook=False))
        self._last_step = trainer.global_step
        plan = self._relaunch.take(self._directory(trainer), mon._plans, trainer.global_step)
        if self._inherited is not None and trainer.ckpt_path and trainer.global_step > 0:
            # A checkpoint that holds this callback's state was saved by this job.
            mon.resumed_from(trainer.global_step, trainer.ckpt_path, earlier=self._inherited)
        if plan is None:
            return
        ahead = any(s.fetched_ahead for s in self._streams)
        for stream in self._streams:
            if stream.position == 0 and plan.resume_position:  # a checkpoint without it
                stream.seek(plan.resume_position, plan.skip)
            else:
                stream.add_skip(plan.skip)
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        if fetcher is not None and ahead:
            # Lightning fetched ahead of a stream before the windows were known: fetch
            # again (the stream draws those positions anew, the windows left out).
            iter(fetcher)
        if self._streams:
            data = self._streams[0]
            say_resumed(plan, data.position, data.skip, data.skips_by)
        elif plan.skip:
            log.warning("monitor_client: the rollback's windows (%s) cannot be skipped: wrap "
                        "the train loader in monitor_client.DataStream", plan.skip)

    def _directory(self, trainer: Any) -> str:
        return self.checkpoint_dir or trainer.default_root_dir

    def _report_saves(self, trainer: Any) -> None:
        if not trainer.is_global_zero:
            return
        for callback in trainer.checkpoint_callbacks:
            path = (getattr(callback, "_last_checkpoint_saved", "")
                    or getattr(callback, "last_model_path", ""))
            step = getattr(callback, "_last_global_step_saved", None)
            if path and isinstance(step, int) and (step, path) not in self._reported:
                self._reported.add((step, path))
                self._mon().checkpoint_saved(step, path, tag="lightning",
                                             seconds=self._save_seconds(path))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._save_starts.append(time.time())  # the write of this dict comes next

    def _save_seconds(self, path: str) -> float | None:
        """From the newest save begun before ``path`` was written to its writing (its
        modification time); None when that cannot be told."""
        try:
            written = os.path.getmtime(path)
        except (OSError, TypeError, ValueError):
            return None
        began = max((t for t in self._save_starts if t <= written), default=None)
        if began is None or written > time.time():
            return None
        return written - began

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        for stream in self._streams:
            stream.took()  # this batch: its position goes with the step
        self._report_saves(trainer)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._mon().before_optimizer_step()
        self._relaunch.lr.apply(optimizer, trainer.global_step + 1)  # put back before the scheduler

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._losses.append(loss.detach())
        self._samples += _batch_size(batch)
        if trainer.global_step == self._last_step:
            return  # accumulating: the optimizer has not stepped yet
        lr = self._relaunch.lr.lr
        self._relaunch.lr.restore()
        self._last_step = trainer.global_step
        total = sum(self._losses[1:], self._losses[0]) if self._losses else None
        samples = self._samples or None
        tokens = samples * self.tokens_per_sample if samples and self.tokens_per_sample else None
        position = self._streams[0].position if self._streams else None
        self._mon().log_step(trainer.global_step, loss=total, samples=samples, tokens=tokens,
                             data_position=position, **({"lr": lr} if lr is not None else {}))
        self._losses, self._samples = [], 0
        self._relaunch.consume_once(trainer.is_global_zero)
        self._honour_actions(self._directory(trainer), trainer.is_global_zero,
                             stop=lambda: setattr(trainer, "should_stop", True),
                             save=lambda: self._save_now(trainer))

    def _save_now(self, trainer: Any) -> None:
        """An alert rule's checkpoint request: saved now, and reported from rank zero."""
        path = os.path.join(self._directory(trainer), f"monitor-step{trainer.global_step}.ckpt")
        began = time.perf_counter()
        trainer.save_checkpoint(path)
        if trainer.is_global_zero:
            self._mon().checkpoint_saved(trainer.global_step, path, tag="monitor",
                                         seconds=time.perf_counter() - began)

    def on_validation_start(self, trainer, pl_module):
        self._val_start = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module):
        began, self._val_start = self._val_start, None
        if trainer.sanity_checking:
            return
        metrics = dict(trainer.callback_metrics)
        key = self.val_loss_key or next(
            (k for k in ("val_loss", "val/loss", "validation_loss") if k in metrics), None)
        val = metrics.pop(key, None) if key else None
        extra = {k: v for k, v in metrics.items() if k.startswith("val")}
        self._mon().log_eval(trainer.global_step, val_loss=val, epoch=trainer.current_epoch,
                             metrics=extra, seconds=None if began is None
                             else time.perf_counter() - began)

    def on_exception(self, trainer, pl_module, exception):
        if isinstance(exception, RollbackExit):
            return  # our own exit, after the run ended "stopped" for the rollback
        if self.monitor is not None:  # Ctrl-C is the user's stop, not a crash
            self.monitor.close(*outcome_of(type(exception), exception))

    def on_fit_end(self, trainer, pl_module):
        self._report_saves(trainer)
        self._end()


def _streams(trainer: Any) -> list[DataStream]:
    """The DataStreams among the fit's train loaders."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    loaders = list(getattr(combined, "flattened", None) or [])
    if not loaders:
        found = getattr(trainer, "train_dataloader", None)
        loaders = list(found.values()) if isinstance(found, dict) else (
            list(found) if isinstance(found, list | tuple) else [found])
    return [loader for loader in loaders if isinstance(loader, DataStream)]


def _batch_size(batch: Any) -> int:
    if hasattr(batch, "shape") and len(batch.shape) >= 1:
        return int(batch.shape[0])
    if isinstance(batch, list | tuple) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    return 0


def _planned_steps(trainer: Any) -> int | None:
    """The optimizer steps this fit will take, when Lightning can tell (an unbounded or
    iterable-only loader makes it infinite, or raise)."""
    try:
        steps = float(trainer.estimated_stepping_batches)
    except Exception:  # noqa: BLE001 - an estimate, never worth failing the fit over
        return None
    return int(steps) if 0 < steps < float("inf") else None
