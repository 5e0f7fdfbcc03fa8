"""This host's TCP connections to other machines, sampled: the per-node network signal
(issue 44, ``network-slow``).

A node whose link is slow (capped, flapping, a bad cable renegotiated down) slows every
rank of a ring collective alike, so the ranks' step timings cannot name it. Its TCP
connections can: the data it sends queues in its link, so the round-trip time its own
connections measure goes up to every peer, and so does the time its peers' connections
*to it* measure, while theirs to the other nodes does not. Every slow pair has the slow
node in common (runs/network_slow.py judges that, on the leader).

Read with ``ss -tinH state established`` (iproute2; the sidecar runs in the node's network
namespace, the Pod's under Kubernetes, so it sees what the ranks send): for each remote
address, among the connections that sent data within the last ``active_ms`` (their
smoothed RTT was updated by it; an idle connection's is stale), the ``rtt`` and ``rttvar``
(the kernel's own mean deviation of the RTT samples: the noise its retransmission timer
allows for) of the one that moved the most bytes since the sample before: the job's
collective. A request/response connection (a rendezvous store's) measures its peer's
answer time and delayed ACK (up to 40 ms on Linux), not the link: measured on the
namespace cluster, the store's host was in every slow pair of a healthy job until the
busiest connection spoke for each address. Also how many connections sent, and their
retransmitted segments.

And the time that connection spent sending what it moved: the kernel's ``busy`` time (data
in flight) less its ``rwnd_limited`` time (waiting for the receiver to read), since the
sample before. A smoothed RTT read at a moment is its value at the end of the last burst,
when a capped link's queue has drained (measured on the namespace cluster: a node capped at
150 Mbit/s, its pairs 1.7-6 ms, the healthy pairs 0.15-5.6 ms); the bytes over the time
spent sending them is the rate the path gave the whole burst, at most the cap (117-160
Mbit/s against the healthy pairs' 236-630 on the same 2-core machine). Loopback, this
host's own addresses and the ``skip_ports`` (the sidecars' own link) are left out; at most ``MAX_PEERS`` addresses, those with the most
connections kept.

    >>> text = ('ESTAB 0 0 10.0.0.1:41824 10.0.0.2:29500\\n'
    ...         '\\t cubic rtt:68.29/8.168 bytes_acked:13296440 retrans:0/12 lastsnd:12'
    ...         ' busy:2104ms rwnd_limited:4ms(0.2%)\\n')
    >>> [(c.remote, c.rtt_ms, c.rttvar_ms, c.retransmits, c.sending_ms)
    ...  for c in parse_ss(text)]
    [('10.0.0.2', 68.29, 8.168, 12, 2100)]
"""

from __future__ import annotations

import ipaddress
import logging
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_PEERS = 256
"""Remote addresses kept per sample (and taken per exchange on the leader: api/peer.py):
more than the nodes of any job one leader holds well (docs/scaling-out.md)."""
SS_TIMEOUT_S = 5.0

_ENDPOINT = re.compile(r"^\[?(?P<addr>[^\]]*?)\]?(?:%\S+)?:(?P<port>\d+|\*)$")
_RTT = re.compile(r"(?:^|\s)rtt:(?P<rtt>[\d.]+)/(?P<var>[\d.]+)")
_RETRANS = re.compile(r"(?:^|\s)retrans:\d+/(?P<total>\d+)")
_LASTSND = re.compile(r"(?:^|\s)lastsnd:(?P<ms>\d+)")
_ACKED = re.compile(r"(?:^|\s)bytes_acked:(?P<n>\d+)")
_BUSY = re.compile(r"(?:^|\s)busy:(?P<ms>\d+)ms")
_RWND = re.compile(r"(?:^|\s)rwnd_limited:(?P<ms>\d+)ms")


