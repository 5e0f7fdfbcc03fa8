"""Who is running: rank and world size, the run id every rank shares, labels, hardware.

Rank and world size come from ``torch.distributed`` when it is initialised, else from the
launchers' environment variables (torchrun, SLURM, Open MPI, Intel MPI). Every rank of a
run must send the same run id: it is taken from ``run_id=``, ``MONITOR_AGENT_RUN_ID``,
``TORCHELASTIC_RUN_ID`` or ``SLURM_JOB_ID``, else rank 0 generates one and, when
torch.distributed is initialised, broadcasts it (a collective: create the Monitor on every
rank at the same point), else it is generated locally.

A run id given is made acceptable to the sidecar (no ``/``: it is a URL segment); without
one, and without the variables above, rank 0 generates one::

    >>> resolve_run_id("gpt-7/eu", "gpt", RankInfo())
    'gpt-7-eu'
    >>> re.fullmatch(r"gpt-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}", new_run_id("gpt")) is not None
    True
    >>> sanitize_label_name("team-name"), sanitize_label_name("1st")   # label names
    ('team_name', '_1st')
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

_RUN_ID_BAD = re.compile(r"[^A-Za-z0-9._:@+=-]")  # no "/": the sidecar refuses it (a URL segment)
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]")
_ENV_PAIRS = [("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")]


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job; ``detect_rank()`` reads it, here from what torchrun
    sets::

        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}):
        ...     detect_rank()
        RankInfo(rank=3, world_size=8, local_rank=3)
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0


def _dist():
    # Only look at torch.distributed if the script already imported torch.
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def detect_rank() -> RankInfo:
    """Rank, world size and local rank from torch.distributed or the environment."""
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")) or 0)
    dist = _dist()
    if dist is not None:
        return RankInfo(dist.get_rank(), dist.get_world_size(), local)
    for rank_var, size_var in _ENV_PAIRS:
        if rank_var in os.environ and size_var in os.environ:
            return RankInfo(int(os.environ[rank_var]), int(os.environ[size_var]), local)
    return RankInfo()


def sanitize_run_id(value: str) -> str:
    """Make a string acceptable as a run id (the sidecar's pattern, at most 200 chars)."""
    return (_RUN_ID_BAD.sub("-", value) or "run")[:200]


def new_run_id(project: str | None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return sanitize_run_id(f"{project or 'run'}-{stamp}-{secrets.token_hex(3)}")


def resolve_run_id(run_id: str | None, project: str | None, info: RankInfo) -> str:
    """The run id all ranks share (see the module docstring for the order of sources)."""
    for candidate in (run_id, os.environ.get("MONITOR_AGENT_RUN_ID"),
                      os.environ.get("TORCHELASTIC_RUN_ID"), os.environ.get("SLURM_JOB_ID")):
        if candidate and candidate != "none":
            return sanitize_run_id(candidate)
    generated = new_run_id(project)
    dist = _dist()
    if dist is not None and info.world_size > 1:
        box = [generated]
        dist.broadcast_object_list(box, src=0)
        generated = box[0]
    return generated


def sanitize_label_name(name: str) -> str:
    name = _LABEL_BAD.sub("_", str(name))[:64] or "_"
    return name if not name[0].isdigit() else "_" + name[:63]


def build_labels(project: str | None, user: dict[str, Any] | None) -> dict[str, str]:
    """project, hostname, pod and node (when Kubernetes tells them), then user labels."""
    labels = {"hostname": socket.gethostname()}
    for name, env in (("pod", "POD_NAME"), ("node", "NODE_NAME"), ("namespace", "POD_NAMESPACE")):
        if os.environ.get(env):
            labels[name] = os.environ[env]
    if project:
        labels["project"] = project
    for key, value in (user or {}).items():
        labels[sanitize_label_name(key)] = str(value)
    return {k: v[:256] for k, v in list(labels.items())[:32]}


def describe_hardware(device: Any, info: RankInfo, peak_flops: float | None) -> dict[str, Any]:
    """docs/format.md's ``hardware`` object for the device the model lives on."""
    name, kind = _cpu_name(), "cpu"
    if str(device).startswith("cuda"):
        import torch

        kind, name = "cuda", torch.cuda.get_device_name(device)
    hardware = {"device": kind, "device_name": name, "world_size": info.world_size,
                "peak_flops": peak_flops}
    if "torch" in sys.modules:
        import torch

        hardware.update(torch_version=torch.__version__, num_threads=torch.get_num_threads())
    return hardware


_NODE_RANK_VARS = ("MONITOR_AGENT_NODE_RANK", "GROUP_RANK", "NODE_RANK", "PET_NODE_RANK",
                   "SLURM_NODEID")
_NODES_VARS = ("MONITOR_AGENT_NODES", "GROUP_WORLD_SIZE", "NNODES", "PET_NNODES",
               "SLURM_NNODES", "SLURM_JOB_NUM_NODES")


def detect_placement(info: RankInfo, sidecar_url: str) -> dict[str, Any] | None:
    """Where this rank's node sits in a multi-node job, for the run record's ``cluster``
    (docs/format.md): node rank and node count from the launcher, and the leader, the
    sidecar of node 0: ``MONITOR_AGENT_LEADER_URL``, else ``http://$MASTER_ADDR`` at the port
    of this rank's own sidecar (every node runs one, on the same port). None when the job
    is not multi-node or says too little to tell.

        >>> from unittest import mock
        >>> env = {"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "8",
        ...        "MASTER_ADDR": "gpu-node-0"}
        >>> with mock.patch.dict(os.environ, env, clear=True):
        ...     detect_placement(RankInfo(9, 16, 1), "http://127.0.0.1:9400")
        {'node_rank': 1, 'nodes': 2, 'local_world_size': 8, 'leader_url': 'http://gpu-node-0:9400'}
        >>> with mock.patch.dict(os.environ, {}, clear=True):
        ...     detect_placement(RankInfo(0, 1, 0), "http://127.0.0.1:9400") is None
        True
    """
    local = _env_int("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE")
    node, nodes = _env_int(*_NODE_RANK_VARS), _env_int(*_NODES_VARS)
    if node is None and local:  # torchrun without its group variables: ranks fill nodes
        node = info.rank // local
    if nodes is None and local and info.world_size >= local:
        nodes = -(-info.world_size // local)
    if node is None or nodes is None or nodes <= 1 or not 0 <= node < nodes:
        return None
    leader = os.environ.get("MONITOR_AGENT_LEADER_URL") or _leader_url(sidecar_url)
    return {"node_rank": node, "nodes": nodes, "local_world_size": local,
            "leader_url": leader}


def _leader_url(sidecar_url: str) -> str | None:
    from urllib.parse import urlsplit

    master = os.environ.get("MASTER_ADDR")
    if not master:
        return None
    parts = urlsplit(sidecar_url)
    host = f"[{master}]" if ":" in master and not master.startswith("[") else master
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme or 'http'}://{host}{port}"


def _env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"
