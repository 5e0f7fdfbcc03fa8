"""Slurm on the cluster, for real: Debian's ``munged`` with a key made for this cluster,
``slurmctld`` on the head node, one ``slurmd`` per compute node (``NodeName=node<i>
NodeAddr=<its address>``), and the client commands (``sbatch``, ``scontrol``, ``squeue``)
pointed at this cluster's ``slurm.conf`` by ``SLURM_CONF``.

The configuration is the least that schedules a job across the nodes and lets a node be
drained: no accounting, ``proctrack/linuxproc`` and ``task/none`` (no cgroups),
``select/linear`` (whole nodes), requeue allowed. Daemons run in the foreground (``-D``)
inside their node's cgroup, so the cluster's teardown ends them like any other process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.eventually import eventually

if TYPE_CHECKING:
    from tests.netcluster.cluster import Cluster

CTLD_PORT, SLURMD_PORT = 6817, 6818  # namespaces of their own: no clash with anyone's


def runtime_dir(prefix: str) -> Path:
    """``/tmp/<prefix>-slurm``: short, and named for the sweep (netcluster/sweep.py)."""
    return Path(tempfile.gettempdir()) / f"{prefix}-slurm"


def unavailable() -> str | None:
    """None if the Slurm and munge binaries are here, else what to install."""
    missing = [b for b in ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol",
                           "squeue") if shutil.which(b) is None]
    if missing:
        return (f"{', '.join(missing)} not on PATH: apt-get install munge slurmctld slurmd "
                "slurm-client")
    return None


class Slurm:
    """munged + slurmctld + slurmd per node; ``sbatch``/``scontrol``/``squeue`` as methods."""

    def __init__(self, cluster: Cluster, partition: str = "main") -> None:
        self.cluster = cluster
        self.dir = cluster.dir / "slurm"  # configuration and logs
        # Sockets live here: munged's, and slurmd's per job step in its spool directory. A
        # Unix socket's path has at most 107 bytes, which a test's tmp_path can overrun.
        self.run_dir = runtime_dir(cluster.names.prefix)
        self.partition = partition
        self.conf = self.dir / "slurm.conf"
        self.socket = self.run_dir / "munge" / "socket"
        self.procs: list[subprocess.Popen[bytes]] = []

    # -- configuration ----------------------------------------------------------------------
    def config(self) -> str:
        d, r, head = self.dir, self.run_dir, self.cluster.head()
        nodes = self.cluster.workers
        lines = [
            f"ClusterName={self.cluster.names.prefix.replace('-', '_')}",
            f"SlurmctldHost=head({head.ip})",
            f"SlurmctldPort={CTLD_PORT}", f"SlurmdPort={SLURMD_PORT}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r}/slurmd.%n.pid",
            f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d}/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "SchedulerType=sched/builtin", "SelectType=select/linear",
            "MpiDefault=none", "ReturnToService=2", "JobRequeue=1",
            "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5",
            "MinJobAge=600", "Waittime=0", "SlurmctldDebug=info", "SlurmdDebug=info",
            "MailProg=/bin/true",
            *(f"NodeName={n.hostname} NodeAddr={n.ip} CPUs={os.cpu_count() or 1} State=UNKNOWN"
              for n in nodes),
            f"PartitionName={self.partition} Nodes={','.join(n.hostname for n in nodes)} "
            "Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> Slurm:
        why = unavailable()
        if why:
            raise RuntimeError(why)
        self.dir.mkdir(parents=True, exist_ok=True)
        for sub in ("munge", "state", *(f"spool/{n.hostname}" for n in self.cluster.workers)):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.run_dir / "munge", 0o700)
        self.conf.write_text(self.config())
        head = self.cluster.head()
        key = self.run_dir / "munge" / "munge.key"  # this cluster's own key
        subprocess.run(["mungekey", "--create", f"--keyfile={key}", "--force"], check=True,
                       capture_output=True)
        os.chmod(key, 0o600)
        m = self.run_dir / "munge"
        self.procs.append(head.popen(
            ["munged", "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
             f"--pid-file={m / 'munged.pid'}", f"--log-file={self.dir / 'munged.log'}",
             f"--seed-file={m / 'munged.seed'}"], log=self.dir / "munged.out"))
        eventually(self.socket.exists, timeout=timeout, what="munged's socket",
                   context=self.logs)
        env = self.env()
        self.procs.append(head.popen(["slurmctld", "-D", "-i", "-f", str(self.conf)],
                                     log=self.dir / "slurmctld.out", env=env))
        for node in self.cluster.workers:
            self.procs.append(node.popen(["slurmd", "-D", "-N", node.hostname, "-f",
                                          str(self.conf)], log=self.dir / f"{node.hostname}.out",
                                         env=env))
        names = {n.hostname for n in self.cluster.workers}
        eventually(lambda: {n for n, s in self.node_states().items() if s == "idle"} == names,
                   timeout=timeout, interval=0.5, what="every slurmd idle",
                   retry_on=(subprocess.CalledProcessError,), context=self.logs)
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    # -- the client commands -----------------------------------------------------------------
    def cmd(self, *argv: str, check: bool = True) -> str:
        res = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                             timeout=60)
        if check and res.returncode != 0:
            raise subprocess.CalledProcessError(res.returncode, list(argv), res.stdout,
                                                res.stderr)
        return res.stdout

    def sbatch(self, script: Path, *args: str) -> int:
        """Submit ``script``; returns the job id."""
        out = self.cmd("sbatch", "--parsable", f"--chdir={script.parent}", *args, str(script))
        return int(out.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, NodeList, Restarts, BatchHost...)."""
        out = self.cmd("scontrol", "show", "job", "-o", str(job_id))
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def hostnames(self, nodelist: str) -> list[str]:
        return self.cmd("scontrol", "show", "hostnames", nodelist).split()

    def node_states(self) -> dict[str, str]:
        """{node: state} as ``sinfo`` reports it (idle, alloc, drain, drng, down...)."""
        out = self.cmd("sinfo", "-h", "-N", "-o", "%N %t")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def drain(self, node: str, reason: str) -> None:
        self.cmd("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        self.cmd("scontrol", "update", f"NodeName={node}", "State=RESUME")

    def requeue(self, job_id: int, at_once: bool = True) -> None:
        """``scontrol requeue``: the job's processes end and it goes back to the queue.
        Slurm holds a requeued job for two minutes (its BeginTime becomes now + 121 s, so a
        failing node can settle); ``at_once`` sets it back to now, as an operator who has
        drained the node would."""
        self.cmd("scontrol", "requeue", str(job_id))
        if at_once:
            eventually(lambda: self.job(job_id)["JobState"] == "PENDING", timeout=60,
                       interval=0.2, what=f"job {job_id} pending again", context=self.logs)
            self.start_now(job_id, time.time())

    def start_now(self, job_id: int, requeued_by: float) -> None:
        """Make a requeued job eligible now rather than in 121 s. Its next launch needs a
        job credential made in a later second than the one its requeue revoked (slurmd
        refuses one no newer, whole seconds: "Job credential revoked", and the batch job is
        killed), so this waits for the clock to pass ``requeued_by``'s second first."""
        eventually(lambda: int(time.time()) > int(requeued_by), timeout=5, interval=0.05,
                   what="the second of the requeue over")
        self.cmd("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    def node(self, name: str) -> dict[str, Any]:
        out = self.cmd("scontrol", "show", "node", "-o", name)
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def logs(self) -> str:
        parts = []
        for path in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")):
            if path.exists():
                parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)