@dataclass(frozen=True, slots=True)
class Connection:
    """One established connection as ``ss -ti`` shows it."""

    local: str
    local_port: int
    remote: str
    remote_port: int
    rtt_ms: float | None
    rttvar_ms: float | None
    retransmits: int
    lastsnd_ms: int  # ss leaves it out while the connection is sending: 0
    bytes_acked: int
    sending_ms: int = 0  # busy less rwnd_limited, since it opened (0: this kernel has none)


@dataclass(frozen=True, slots=True)
class PeerLink:
    """What this host's active connections to one remote address measure."""

    address: str
    rtt_ms: float
    rttvar_ms: float
    connections: int
    retransmits: int
    bytes: int = 0  # what its busiest connection moved since the sample before
    sending_ms: float = 0.0  # the time that connection spent sending it (module docstring)

    def to_dict(self) -> dict[str, object]:
        return {"address": self.address, "rtt_ms": self.rtt_ms, "rttvar_ms": self.rttvar_ms,
                "connections": self.connections, "retransmits": self.retransmits,
                "bytes": self.bytes, "sending_ms": self.sending_ms}


@dataclass(frozen=True, slots=True)
class LinkSample:
    """One sample: this host's own addresses seen on its connections, and per remote
    address its figures."""

    local: tuple[str, ...]
    peers: tuple[PeerLink, ...]


def _endpoint(text: str) -> tuple[str, int] | None:
    m = _ENDPOINT.match(text)
    if m is None or m.group("port") == "*":
        return None
    addr = m.group("addr")
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
    return str(ip), int(m.group("port"))


def parse_ss(text: str) -> list[Connection]:
    """The connections of ``ss -tinH`` output: a line ``State Recv-Q Send-Q local peer``
    followed by an indented line of the ``-i`` figures. Lines it cannot read are skipped
    (another iproute2 may print more or fewer fields)."""
    out: list[Connection] = []
    head: tuple[tuple[str, int], tuple[str, int]] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            tokens = line.split()
            head = None
            if len(tokens) >= 4:  # [State] Recv-Q Send-Q local peer (no State when filtered)
                near, far = _endpoint(tokens[-2]), _endpoint(tokens[-1])
                if near is not None and far is not None:
                    head = (near, far)
            continue
        if head is None:
            continue
        rtt, retrans = _RTT.search(line), _RETRANS.search(line)
        lastsnd, acked = _LASTSND.search(line), _ACKED.search(line)
        busy, rwnd = _BUSY.search(line), _RWND.search(line)
        sending = int(busy.group("ms")) - (int(rwnd.group("ms")) if rwnd else 0) if busy else 0
        (local, lport), (remote, rport) = head
        out.append(Connection(
            local=local, local_port=lport, remote=remote, remote_port=rport,
            rtt_ms=float(rtt.group("rtt")) if rtt else None,
            rttvar_ms=float(rtt.group("var")) if rtt else None,
            retransmits=int(retrans.group("total")) if retrans else 0,
            lastsnd_ms=int(lastsnd.group("ms")) if lastsnd else 0,
            bytes_acked=int(acked.group("n")) if acked else 0, sending_ms=max(sending, 0)))
        head = None
    return out


Key = tuple[str, int, str, int]
"""A connection: local address and port, remote address and port."""


