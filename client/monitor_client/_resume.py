"""A rollback under a framework that owns its loop (HF ``Trainer``, Lightning): stop, say so,
exit with a code a launcher tests, and, relaunched from the plan's checkpoint, take the
rest of the plan (its data windows, its LR factor) and consume the plan file.

Neither framework can rewind its loop from a callback: only ``train(resume_from_checkpoint=)``
/ ``fit(ckpt_path=)`` restore model, optimizer, scheduler, RNG and loop position together.
So at the step every rank agreed on, the callback:

1. writes the plan, with the framework's resume argument, to ``monitor_rollback.json``
   (``write_resume_file``) and prints the rollback in the training log (``announce``);
2. stops training, ends the run ``stopped`` ("stopped to roll back: ..."), and then raises
   ``RollbackExit``: the process exits with ``ROLLBACK_EXIT`` (75, ``EX_TEMPFAIL``: "try
   again") instead of going on to whatever the script does after a finished training (a
   final save of weights that were rolled back);
3. relaunched (by its launcher: ``torchrun --max-restarts``, a requeue, with the script
   resuming from the callback's ``resume_checkpoint``; else by ``python -m
   monitor_client.relaunch``: ``relaunch.py``), finds the plan it was relaunched for
   (``relaunch_plan``: the file the helper passed in ``MONITOR_ROLLBACK_PLAN``, else
   ``monitor_rollback.json`` left in place), marks it applied, vouches for the checkpoint
   it resumed from and the job's earlier ones the file hands on (so a second and a third
   rollback act), resumes the data at the plan's position leaving its windows out, scales
   the LR for ``lr_steps`` steps (``LrScale``) and, when it read the file in place,
   consumes it (``consume``), so a later relaunch does not take it again.

A restart the run's leader decided (``_restart.py``) leaves with the same exit 75; the
relaunched callback's ``resume_checkpoint`` asks the sidecar for its plan
(``Monitor.resume_plan``) and ``Relaunch.resumed`` hands it to the framework's train start
as it would a plan file's.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

from monitor_client._rollback import RESUME_FILE, RollbackPlan, read_resume_file

__all__ = ["PLAN_ENV", "ROLLBACK_EXIT", "LrScale", "Relaunch", "RollbackExit", "announce",
           "consume", "relaunch_plan", "say_resumed", "skipping"]

log = logging.getLogger("monitor_client")

ROLLBACK_EXIT = 75
"""The exit code of a process that stopped to roll back (sysexits' EX_TEMPFAIL: try again):
a launcher relaunches on it, from the plan's checkpoint."""
PLAN_ENV = "MONITOR_ROLLBACK_PLAN"
"""Where ``python -m monitor_client.relaunch`` tells the relaunched process its plan is."""


class RollbackExit(SystemExit):
    """Raised by a framework callback once training stopped for a rollback: the process
    exits with ``ROLLBACK_EXIT`` unless the script catches it."""

    def __init__(self, plan: RollbackPlan) -> None:
        super().__init__(ROLLBACK_EXIT)
        self.plan = plan


def announce(plan: RollbackPlan, path: str, argument: str, launcher: str = "") -> None:
    """Say in the training log what happens now (stderr and the ``monitor_client`` log);
    ``launcher``: the one that runs this process again on its exit 75 (``_launcher.py``:
    torchrun with restarts left), else "" (``python -m monitor_client.relaunch`` does it)."""
    then = (f"{launcher} runs it again, and the callback's resume_checkpoint() resumes it from "
            f"{plan.checkpoint_path}" if launcher else
            f"Relaunch with {argument}={plan.checkpoint_path} (python -m "
            f"monitor_client.relaunch does it)")
    text = (f"monitor_client: rollback {plan.number}/{plan.budget} (rule {plan.rule or '?'}): "
            f"{plan.message or plan.checkpoint_path}. Training stops here; the plan is in "
            f"{path}. {then}; this process exits with code {ROLLBACK_EXIT}.")
    log.warning("%s", text)
    print(text, file=sys.stderr, flush=True)


def skipping(windows: Any, skips_by: str) -> str:
    """How a run's windows are left out, as the training log and pages say it.

    >>> skipping([(101, 121), (130, 130)], "reading")
    'batches 101-121, 130 skipped by reading past them (streamed data)'
    >>> skipping([(101, 121)], "sampler")
    'batches 101-121 left out in the sampler (never loaded)'
    """
    said = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in windows)
    if skips_by == "reading":
        return f"batches {said} skipped by reading past them (streamed data)"
    return f"batches {said} left out in the sampler (never loaded)"


def say_resumed(plan: RollbackPlan, position: int, windows: Any, skips_by: str) -> None:
    """Say in the training log how the relaunched run resumed its data for ``plan``."""
    ahead = [(a, b) for a, b in windows if b > position]
    # A restart's resume point opens no window of its own (``_restart.resume_plan_of``).
    what = (f"restart {plan.id}" if plan.skip_from > plan.skip_to else
            f"rollback {plan.number}/{plan.budget}")
    text = (f"monitor_client: {what}: resumed from checkpoint "
            f"step {plan.checkpoint_step} ({plan.checkpoint_path}); the data resumes after "
            f"position {position}" + (f", {skipping(ahead, skips_by)}" if ahead else ""))
    log.warning("%s", text)
    print(text, file=sys.stderr, flush=True)


