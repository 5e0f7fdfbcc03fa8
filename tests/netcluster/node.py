"""One node of the cluster: a network namespace with its own address and hostname, a CPU
cgroup holding every process it runs, and a working directory of its own.

``node.command(argv)`` is ``argv`` run *on* the node: in the node's cgroup, inside its
network namespace, with the node's ``/etc/hosts`` (every node by name) mounted in a mount
namespace of its own, and in a UTS namespace whose hostname is the node's (pages and
``socket.gethostname()`` name the node). ``node.popen(argv, log=...)`` starts it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.netcluster.cgroups import NodeCgroup
from tests.netcluster.network import ETC_NETNS


@dataclass
class Node:
    index: int
    hostname: str
    netns: str
    veth: str           # the host end of its link
    ip: str
    cgroup: NodeCgroup
    dir: Path           # its working directory (logs, its sidecar's data)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, argv: list[str]) -> list[str]:
        # The cgroup first, from the host's view of /sys/fs/cgroup. Then the node's network
        # namespace, entered with nsenter rather than ``ip netns exec``: that one remounts
        # /sys for the namespace, which hides /sys/fs/cgroup (slurmd will not start without
        # it). What ``ip netns exec`` adds is done here in a mount namespace of the
        # process's own: the node's /etc/hosts and resolv.conf; and its hostname in a UTS one.
        etc = ETC_NETNS / self.netns
        setup = (f"mount --bind {etc / 'hosts'} /etc/hosts && "
                 f"mount --bind {etc / 'resolv.conf'} /etc/resolv.conf && "
                 'hostname "$0" && exec "$@"')
        return ["sh", "-c", f'{self.cgroup.join_script()} && exec "$@"', "netcluster",
                "nsenter", f"--net=/run/netns/{self.netns}", "unshare", "--mount", "--uts",
                "sh", "-c", setup, self.hostname, *argv]

    def popen(self, argv: list[str], log: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """``argv`` started on this node, stdout and stderr appended to ``log``, with
        ``env`` over this process's environment; in a session of its own, so a signal
        meant for the test runner's group never reaches it."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(self.command(argv), env={**os.environ, **(env or {})},
                                    cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``argv`` on this node, to completion, output captured."""
        return subprocess.run(self.command(argv), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def pids(self) -> list[int]:
        """Every process running on the node now."""
        return self.cgroup.pids()

    def reap(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.procs.clear()
