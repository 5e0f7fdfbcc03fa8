"""Faults, each injected for real on one node of a cluster (``cluster.faults``):

============================  ========================================================
``kill_rank(node, lr)``       SIGKILL of one rank (a process gone: OOM kill, crash)
``stop_rank(node, lr)``       SIGSTOP of one rank (a hang); ``cont_rank`` undoes it
``xid(node, code, gpu)``      an XID event on one GPU of the node (fake NVML)
``ecc(node, count, gpu)``     uncorrectable ECC errors on one GPU (fake NVML)
``throttle(node, f, job)``    the node's CPU quota cut so its work runs ``f`` x slower
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.netcluster import network
from tests.netcluster.fault_files import GPU, TRAIN, FaultFiles
from tests.netcluster.throttle import Controller, Throttle, measure_usage

if TYPE_CHECKING:
    from tests.netcluster.cluster import Cluster
    from tests.netcluster.elastic import ElasticJob


class Faults:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._files: dict[int, FaultFiles] = {}
        self._controllers: dict[int, Controller] = {}

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
            env = environ(pid)
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
    def throttle(self, node: int, factor: float, job: ElasticJob | None = None,
                 window: float = 3.0, used_cores: float | None = None) -> Throttle:
        """Cut ``node``'s CPU quota so its work runs ``factor`` times slower: to the CPU
        its processes used over ``window`` seconds (or ``used_cores``) over ``factor``,
        then, with ``job``, held at ``factor`` against the job's other ranks by a
        controller (netcluster/throttle.py says why a machine shared with other load needs
        one). ``throttle.achieved`` is the slowdown last measured."""
        if factor < 1:
            raise ValueError(f"a slowdown factor is >= 1, got {factor}")
        self.unthrottle(node)
        group = self.cluster.workers[node].cgroup
        if used_cores is None:
            used_cores = measure_usage(group, window)
        if used_cores <= 0:
            raise RuntimeError(f"node{node} used no CPU over {window} s: nothing to slow down")
        group.set_quota(used_cores / factor)
        quota, period = group.quota()
        held = Throttle(node, factor, used_cores, quota / period)
        if job is not None:
            self._controllers[node] = Controller(held, group, job)
            self._controllers[node].start()
        return held

    def unthrottle(self, node: int) -> None:
        controller = self._controllers.pop(node, None)
        if controller is not None:
            controller.stop()
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

    def stop_controllers(self) -> None:
        for controller in self._controllers.values():
            controller.stop()
        self._controllers.clear()

    def reset(self) -> None:
        """Every fault taken back: quotas lifted, links uncapped, files cleared, stopped
        ranks continued."""
        self.stop_controllers()
        for i in range(len(self.cluster.workers)):
            self.unthrottle(i)
            self.uncap_link(i)
            self.files(i).clear()
            for pid in self.rank_pids(i).values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
