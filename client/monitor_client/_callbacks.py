"""``FrameworkCallback``: what the HF ``Trainer`` and Lightning callbacks share (``hf.py``,
``lightning.py``), each framework's file keeping only its adapter.

Shared: the arguments (those of ``Monitor(...)``, checked when the callback is made), the
Monitor made when training starts (the framework's own hyperparameters unless ``config=``
names them), the alert rules' actions honoured after each optimizer step, and the end of
the run: a rollback plan stops training and is left for the launcher (``_resume.py``: the
plan file with the framework's resume argument, the rollback printed in the training log,
the run ended ``stopped``, ``RollbackExit``), else the run ends as training did; and, on a
relaunch by the job's launcher (torchrun ``--max-restarts``), the checkpoint to resume from
(``resume_checkpoint``: a restart's or a rollback's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from monitor_client._arguments import hyperparameters, monitor_settings
from monitor_client._launcher import detect
from monitor_client._monitor import Monitor
from monitor_client._resume import Relaunch, RollbackExit, announce, relaunch_plan
from monitor_client._rollback import RollbackPlan, write_resume_file
from monitor_client.settings import MonitorSettings

__all__ = ["FrameworkCallback", "plain_values"]


class FrameworkCallback:
    """The framework-neutral half of a ``MonitorCallback``; ``resume_argument`` is the
    framework's argument that resumes from a checkpoint (in the plan file and the log)."""

    resume_argument = ""

    def __init__(self, monitor: Monitor | None, *, url: str | None, project: str | None,
                 config: Mapping[str, Any] | None, run_id: str | None, token: str | None,
                 labels: Mapping[str, Any] | None, settings: MonitorSettings | None,
                 exit_on_rollback: bool, total_steps: int | None = None,
                 loss_kind: str | None = None) -> None:
        self.monitor = monitor
        self.settings = monitor_settings("MonitorCallback", settings, dict(
            url=url, project=project, run_id=run_id, token=token, labels=labels,
            total_steps=total_steps, loss_kind=loss_kind))
        self.config = None if config is None else hyperparameters("MonitorCallback", config)
        self.exit_on_rollback = exit_on_rollback
        self.rollback: RollbackPlan | None = None  # the plan this process stopped for
        self._relaunch = Relaunch()  # the plan this process was relaunched for (_resume.py)
        self._config_later = False  # the Monitor made before the framework's config

    @property
    def relaunched(self) -> RollbackPlan | None:
        """The plan this process was relaunched for, or None."""
        return self._relaunch.plan

    def _mon(self) -> Monitor:
        """The run's Monitor (made when training starts when none was given)."""
        if self.monitor is None:
            raise RuntimeError("MonitorCallback: training has not started")
        return self.monitor

    def _start(self, framework_config: Callable[[], Mapping[str, Any]],
               total_steps: int | None) -> Monitor:
        """The run's Monitor, made now unless one was given: its hyperparameters are
        ``config=``, else the framework's (``framework_config()``, its plain values)."""
        if self.monitor is None:
            config = self.config if self.config is not None else plain_values(
                framework_config())
            self.monitor = Monitor(config=config, settings=self.settings)
        elif self._config_later:  # made before training (Lightning's ``resume_checkpoint``)
            for key, value in plain_values(framework_config()).items():
                self.monitor.config.setdefault(key, value)
            self._config_later = False
        if total_steps is not None:  # the plan, for progress and the ETA
            self.monitor.config.setdefault("total_steps", int(total_steps))
        return self.monitor

    def _resume_checkpoint(self, directory: str, framework_config: Callable[[], Mapping[str, Any]],
                           timeout: float) -> str | None:
        """The checkpoint a job relaunched by its own launcher (torchrun ``--max-restarts``, a
        requeue) resumes from: a restart's (``Monitor.resume_plan``, asked on every rank: a
        collective once torch.distributed is up), else a rollback plan's left in
        ``directory``, whichever the run decided last; None when neither relaunched it."""
        made = self.monitor is None
        mon = self._start(framework_config, None)
        self._config_later = made and self.config is None
        restart = mon.resume_plan(directory, timeout=timeout)
        found = relaunch_plan(directory)
        if restart is not None and (found is None or restart.id > found[0].id):
            self._relaunch.resumed(restart)
            return restart.checkpoint_path
        if found is None:
            return None
        plan, _, raw = found
        value = raw.get(self.resume_argument)
        return value if isinstance(value, str) and value else plan.checkpoint_path

    def _honour_actions(self, directory: str, rank_zero: bool, stop: Callable[[], Any],
                        save: Callable[[], Any]) -> None:
        """After an optimizer step: ``stop()`` for a stop, ``save()`` for a checkpoint
        request, and for a rollback plan (agreed by every rank) the plan file written in
        ``directory`` by rank zero, the rollback announced, and ``stop()``."""
        mon = self._mon()
        if mon.should_stop():
            stop()
        if mon.should_checkpoint():
            save()
        plan = mon.rollback_plan()
        if plan is not None and self.rollback is None:
            self.rollback = plan
            if rank_zero:  # with the job's checkpoints, which the relaunch inherits
                path = write_resume_file(directory, plan, checkpoints=mon.job_checkpoints(),
                                         **{self.resume_argument: plan.checkpoint_path})
                found = detect()  # its launcher runs it again: torchrun, not our helper
                name = found["name"] if found["name"] != "none" else "its launcher"
                announce(plan, path, f"--{self.resume_argument}",
                         name if found["restarts"] else "")
            stop()

    def _end(self) -> None:
        """Training is over: end the run, ``stopped`` to roll back (then ``RollbackExit``
        unless ``exit_on_rollback=False``), else as it ended."""
        self._relaunch.lr.restore()
        if self.rollback is None:
            self._mon().close()
            return
        self._mon().close(status="stopped", error=f"stopped to roll back: "
                          f"{self.rollback.message or self.rollback.checkpoint_path}")
        if self.exit_on_rollback:
            raise RollbackExit(self.rollback)


def plain_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a framework's hyperparameters that are plain JSON values.

        >>> plain_values({"lr": 1e-3, "name": "gpt", "scheduler": object(), "seed": None})
        {'lr': 0.001, 'name': 'gpt', 'seed': None}
    """
    return {k: v for k, v in config.items() if v is None or isinstance(v, str | int | float | bool)}
