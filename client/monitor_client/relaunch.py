"""Relaunch a training command after a rollback: ``python -m monitor_client.relaunch``.

The HF ``Trainer`` and Lightning callbacks cannot rewind their framework's loop; on a
rollback plan they stop, leave the plan in ``<dir>/monitor_rollback.json`` with the
framework's resume argument, and the process exits with code 75 (``ROLLBACK_EXIT``). This
is the launcher side of that contract::

    python -m monitor_client.relaunch --dir out/ -- python train.py --max_steps 1000

runs the command; while it exits with 75 it reads the plan from ``<dir>``, moves the file
aside (``monitor_rollback.<id>.json``: consumed, so a later relaunch does not take it
again), and runs the command again with the resume argument the callback wrote
(``--resume_from_checkpoint=<checkpoint>`` for HF, ``--ckpt_path=<checkpoint>`` for
Lightning; ``--arg`` names another), replacing one given before, and with
``MONITOR_ROLLBACK_PLAN`` naming the consumed file, where the relaunched callback reads
the plan it was relaunched for (its data windows, its LR factor). A plan already waiting
in ``<dir>`` when it starts (the process exited before the launcher ran this helper) is
taken at once: the first launch is already the relaunch. The plan file is read only when it
is a regular file of at most 4 MiB (a symlink is not followed, a FIFO not waited on:
_plain_file.py); any other is refused, saying why. Every relaunch is said on stderr. It
stops after ``--max-relaunches`` (default 10; the sidecar's rollback budget
stops a run long before) and exits with the command's last exit code. Under ``torchrun
--max-restarts=N`` it is not needed: torchrun runs the group again on the exit 75, and the
script resumes from ``callback.resume_checkpoint(trainer)`` (docs/actions.md, "Under HF
Trainer and Lightning"; tests/e2e/test_framework_torchrun.py).

The script parses the argument as usual (``HfArgumentParser`` already knows
``--resume_from_checkpoint``; Lightning's CLI ``--ckpt_path``) and passes it on:
``trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)``.

    >>> with_resume(["python", "train.py", "--resume_from_checkpoint", "old", "--lr=1"],
    ...             "resume_from_checkpoint", "out/checkpoint-300")
    ['python', 'train.py', '--lr=1', '--resume_from_checkpoint=out/checkpoint-300']
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from monitor_client._resume import PLAN_ENV, ROLLBACK_EXIT
from monitor_client._rollback import RESUME_FILE, read_resume_file

__all__ = ["ROLLBACK_EXIT", "main", "with_resume"]

# The resume argument each framework's callback writes into the plan file, in the order
# they are looked for.
ARGUMENTS = ("resume_from_checkpoint", "ckpt_path")


def with_resume(command: list[str], name: str, value: str) -> list[str]:
    """``command`` with ``--name=value``, any earlier ``--name`` (and its value) dropped."""
    flag = f"--{name}"
    out: list[str] = []
    skip_next = False
    for word in command:
        if skip_next:
            skip_next = False
            continue
        if word == flag:
            skip_next = True
            continue
        if word.startswith(flag + "="):
            continue
        out.append(word)
    return [*out, f"{flag}={value}"]


def _say(text: str) -> None:
    print(f"monitor_client.relaunch: {text}", file=sys.stderr, flush=True)


def _refused(why: str) -> None:
    _say(f"plan file refused: {why}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m monitor_client.relaunch",
        description="Run a training command; relaunch it from its rollback plan's checkpoint "
                    f"while it exits with {ROLLBACK_EXIT}.")
    parser.add_argument("--dir", required=True,
                        help="where the callback leaves monitor_rollback.json (HF: output_dir; "
                             "Lightning: checkpoint_dir, default the root dir)")
    parser.add_argument("--arg", default=None,
                        help="the command's resume argument (default: the one the plan file "
                             "names: resume_from_checkpoint or ckpt_path)")
    parser.add_argument("--max-relaunches", type=int, default=10)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the training command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the training command after --")
    env = dict(os.environ)
    relaunches = 0
    directory = Path(args.dir)
    waiting = read_resume_file(directory, refused=_refused) is not None  # left by one that exited
    while True:
        code = ROLLBACK_EXIT if waiting else subprocess.call(command, env=env)
        waiting = False
        if code != ROLLBACK_EXIT:
            return code
        plan = read_resume_file(directory, refused=_refused)
        if plan is None:
            _say(f"the command exited with {ROLLBACK_EXIT} but {directory / RESUME_FILE} "
                 "holds no plan it can take: not relaunching")
            return code
        if relaunches >= args.max_relaunches:
            _say(f"{relaunches} relaunches already (--max-relaunches): not relaunching")
            return code
        name = args.arg or next((a for a in ARGUMENTS if plan.get(a)), None)
        value = plan.get(name) if name else None
        if name is None or not value:
            value = plan.get("checkpoint_path")
            name = name or ARGUMENTS[0]
        consumed = directory / f"monitor_rollback.{plan['id']}.json"
        os.replace(directory / RESUME_FILE, consumed)
        command = with_resume(command, name, str(value))
        env = {**env, PLAN_ENV: str(consumed)}
        relaunches += 1
        _say(f"rollback {plan.get('number', '?')}: {plan.get('message') or 'rolling back'}; "
             f"relaunching ({relaunches}) with --{name}={value}")


if __name__ == "__main__":
    sys.exit(main())