def summarise(connections: Iterable[Connection], active_ms: int,
              skip_ports: frozenset[int] = frozenset(),
              before: Mapping[Key, tuple[int, int]] | None = None,
              max_peers: int = MAX_PEERS) -> LinkSample:
    """Per remote address, the figures of its busiest connection among those that sent
    data within ``active_ms`` (module docstring): the most bytes acknowledged since
    ``before`` (each connection's ``bytes_acked`` and ``sending_ms`` at the sample before,
    ``counters``; a connection not in it counts all of its own). Loopback, this host's own
    addresses and connections on ``skip_ports`` (either end) left out; the ``max_peers``
    addresses with the most connections kept."""
    conns = list(connections)
    local = {c.local for c in conns}
    by_peer: dict[str, list[tuple[int, Connection, int]]] = {}
    for c in conns:
        acked, sent = (before or {}).get(key(c), (1, 0))  # 1: the SYN's
        moved = c.bytes_acked - acked
        if (c.rtt_ms is None or c.rttvar_ms is None or c.lastsnd_ms > active_ms
                or moved <= 0 or c.local_port in skip_ports or c.remote_port in skip_ports
                or c.remote in local or ipaddress.ip_address(c.remote).is_loopback):
            continue
        by_peer.setdefault(c.remote, []).append((moved, c, c.sending_ms - sent))
    kept = sorted(by_peer.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:max_peers]
    peers = []
    for address, moving in sorted(kept):
        moved, busiest, sending = max(moving, key=lambda m: (m[0], -m[1].local_port))
        assert busiest.rtt_ms is not None and busiest.rttvar_ms is not None
        peers.append(PeerLink(address, busiest.rtt_ms, busiest.rttvar_ms, len(moving),
                              sum(c.retransmits for _, c, _ in moving), moved,
                              float(max(sending, 0))))
    own = sorted(a for a in local if not ipaddress.ip_address(a).is_loopback)
    return LinkSample(local=tuple(own[:max_peers]), peers=tuple(peers))


def key(c: Connection) -> Key:
    return (c.local, c.local_port, c.remote, c.remote_port)


def counters(connections: Iterable[Connection]) -> dict[Key, tuple[int, int]]:
    """Each connection's running counters (bytes acknowledged, time spent sending): the
    ``before`` of the next ``summarise``."""
    return {key(c): (c.bytes_acked, c.sending_ms) for c in connections}


class TcpProbe:
    """Samples this host's connections with ``ss`` (the only I/O here)."""

    def __init__(self, active_ms: int, skip_ports: frozenset[int] = frozenset(),
                 ss: str | None = None) -> None:
        self.active_ms, self.skip_ports = active_ms, skip_ports
        self.ss = ss or shutil.which("ss")
        self._warned = False
        self._before: dict[Key, tuple[int, int]] = {}  # counters(), the sample before

    def sample(self) -> LinkSample | None:
        """This host's figures now; None when ``ss`` is missing or fails (said once)."""
        if self.ss is None:
            self._unavailable("ss (iproute2) not found")
            return None
        try:
            res = subprocess.run([self.ss, "-tinH", "state", "established"],
                                 capture_output=True, text=True, timeout=SS_TIMEOUT_S,
                                 check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._unavailable(f"{type(exc).__name__}: {exc}")
            return None
        if res.returncode != 0:
            self._unavailable(f"ss exited {res.returncode}: {res.stderr.strip()[:200]}")
            return None
        conns = parse_ss(res.stdout)
        sample = summarise(conns, self.active_ms, self.skip_ports, self._before)
        self._before = counters(conns)
        return sample

    def _unavailable(self, why: str) -> None:
        if not self._warned:
            log.warning("TCP probe off: %s; no network-slow verdict from this node", why)
            self._warned = True


class ProbeThread:
    """Samples every ``interval`` seconds on a thread of its own; keeps the latest sample
    (``latest``: a serial that grows with each, and the sample) for the leader link to
    send, and hands each to ``on_sample`` (the leader's own judgement of its runs)."""

    def __init__(self, probe: TcpProbe, interval: float,
                 on_sample: Callable[[LinkSample], None] | None = None) -> None:
        self.probe, self.interval, self.on_sample = probe, interval, on_sample
        self.latest: tuple[int, LinkSample] | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tcp-probe")
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                sample = self.probe.sample()
                if sample is None:
                    continue
                serial = self.latest[0] + 1 if self.latest is not None else 1
                self.latest = (serial, sample)
                if self.on_sample is not None:
                    self.on_sample(sample)
            except Exception:  # noqa: BLE001 - the probe must outlive one bad sample
                log.exception("TCP probe: a sample failed; trying again next interval")
