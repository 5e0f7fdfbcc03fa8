"""A torchrun elastic job across the cluster's nodes: one agent per node, c10d rendezvous
hosted by node 0's agent, ``--nnodes=MIN:MAX``, ``--max-restarts``, gloo over each node's
``eth0``; the script is netcluster/elastic_train.py unless another is given.

Its per-rank logs (``ranks/node<N>.local<L>.jsonl``) and final digests (``final/``) are
read back by ``events()``, ``finals()``, ``attempts()``; ``wait()`` waits for every
agent's exit status.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.eventually import eventually, scaled
from tests.netcluster.faults import environ

if TYPE_CHECKING:
    from tests.netcluster.cluster import Cluster
    from tests.netcluster.node import Node

TRAIN = Path(__file__).with_name("elastic_train.py")
RDZV_PORT = 29400
STORE = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=600))
print("store up", flush=True)
while True:
    time.sleep(60)
"""


class ElasticJob:
    """``torchrun`` on ``nodes`` (default: every compute node) of ``cluster``."""

    def __init__(self, cluster: Cluster, run_id: str, *, steps: int = 60,
                 nproc_per_node: int = 2, min_nodes: int | None = None,
                 max_restarts: int = 3, checkpoint_every: int = 10,
                 nodes: list[int] | None = None, script: Path = TRAIN,
                 script_args: list[str] | None = None, env: dict[str, str] | None = None,
                 rdzv_timeout: float = 120.0, fake_gpu: bool = True,
                 rdzv_host: str | None = None) -> None:
        self.cluster = cluster
        self.run_id = run_id
        self.node_ids = list(range(len(cluster.workers))) if nodes is None else list(nodes)
        self.steps = steps
        self.nproc = nproc_per_node
        self.min_nodes = min_nodes or len(self.node_ids)
        self.max_restarts = max_restarts
        self.checkpoint_every = checkpoint_every
        self.script = script
        self.script_args = script_args or []
        self.extra_env = env or {}
        self.rdzv_timeout = rdzv_timeout
        self.fake_gpu = fake_gpu
        # A host outside the job holding the rendezvous store (a TCPStore this process
        # starts there), so the job can leave any node out, node 0 too: with node 0's agent
        # hosting it, the store leaves with that agent.
        self.rdzv_host = rdzv_host
        self.store: subprocess.Popen[bytes] | None = None
        self.dir = cluster.dir / "jobs" / run_id
        self.out = self.dir / "out"
        self.checkpoints = self.dir / "checkpoints"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.left: set[int] = set()  # nodes that left the job (``leave``)

    @property
    def endpoint(self) -> str:
        host = self.rdzv_host or self.cluster.workers[self.node_ids[0]].ip
        return f"{host}:{RDZV_PORT}"

    def command(self, node: Node) -> list[str]:
        host = self.rdzv_host is None and node.index == self.node_ids[0]
        conf = (f"join_timeout={int(self.rdzv_timeout)},last_call_timeout=2,"
                f"close_timeout=10,read_timeout=60,is_host={int(host)}")
        args = ([f"--run-id={self.run_id}", f"--steps={self.steps}",
                 f"--checkpoint-every={self.checkpoint_every}",
                 f"--checkpoint-dir={self.checkpoints}", f"--out={self.out}"]
                if self.script == TRAIN else [])
        return [sys.executable, "-m", "torch.distributed.run",
                f"--nnodes={self.min_nodes}:{len(self.node_ids)}",
                f"--nproc-per-node={self.nproc}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id={self.run_id}",
                f"--rdzv-conf={conf}", f"--max-restarts={self.max_restarts}",
                f"--local-addr={node.ip}", "--monitor-interval=0.5",
                str(self.script), *args, *self.script_args]

    def env(self, node: Node) -> dict[str, str]:
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the agent's store shared (the default
        # since torch 2.5), an agent that restarts for a membership change keeps its restart
        # count while the failed node's goes up, so the restarted ranks read each other's
        # addresses from the previous round and gloo's connect is refused
        # (pytorch/pytorch#135712; seen here on torch 2.13). Each round then has its own store.
        env = {**self.cluster.env(node), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
               "MONITOR_AGENT_SPOOL_DIR": str(node.dir / "spool" / self.run_id),
               "NETCLUSTER_FAKE_GPU": "1" if self.fake_gpu else "0",
               "PYTHONUNBUFFERED": "1"}
        if self.cluster.sidecars is not None:
            env.update(self.cluster.sidecars.client_env())
        return {**env, **self.extra_env}

    def start(self) -> ElasticJob:
        self.out.mkdir(parents=True, exist_ok=True)
        if self.rdzv_host is not None:
            self.store = subprocess.Popen(
                [sys.executable, "-c", STORE, self.rdzv_host, str(RDZV_PORT)],
                stdout=(self.dir / "store.log").open("wb"), stderr=subprocess.STDOUT,
                start_new_session=True)
        for i in self.node_ids:
            self.start_node(i)
        return self

    def start_node(self, i: int) -> subprocess.Popen[bytes]:
        """Node ``i``'s agent (again: a node that rejoins, or joins late)."""
        node = self.cluster.workers[i]
        self.left.discard(i)
        self.procs[i] = node.popen(self.command(node), log=self.agent_log(i),
                                   env=self.env(node), cwd=self.dir)
        return self.procs[i]

    def agent_log(self, node: int) -> Path:
        return self.dir / f"torchrun.node{node}.log"

    # -- waiting ------------------------------------------------------------------------------
    def wait(self, timeout: float = 240.0) -> dict[int, int]:
        """Every agent's exit status ({node: code}); AssertionError with the logs if one is
        still running after ``timeout`` (scaled) seconds."""
        deadline = time.monotonic() + scaled(timeout)
        for i, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{self.run_id}: node{i}'s torchrun still running after "
                                     f"{scaled(timeout):g} s\n{self.logs()}") from None
        if self.store is not None:
            self.store.kill()
            self.store.wait(10)
        return {i: proc.returncode for i, proc in self.procs.items()}

    def wait_step(self, step: int, timeout: float = 120.0) -> None:
        """Until some rank logged ``step`` in the newest attempt."""
        def reached() -> bool:
            self._check_running()
            return any(e["step"] >= step for e in self.events("step"))
        eventually(reached, timeout=timeout, interval=0.2, what=f"{self.run_id} at step {step}",
                   context=self.logs)

    def _check_running(self) -> None:
        ended = {i: p.returncode for i, p in self.procs.items() if p.poll() is not None}
        if ended and all(code != 0 for code in ended.values()) and len(ended) == len(self.procs):
            raise RuntimeError(f"{self.run_id}: every torchrun exited: {ended}\n{self.logs()}")

    def leave(self, i: int) -> None:
        """Node ``i`` leaves the job: its agent and its workers SIGKILLed (a node lost, or
        one left out). Its agent says no goodbye: a SIGTERMed agent would close the
        rendezvous for everyone; the others see its heartbeat stop, their workers' next
        collective fail, and re-form without it (down to ``min_nodes``)."""
        node = self.cluster.workers[i]
        proc = self.procs[i]
        self.left.add(i)
        victims = {proc.pid} | {pid for pid in node.pids()
                                if environ(pid).get("TORCHELASTIC_RUN_ID") == self.run_id}
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)

    def kill(self) -> None:
        """Every agent and its workers (each agent's session), SIGKILL; the rendezvous
        store this job started."""
        for proc in [*self.procs.values(), *([self.store] if self.store else [])]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    # -- what the ranks wrote ----------------------------------------------------------------
    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every rank's log lines, in time order (``kind``: only ``step``, ``resume``...)."""
        out: list[dict[str, Any]] = []
        for path in sorted((self.out / "ranks").glob("*.jsonl")):
            node, local = path.stem.split(".")
            for line in path.read_text().splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the line a SIGKILL cut short
                if kind is None or event["event"] == kind:
                    event.update(node=int(node[4:]), local_rank=int(local[5:]))
                    out.append(event)
        return sorted(out, key=lambda e: e["time"])

    def recent(self, kind: str = "step", tail_bytes: int = 32768) -> list[dict[str, Any]]:
        """The newest lines of every rank's log (the last ``tail_bytes`` of each file, the
        newest process's lines only): cheap to call every second on a long run."""
        out: list[dict[str, Any]] = []
        for path in sorted((self.out / "ranks").glob("*.jsonl")):
            node, local = path.stem.split(".")
            with path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - tail_bytes))
                lines = fh.read().split(b"\n")
            events = []
            for line in lines[1:] if size > tail_bytes else lines:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by the tail or by a SIGKILL
            newest = events[-1]["pid"] if events else None
            for event in events:
                if event["pid"] == newest and event["event"] == kind:
                    event.update(node=int(node[4:]), local_rank=int(local[5:]))
                    out.append(event)
        return out

    def finals(self) -> dict[int, dict[str, Any]]:
        """{rank: its final record} of the attempt that finished."""
        return {int(p.stem[4:]): json.loads(p.read_text())
                for p in sorted((self.out / "final").glob("rank*.json"))}

    def attempts(self) -> list[int]:
        return sorted({e["attempt"] for e in self.events("start")})

    def logs(self) -> str:
        parts = [f"--- torchrun node{i} ---\n" + self.agent_log(i).read_text(
            errors="replace")[-4000:] for i in self.procs if self.agent_log(i).exists()]
        return "\n".join(parts)
