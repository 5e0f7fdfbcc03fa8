"""What clusters leave on the host (namespaces, links, cgroups, ``/etc/netns`` entries),
and the sweep that removes a dead process's leftovers.

Every name carries the pid of the process that made it (``names.py``): a leftover whose
pid is gone is garbage (a test runner SIGKILLed mid-test), one whose pid lives belongs to
a running cluster and is never touched. ``Cluster.up()`` sweeps first.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.netcluster import cgroups, network
from tests.netcluster.names import PATTERN, alive, owner


@dataclass
class Leftovers:
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    cgroups: list[Path] = field(default_factory=list)
    etc: list[str] = field(default_factory=list)
    tmp: list[Path] = field(default_factory=list)  # Slurm's sockets and state

    def __bool__(self) -> bool:
        return bool(self.netns or self.links or self.cgroups or self.etc or self.tmp)


def leftovers(prefix: str | None = None) -> Leftovers:
    """Everything of ours on this host, or only what names start with ``prefix``."""

    def ours(name: str) -> bool:
        if not PATTERN.match(name):
            return False
        if prefix is None:
            return True
        # "nc1a-1" owns "nc1a-1b", "nc1a-1n0", "nc1a-1-slurm", not cluster 10's "nc1a-10b"
        rest = name[len(prefix):] if name.startswith(prefix) else "?"
        return rest == "" or rest[0].isalpha() or rest[0] == "-"

    return Leftovers(netns=[n for n in network.netns_list() if ours(n)],
                     links=[n for n in network.link_list() if ours(n)],
                     cgroups=cgroups.leftover_groups(ours),
                     etc=[n for n in network.etc_netns_list() if ours(n)],
                     tmp=[p for p in Path(tempfile.gettempdir()).glob("*-slurm")
                          if ours(p.name)])


def remove(found: Leftovers) -> None:
    """Processes first (every cgroup's), then links, namespaces, files, cgroups. Goes on
    past what it cannot remove and raises at the end, naming it (a process still holding a
    cgroup: a zombie its parent never reaped)."""
    failed: list[str] = []
    for group in found.cgroups:
        for child in [group, *(d for d in group.iterdir() if d.is_dir())]:
            cgroups.kill_all_in(child)
    for link in found.links:
        network.remove_link(link)
    for ns in found.netns:
        network.remove_netns(ns)
    for ns in found.etc:
        shutil.rmtree(network.ETC_NETNS / ns, ignore_errors=True)
    for path in found.tmp:
        shutil.rmtree(path, ignore_errors=True)
    for group in found.cgroups:
        for d in [*sorted(group.glob("*/"), reverse=True), group]:
            try:
                cgroups.rmdir(d)
            except OSError as exc:
                failed.append(f"{d}: {exc}")
    if failed:
        raise RuntimeError("netcluster: could not remove " + "; ".join(failed))


def sweep() -> Leftovers:
    """Remove the leftovers of every cluster whose process is dead; returns what went."""
    found = leftovers()

    def dead(name: str) -> bool:
        pid = owner(name)
        return pid is not None and not alive(pid)

    gone = Leftovers(netns=[n for n in found.netns if dead(n)],
                     links=[n for n in found.links if dead(n)],
                     cgroups=[g for g in found.cgroups if dead(g.name)],
                     etc=[n for n in found.etc if dead(n)],
                     tmp=[p for p in found.tmp if dead(p.name)])
    remove(gone)
    return gone
