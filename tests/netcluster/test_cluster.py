"""The cluster's nodes are namespaces with their own address, hostname and cgroup; they
reach each other and the host over the bridge; teardown and the sweep leave nothing."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.eventually import eventually
from tests.netcluster import Cluster, Names
from tests.netcluster.sweep import leftovers, sweep

PING = """
import socket, sys
s = socket.create_server(("0.0.0.0", 7000))
print(socket.gethostname(), flush=True)
conn, peer = s.accept()
conn.sendall(socket.gethostbyaddr(peer[0])[0].encode())
"""


def test_each_node_has_its_own_name_address_and_cgroup_and_reaches_the_others(
        small_cluster: Cluster) -> None:
    a, b = small_cluster.workers
    assert a.ip != b.ip
    server = a.popen([sys.executable, "-c", PING], log=a.dir / "ping.log")
    eventually(lambda: (a.dir / "ping.log").read_text().strip() == "node0", timeout=30,
               what="node0's server up")
    got = b.run([sys.executable, "-c", "import socket; s = socket.create_connection("
                 f"('{a.ip}', 7000), timeout=10); print(s.recv(100).decode())"])
    assert got.stdout.strip() == "node1", got.stderr  # node0 resolves node1's address
    assert server.wait(10) == 0
    assert small_cluster.run(1, ["hostname"]).stdout.strip() == "node1"
    # the host reaches a node across the bridge, and the node knows the host by name
    assert b.run(["getent", "hosts", small_cluster.bridge_ip]).stdout.split()[1] == "host"
    sleeper = b.popen(["sleep", "60"], log=b.dir / "sleep.log")
    eventually(lambda: sleeper.pid in b.pids(), timeout=10, what="the sleeper in node1's cgroup")
    assert sleeper.pid not in a.pids()


def test_down_leaves_nothing_behind_processes_included(tmp_path: Path, privileged: None) -> None:
    cluster = Cluster(tmp_path / "c", nodes=3).up()
    prefix = cluster.names.prefix
    node = cluster.workers[2]
    # a daemon that left its parent: only the node's cgroup still knows it
    node.run(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 &"])
    daemon = node.pids()
    assert len(daemon) == 1, "the daemon runs on the node"
    cluster.faults.cap_link(1, rate="1mbit")
    cluster.faults.throttle(0, 2.0, used_cores=0.5)
    found = cluster.leftovers()
    assert len(found.netns) == 3 and len(found.links) == 4 and found.cgroups and found.etc
    cluster.down()
    assert not leftovers(prefix), leftovers(prefix)
    for pid in daemon:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    cluster.down()  # twice is fine


def test_a_dead_runs_leftovers_are_swept_and_a_live_ones_kept(tmp_path: Path, privileged: None) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is free now: a test runner that was SIGKILLed mid-test
    with Cluster(tmp_path / "live", nodes=1) as live:
        orphan = Cluster(tmp_path / "orphan", nodes=1, names=Names(pid=dead.pid)).up()
        node = orphan.workers[0]
        node.run(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 &"])  # not our child
        (sleeper,) = node.pids()
        atexit.unregister(orphan.down)  # as if its process had died: nobody tears it down
        gone = sweep()
        assert gone.netns == [orphan.names.netns(0)], gone
        assert not leftovers(orphan.names.prefix), leftovers(orphan.names.prefix)
        assert not Path(f"/proc/{sleeper}").exists() or _zombie(sleeper)  # it went too
        assert len(live.leftovers().netns) == 1  # a live process's cluster is untouched


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def test_names_fit_the_kernels_limits() -> None:
    names = Names(pid=4194304, number=99)
    assert max(len(names.bridge), len(names.veth(63)), len(names.prefix + "hc")) <= 15
    assert Names().pid == os.getpid() and Names().prefix != Names().prefix  # one per cluster


def test_without_the_privilege_a_test_skips_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """(Under CI=true that skip fails: tests/ci_strict.py, tests/test_ci_strict.py.)"""
    from tests.netcluster import conftest

    monkeypatch.setattr(conftest, "unavailable", lambda: "needs root (...)")
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        conftest.require_cluster()
