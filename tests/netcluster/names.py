"""Names of everything one cluster creates, unique per process and cluster, and the pid
that owns them (so a sweep can tell a dead run's leftovers from a live run's).

Every name starts with ``nc<pid in base 36>-<cluster number>``: ``nc1a2b-0b`` is cluster 0's
bridge in process ``int("1a2b", 36)``. Interface names are capped at 15 bytes by the kernel;
a pid (at most 4194304, ``2hwcg``) and up to 99 nodes keep every name inside that.

    >>> names = Names(pid=4194304, number=3)
    >>> names.prefix, names.bridge, names.veth(12), names.netns(1)
    ('nc2hwcg-3', 'nc2hwcg-3b', 'nc2hwcg-3h12', 'nc2hwcg-3n1')
    >>> owner("nc2hwcg-3h12"), owner("eth0"), owner("ncx")
    (4194304, None, None)
    >>> Names(pid=4194304, number=0, tag="fs").bridge, owner("fs2hwcg-0b")
    ('fs2hwcg-0b', 4194304)
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field

PATTERN = re.compile(r"^(?:nc|fs)([0-9a-z]{1,6})-(\d{1,3})")
TAGS = ("nc", "fs")  # nc: the tests' clusters; fs: bench/fault_suite.py's (its own at a glance)
_numbers = itertools.count()


def base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def owner(name: str) -> int | None:
    """The pid that created ``name``, or None for a name that is not one of ours."""
    m = PATTERN.match(name)
    return int(m.group(1), 36) if m else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Names:
    """The names of one cluster's bridge, namespaces, veths and cgroups."""

    pid: int = field(default_factory=os.getpid)
    number: int = field(default_factory=lambda: next(_numbers))
    tag: str = "nc"  # one of TAGS: who made the cluster, for a person reading `ip link`

    def __post_init__(self) -> None:
        if self.tag not in TAGS:
            raise ValueError(f"tag must be one of {TAGS} (the sweep knows only those)")

    @property
    def prefix(self) -> str:
        return f"{self.tag}{base36(self.pid)}-{self.number}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}b"

    def veth(self, node: int) -> str:
        """The host end of ``node``'s veth pair (its other end is ``eth0`` in the node)."""
        return f"{self.prefix}h{node}"

    def netns(self, node: int) -> str:
        return f"{self.prefix}n{node}"

    @property
    def controller_netns(self) -> str:
        """The namespace of the cluster's head services (Slurm's controller)."""
        return f"{self.prefix}c"
