"""Faults, each injected for real on one node of a cluster (``cluster.faults``):

============================  ========================================================
``kill_rank(node, lr)``       SIGKILL of one rank (a process gone: OOM kill, crash)
``stop_rank(node, lr)``       SIGSTOP of one rank (a hang); ``cont_rank`` undoes it
``xid(node, code, gpu)``      an XID event on one GPU of the node (fake NVML)
``ecc(node, count, gpu)``     uncorrectable ECC errors on one GPU (fake NVML)
``throttle(node, factor)``    the node's CPU quota cut so its work runs ``factor`` x slower
``cap_link(node, rate)``      the node's link capped by ``tc tbf``, both directions
``slow_loader(node, s)``      every batch of the node's ranks ``s`` seconds later
``bitflip(node, step, bit)``  one bit of a gradient flipped on the node's ranks at a step
``nan(node, step)``           the node's ranks' loss NaN at a step
============================  ========================================================

Signals, cgroups and tc act at once; the rest are files the node's processes read
(netcluster/fault_files.py). ``reset()`` takes every fault back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netcluster import network
from netcluster.fault_files import GPU, TRAIN, FaultFiles

if TYPE_CHECKING:
    from netcluster.cluster import Cluster


@dataclass(frozen=True)
class Throttle:
    """What ``throttle`` did: the node used ``used_cores`` CPUs over the window before;
    its quota is now ``quota_cores`` (``used_cores / factor``)."""

    node: int
    factor: float
    used_cores: float
    quota_cores: float
    quota_us: int
    period_us: int


class Faults:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._files: dict[int, FaultFiles] = {}

    def files(self, node: int) -> FaultFiles:
        if node not in self._files:
            self._files[node] = FaultFiles(self.cluster.faults_dir(node))
        return self._files[node]

    # -- processes ---------------------------------------------------------------------------
    def rank_pids(self, node: int) -> dict[int, int]:
        """{local rank: pid} of the training workers running on ``node`` now (read from
        their environment: what torchrun set them)."""
        found: dict[int, int] = {}
        for pid in self.cluster.workers[node].pids():
            env = _environ(pid)
            if "LOCAL_RANK" in env and "TORCHELASTIC_RUN_ID" in env:
                found[int(env["LOCAL_RANK"])] = pid
        return found

    def _signal(self, node: int, local_rank: int, sig: signal.Signals) -> int:
        pids = self.rank_pids(node)
        if local_rank not in pids:
            raise LookupError(f"node{node} runs no local rank {local_rank} now ({pids})")
        os.kill(pids[local_rank], sig)
        return pids[local_rank]

    def kill_rank(self, node: int, local_rank: int = 0) -> int:
        """SIGKILL one rank; returns its pid."""
        return self._signal(node, local_rank, signal.SIGKILL)

    def stop_rank(self, node: int, local_rank: int = 0) -> int:
        """SIGSTOP one rank: it holds its sockets and answers nothing (a hang)."""
        return self._signal(node, local_rank, signal.SIGSTOP)

    def cont_rank(self, node: int, local_rank: int = 0) -> int:
        return self._signal(node, local_rank, signal.SIGCONT)

    # -- the node's GPUs (fake NVML) ---------------------------------------------------------
    def xid(self, node: int, code: int = 79, gpu: int = 0) -> None:
        """XID ``code`` raised now on GPU ``gpu`` (= local rank) of ``node``; 79: the GPU
        fell off the bus, 48: a double-bit ECC error, 94/95: contained/uncontained ECC."""
        event = {"gpu": gpu, "code": code, "time": time.time()}
        self.files(node).update(GPU, lambda d: d.setdefault("xid", []).append(event))

    def ecc(self, node: int, count: int = 1, gpu: int = 0) -> None:
        """GPU ``gpu`` of ``node`` now counts ``count`` uncorrectable ECC errors (volatile)."""
        self.files(node).update(GPU, lambda d: d.setdefault("ecc_uncorrected", {}).__setitem__(
            str(gpu), count))

    # -- CPU ---------------------------------------------------------------------------------
    def throttle(self, node: int, factor: float, window: float = 3.0,
                 used_cores: float | None = None) -> Throttle:
        """Cut ``node``'s CPU so its work runs ``factor`` times slower: the quota becomes
        the CPU the node's processes used over the last ``window`` seconds (measured now,
        unless ``used_cores`` says), divided by ``factor``. Bound by that quota, work that
        needed the CPU it had takes ``factor`` times as long; ``bench/netcluster_check.py``
        measures what a job's steps show."""
        if factor < 1:
            raise ValueError(f"a slowdown factor is >= 1, got {factor}")
        group = self.cluster.workers[node].cgroup
        if used_cores is None:
            group.set_quota(None)
            before, t0 = group.usage_seconds(), time.monotonic()
            time.sleep(window)
            used_cores = (group.usage_seconds() - before) / (time.monotonic() - t0)
        if used_cores <= 0:
            raise RuntimeError(f"node{node} used no CPU over {window} s: nothing to slow down")
        quota = group.set_quota(used_cores / factor)
        q, period = group.quota()
        return Throttle(node, factor, used_cores, quota / period, q, period)

    def unthrottle(self, node: int) -> None:
        self.cluster.workers[node].cgroup.set_quota(None)

    # -- network -----------------------------------------------------------------------------
    def cap_link(self, node: int, rate: str = "10mbit", burst: str = "32kb",
                 latency: str = "100ms") -> None:
        """``tc qdisc ... tbf rate <rate>`` on both ends of ``node``'s link."""
        n = self.cluster.workers[node]
        network.cap(n.veth, n.netns, rate, burst, latency)

    def uncap_link(self, node: int) -> None:
        n = self.cluster.workers[node]
        network.uncap(n.veth, n.netns)

    def link_qdiscs(self, node: int) -> tuple[str, str]:
        n = self.cluster.workers[node]
        return network.qdiscs(n.veth, n.netns)

    # -- what the node's ranks do to themselves ---------------------------------------------
    def slow_loader(self, node: int, seconds: float) -> None:
        """Every batch the node's ranks load comes ``seconds`` later (0: as before)."""
        self.files(node).update(TRAIN, lambda d: d.__setitem__("loader_delay", seconds))

    def nan(self, node: int, step: int, local_rank: int | None = None,
            persist: bool = False) -> str:
        """The loss of ``node``'s ranks (or one) is NaN at ``step``; returns the id."""
        return self._at_step("nan", node, step, local_rank, persist, {})

    def bitflip(self, node: int, step: int, bit: int = 25, local_rank: int | None = None,
                persist: bool = False) -> str:
        """Bit ``bit`` of one gradient element flipped on ``node``'s ranks at ``step``,
        after the all-reduce (a silent error of the node: its replica drifts)."""
        return self._at_step("bitflip", node, step, local_rank, persist, {"bit": bit})

    def _at_step(self, kind: str, node: int, step: int, local_rank: int | None,
                 persist: bool, extra: dict[str, Any]) -> str:
        files = self.files(node)
        ident = files.next_id(kind)
        item = {"id": ident, "step": step, "local_rank": local_rank, "persist": persist, **extra}
        files.update(TRAIN, lambda d: d.setdefault(kind, []).append(item))
        return ident

    def fired(self, node: int) -> list[dict[str, Any]]:
        """The step faults ``node``'s ranks carried out (id, kind, step, rank, attempt)."""
        return self.files(node).fired()

    def reset(self) -> None:
        """Every fault taken back: quotas lifted, links uncapped, files cleared, stopped
        ranks continued."""
        for i in range(len(self.cluster.workers)):
            self.unthrottle(i)
            self.uncap_link(i)
            self.files(i).clear()
            for pid in self.rank_pids(i).values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
