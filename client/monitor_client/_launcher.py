"""What starts this process, and whether it runs it again when the process exits with 75.

The run record declares it (docs/format.md, ``launcher``), so the run's leader restarts a
job only through a launcher that will bring it back (sidecar: alerting/restart.py), and the
client exits on a restart only then (``_restart.py``):

- **torchrun** (``TORCHELASTIC_RUN_ID`` set): its elastic agent restarts the worker group
  on any non-zero exit while restarts remain (``TORCHELASTIC_MAX_RESTARTS`` minus
  ``TORCHELASTIC_RESTART_COUNT``). The job's node range (``--nnodes=MIN:MAX``) is read from
  ``MONITOR_AGENT_NODES_RANGE``, Kubeflow's ``PET_NNODES``, else the agent's own command line
  (this process's parent).
- **slurm** (``SLURM_JOB_ID``) and **kubernetes** (``KUBERNETES_SERVICE_HOST``): whether the
  batch script requeues on 75, or the pod's restart policy restarts it, is the job's to say:
  ``MONITOR_AGENT_RESTARTS=1`` (deploy/slurm and deploy/kubernetes set it).
- anything else: ``none``, unless ``MONITOR_AGENT_RESTARTS=1`` says a wrapper of the user's
  own runs the command again on 75.

``MONITOR_AGENT_RESTARTS=0`` turns the restart exit off whatever the launcher.

    >>> env = {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "1",
    ...        "TORCHELASTIC_MAX_RESTARTS": "3", "PET_NNODES": "2:4"}
    >>> detect(env, parent_args=[])
    {'name': 'torchrun', 'restarts': True, 'restart_count': 1, 'max_restarts': 3, 'min_nodes': 2, 'max_nodes': 4}
    >>> detect({**env, "TORCHELASTIC_RESTART_COUNT": "3"}, parent_args=[])["restarts"]
    False
    >>> detect({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2"}, parent_args=[])
    {'name': 'slurm', 'restarts': False, 'restart_count': 2, 'max_restarts': None, 'min_nodes': None, 'max_nodes': None}
    >>> found = detect({"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_MAX_RESTARTS": "2"},
    ...                parent_args=["python", "-m", "torch.distributed.run", "--nnodes", "1:3"])
    >>> found["min_nodes"], found["max_nodes"], found["restarts"]
    (1, 3, True)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["RESTARTS_ENV", "detect", "parent_args"]

RESTARTS_ENV = "MONITOR_AGENT_RESTARTS"
RANGE_ENV = "MONITOR_AGENT_NODES_RANGE"


def detect(env: Mapping[str, str] | None = None,
           parent_args: Sequence[str] | None = None) -> dict[str, Any]:
    """The run record's ``launcher`` object for this process (module docstring)."""
    env = os.environ if env is None else env
    said = env.get(RESTARTS_ENV, "").strip().lower()
    declared = {"1": True, "true": True, "yes": True, "0": False, "false": False,
                "no": False}.get(said)
    out: dict[str, Any] = {"name": "none", "restarts": False, "restart_count": None,
                           "max_restarts": None, "min_nodes": None, "max_nodes": None}
    if env.get("TORCHELASTIC_RUN_ID"):
        count = _int(env.get("TORCHELASTIC_RESTART_COUNT"))
        most = _int(env.get("TORCHELASTIC_MAX_RESTARTS"))
        low, high = _range(env.get(RANGE_ENV) or env.get("PET_NNODES") or _nnodes(
            parent_args if parent_args is not None else _parent()))
        out.update(name="torchrun", restart_count=count, max_restarts=most,
                   restarts=most is not None and (count or 0) < most,
                   min_nodes=low, max_nodes=high)
    elif env.get("SLURM_JOB_ID"):
        out.update(name="slurm", restart_count=_int(env.get("SLURM_RESTART_COUNT")))
    elif env.get("KUBERNETES_SERVICE_HOST"):
        out.update(name="kubernetes")
    if out["name"] != "torchrun":
        low, high = _range(env.get(RANGE_ENV))
        out.update(min_nodes=low, max_nodes=high)
    if declared is not None:
        out["restarts"] = declared and (out["name"] != "torchrun" or out["restarts"])
    return out


def parent_args() -> list[str]:
    """This process's parent's command line (Linux), or [] when it cannot be read."""
    return _parent()


def _parent() -> list[str]:
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as src:
            raw = src.read(64 * 1024)
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _nnodes(args: Sequence[str]) -> str | None:
    """``--nnodes`` of a torchrun command line (``--nnodes=1:3`` or ``--nnodes 1:3``)."""
    for i, word in enumerate(args):
        if word.startswith("--nnodes="):
            return word.split("=", 1)[1]
        if word == "--nnodes" and i + 1 < len(args):
            return args[i + 1]
    return None


def _range(value: str | None) -> tuple[int | None, int | None]:
    """"2:4" -> (2, 4); "3" -> (3, 3); else (None, None)."""
    if not value:
        return None, None
    parts = value.strip().split(":")
    numbers = [_int(p) for p in parts]
    if len(parts) > 2 or any(n is None or n < 1 for n in numbers):
        return None, None
    low, high = numbers[0], numbers[-1]
    return (low, high) if low is not None and high is not None and low <= high else (None, None)


def _int(value: str | None) -> int | None:
    value = (value or "").strip()
    return int(value) if value.isdigit() and len(value) < 10 else None
