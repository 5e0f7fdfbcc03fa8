"""The cluster's network: a Linux bridge on the host, one network namespace per node joined
to it by a veth pair, an IPv4 /24 of its own, and ``tc`` on a node's link.

Node ``i`` is ``10.213.X.(i+1)``, the bridge (the host's side, where tests reach the nodes
from) ``.254``; X is chosen under a lock among the /24s no route of the host uses yet, so
concurrent clusters (pytest workers, other users of the machine) never share one. Inside a
node its end of the pair is ``eth0`` (``GLOO_SOCKET_IFNAME=eth0`` on every node).

Each namespace also gets ``/etc/netns/<ns>/hosts`` (``ip netns exec`` mounts it over
``/etc/hosts``): every node's hostname resolves to its address, as on a real cluster.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BASE = ipaddress.ip_network("10.213.0.0/16")
LOCK = Path("/run/lock/netcluster.lock")
NODE_IFACE = "eth0"
ETC_NETNS = Path("/etc/netns")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, its output captured; CalledProcessError says what it printed."""
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if check and res.returncode != 0:
        raise subprocess.CalledProcessError(res.returncode, list(argv), res.stdout, res.stderr)
    return res


@contextmanager
def _locked() -> Iterator[None]:
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 destination this host routes, in any table (``local 10.0.0.5 ...``,
    ``10.0.0.0/24 dev ...``); ``default`` routes say nothing about a /24 and are left out."""
    kinds = {"unicast", "local", "broadcast", "multicast", "unreachable", "blackhole",
             "prohibit", "throw", "nat", "anycast"}
    nets = []
    for line in sh("ip", "-4", "-o", "route", "show", "table", "all").stdout.splitlines():
        tokens = line.split()
        if tokens and tokens[0] in kinds:
            tokens = tokens[1:]
        if not tokens or tokens[0] == "default":
            continue
        try:
            net = ipaddress.ip_network(tokens[0], strict=False)
        except ValueError:
            continue
        if isinstance(net, ipaddress.IPv4Network):
            nets.append(net)
    return nets


def create_bridge(name: str, start: int) -> ipaddress.IPv4Network:
    """The bridge ``name`` up, with ``.254`` of a /24 of 10.213/16 that nothing else on this
    host routes (the first free one from ``start``); returns the /24."""
    with _locked():
        used = _used_networks()
        for k in range(256):
            subnet = ipaddress.ip_network(f"10.213.{(start + k) % 256}.0/24")
            if not any(subnet.overlaps(n) for n in used):
                break
        else:
            raise RuntimeError("no free /24 left in 10.213.0.0/16 for a netcluster bridge")
        sh("ip", "link", "add", name, "type", "bridge")
        sh("ip", "addr", "add", f"{subnet[254]}/24", "dev", name)
        sh("ip", "link", "set", name, "up")
    return subnet


def add_node(bridge: str, netns: str, veth: str, address: str) -> None:
    """A namespace ``netns`` whose ``eth0`` (``address``/24) is the other end of ``veth`` on
    the bridge; loopback up; default route via the bridge."""
    sh("ip", "netns", "add", netns)
    sh("ip", "link", "add", veth, "type", "veth", "peer", "name", NODE_IFACE, "netns", netns)
    sh("ip", "link", "set", veth, "master", bridge, "up")
    sh("ip", "-n", netns, "addr", "add", f"{address}/24", "dev", NODE_IFACE)
    sh("ip", "-n", netns, "link", "set", NODE_IFACE, "up")
    sh("ip", "-n", netns, "link", "set", "lo", "up")
    gateway = str(ipaddress.ip_interface(f"{address}/24").network[254])
    sh("ip", "-n", netns, "route", "add", "default", "via", gateway)


def write_hosts(netns: str, hostname: str, hosts: dict[str, str]) -> None:
    """``/etc/hosts`` as the node sees it: loopback, then every name and address of the
    cluster; and a ``resolv.conf`` with no DNS server to wait for (a node has no route out:
    a lookup the hosts file cannot answer fails at once instead of after 10 s)."""
    d = ETC_NETNS / netns
    d.mkdir(parents=True, exist_ok=True)
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
             *(f"{ip} {name}" for name, ip in hosts.items())]
    (d / "hosts").write_text("\n".join(lines) + "\n")
    (d / "hostname").write_text(hostname + "\n")
    (d / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")


def remove_netns(netns: str) -> None:
    sh("ip", "netns", "del", netns, check=False)
    shutil.rmtree(ETC_NETNS / netns, ignore_errors=True)


def remove_link(name: str) -> None:
    """Delete a link (a veth's host end takes its peer with it); absent is fine."""
    sh("ip", "link", "del", name, check=False)


def netns_list() -> list[str]:
    return [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line]


def link_list() -> list[str]:
    out = sh("ip", "-o", "link", "show").stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def etc_netns_list() -> list[str]:
    return sorted(p.name for p in ETC_NETNS.iterdir()) if ETC_NETNS.is_dir() else []


# -- a node's link capped with tc ----------------------------------------------------------


def cap(veth: str, netns: str, rate: str, burst: str, latency: str) -> None:
    """``tbf`` on both directions of a node's link: ``veth`` (the host end: traffic into
    the node) and ``eth0`` inside ``netns`` (traffic out of it). netem is not in every
    kernel; a token bucket is, and caps bandwidth (its queue adds delay under load)."""
    tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
    sh("tc", "qdisc", "replace", "dev", veth, *tbf)
    sh("ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", NODE_IFACE, *tbf)


def uncap(veth: str, netns: str) -> None:
    sh("tc", "qdisc", "del", "dev", veth, "root", check=False)
    sh("ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", NODE_IFACE, "root",
       check=False)


def qdiscs(veth: str, netns: str) -> tuple[str, str]:
    """``tc qdisc show`` of the host end and of the node's end, as text."""
    host = sh("tc", "qdisc", "show", "dev", veth, check=False).stdout
    node = sh("ip", "netns", "exec", netns, "tc", "qdisc", "show", "dev", NODE_IFACE,
              check=False).stdout
    return host, node


def have_tools() -> str | None:
    """None, or why this machine cannot build a cluster (missing tool, not root)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veths, cgroups, tc); run as root, as CI does"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not on PATH (Debian: iproute2, util-linux)"
    return None