def relaunch_plan(directory: str | os.PathLike[str]
                  ) -> tuple[RollbackPlan, Path, dict[str, Any]] | None:
    """The plan this process was relaunched for, the file it came from and what that file
    holds: the one named in ``MONITOR_ROLLBACK_PLAN``, else
    ``<directory>/monitor_rollback.json``; None when neither holds a plan."""
    named = os.environ.get(PLAN_ENV)
    for path in ([Path(named)] if named else []) + [Path(directory) / RESUME_FILE]:
        found = read_resume_file(path.parent, path.name, refused=lambda why: log.warning(
            "monitor_client: rollback plan file refused: %s", why))
        plan = RollbackPlan.from_dict(found) if found is not None else None
        if plan is not None and found is not None:
            return plan, path, found
    return None


def consume(path: Path, plan: RollbackPlan) -> Path | None:
    """Move an unconsumed plan file aside (``monitor_rollback.<id>.applied.json``) once this
    process applied it; the new path, or None when it was not the in-place file."""
    if path.name != RESUME_FILE or not path.exists():
        return None
    done = path.with_name(f"monitor_rollback.{plan.id}.applied.json")
    try:
        os.replace(path, done)
    except OSError as exc:
        log.warning("monitor_client: could not consume %s: %r", path, exc)
        return None
    return done


class LrScale:
    """The plan's LR factor on an optimizer the framework's scheduler drives: each group's
    LR is multiplied just before the optimizer step and put back right after it, so the
    scheduler's own state and schedule are untouched and the factor ends on its own."""

    def __init__(self, plan: RollbackPlan | None) -> None:
        self.plan = plan
        self._saved: list[tuple[dict[str, Any], Any]] = []
        self.lr: float | None = None  # the first group's LR of the last scaled step

    def apply(self, optimizer: Any, step: int) -> None:
        """Before optimizer step ``step``."""
        self.restore()
        factor = self.plan.lr_multiplier(step) if self.plan is not None else 1.0
        self.lr = None
        if factor == 1.0 or optimizer is None or not _factor(factor):
            return
        for group in getattr(optimizer, "param_groups", []):
            self._saved.append((group, group["lr"]))
            group["lr"] = group["lr"] * factor
        if self._saved:
            self.lr = float(self._saved[0][0]["lr"])

    def restore(self) -> None:
        for group, lr in self._saved:
            group["lr"] = lr
        self._saved = []


class Relaunch:
    """A framework callback's side of step 3 (module docstring): the plan this process was
    relaunched for, its LR factor, and the file to consume once training is under way."""

    def __init__(self) -> None:
        self.plan: RollbackPlan | None = None
        self.restart: RollbackPlan | None = None  # a restart's resume point (``resumed``)
        self.lr = LrScale(None)
        self._file: Path | None = None

    def resumed(self, plan: RollbackPlan) -> None:
        """Before training: this process resumes from a restart's plan (``resume_plan``, which
        marked it applied), so ``take`` hands it out rather than a plan file."""
        self.restart = plan

    def take(self, directory: str | os.PathLike[str], plans: Any, step: int
             ) -> RollbackPlan | None:
        """At train start, ``step`` the loop's resumed step: the plan, when this process
        resumed from its checkpoint. Any plan found is marked applied in ``plans`` (the
        Monitor's ``PlanBook``): it is done, not an order again; one for another checkpoint
        is a file left from an earlier relaunch. The plan's checkpoint, which this process
        resumed from, and the job's checkpoints the file hands on (``checkpoints``: what
        the process that wrote it vouched for) are this job's: a later plan may send this
        process back to any of them."""
        if self.restart is not None:  # a restart's plan, taken before training began
            if self.restart.checkpoint_step != step:
                return None
            self.plan = self.restart
            return self.plan
        found = relaunch_plan(directory)
        if found is None:
            return None
        plan, path, raw = found
        plans.applied(plan.id)
        if plan.checkpoint_step != step:
            return None
        plans.vouch(plan.checkpoint_step, plan.checkpoint_path)
        plans.inherit(raw.get("checkpoints"))
        self.plan, self._file, self.lr = plan, path, LrScale(plan)
        return plan

    def consume_once(self, zero: bool) -> None:
        """After the first step: every rank read the file at train start (the step's
        collectives came after), so the global rank zero (``zero``) consumes it."""
        if self._file is not None and self.plan is not None:
            if zero:
                consume(self._file, self.plan)
            self._file = None


def _factor(value: object) -> bool:
    """A factor an LR may be scaled by: a finite number in (0, 1] (a plan that says
    otherwise was not made by a sidecar: ``RollbackPlan.problem``; it scales nothing)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and 0 < value <= 1)
