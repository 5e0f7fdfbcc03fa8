"""The TCP probe (cluster/tcp_probe.py) reads what ``ss -tinH`` prints: recorded output of a
namespace cluster whose node 0's link was capped with ``tc tbf`` (tests/cluster/ss/, four
nodes passing data round a ring), and the live output of this machine for a connection the
test opens."""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

import pytest

from monitor_agent.cluster.tcp_probe import (
    MAX_PEERS,
    Connection,
    ProbeThread,
    TcpProbe,
    counters,
    key,
    parse_ss,
    summarise,
)

SS = Path(__file__).parent / "ss"


def test_the_capped_nodes_sending_connection_is_the_one_it_measures_and_it_is_slow():
    """Node 0 (capped) sends to node 1 and receives from node 3; its other connections
    carried only their handshake. Only the one that sends data has a fresh RTT."""
    conns = parse_ss((SS / "capped_node0.txt").read_text())
    assert len(conns) == 6
    assert {c.local for c in conns} == {"10.213.77.1"}
    sample = summarise(conns, active_ms=5000)
    assert sample.local == ("10.213.77.1",)
    assert [(p.address, p.rtt_ms, p.rttvar_ms, p.connections) for p in sample.peers] == [
        ("10.213.77.2", 68.29, 8.168, 1)]


def test_a_peer_of_the_capped_node_measures_its_own_sending_connection_fast():
    sample = summarise(parse_ss((SS / "capped_node1.txt").read_text()), active_ms=5000)
    assert [(p.address, p.rtt_ms) for p in sample.peers] == [("10.213.77.3", 0.124)]


def _conn(remote: str, rtt: float = 1.0, lastsnd: int = 10, acked: int = 5000,
          lport: int = 40000, rport: int = 29500, local: str = "10.0.0.1",
          retrans: int = 0) -> Connection:
    return Connection(local, lport, remote, rport, rtt, rtt / 4, retrans, lastsnd, acked)


def test_idle_handshake_only_loopback_own_and_skipped_port_connections_are_left_out():
    conns = [_conn("10.0.0.2", lastsnd=9000),            # idle past the interval: stale
             _conn("10.0.0.3", acked=1),                  # the handshake only
             _conn("127.0.0.1", local="127.0.0.1"),       # loopback
             _conn("10.0.0.1"),                           # this host itself
             _conn("10.0.0.4", rport=9400),               # the sidecars' link
             _conn("10.0.0.5", lport=9400),
             _conn("10.0.0.6", rtt=2.0)]
    sample = summarise(conns, active_ms=5000, skip_ports=frozenset({9400}))
    assert [p.address for p in sample.peers] == ["10.0.0.6"]


def test_the_connection_that_moved_the_most_since_the_sample_before_speaks_for_its_address():
    """A rendezvous store's request/response connection (40 ms: its peer's delayed ACK)
    beside the collective's bulk one (0.2 ms): the bulk one is the link's measure."""
    bulk = _conn("10.0.0.2", rtt=0.2, lport=40000, acked=90_000_000, retrans=2)
    store = _conn("10.0.0.2", rtt=40.0, lport=40001, acked=5_000, retrans=1)
    (peer,) = summarise([store, bulk], active_ms=5000).peers
    assert (peer.rtt_ms, peer.connections, peer.retransmits, peer.bytes) == \
        (0.2, 2, 3, 90_000_000 - 1)
    # The bulk connection idle since the sample before (nothing more acknowledged): the
    # store's is all that moved.
    before = {key(bulk): (bulk.bytes_acked, 0), key(store): (1_000, 0)}
    (peer,) = summarise([store, bulk], active_ms=5000, before=before).peers
    assert (peer.rtt_ms, peer.connections, peer.bytes) == (40.0, 1, 4_000)


def test_at_most_max_peers_addresses_are_kept_the_busiest_first():
    conns = [_conn(f"10.1.{i // 250}.{i % 250 + 1}") for i in range(MAX_PEERS + 10)]
    conns += [_conn("10.9.9.9", lport=50000 + i) for i in range(3)]
    peers = summarise(conns, active_ms=5000).peers
    assert len(peers) == MAX_PEERS
    assert "10.9.9.9" in {p.address for p in peers}


def test_an_ipv4_peer_of_a_dual_stack_socket_is_named_by_its_ipv4_address():
    text = ("ESTAB 0 0 [::ffff:10.0.0.1]:29500 [::ffff:10.0.0.2]:41000\n"
            "\t cubic rtt:3.5/1.25 bytes_acked:9000 lastsnd:4\n"
            "ESTAB 0 0 [fd00::1]:29500 [fd00::2]:41000\n"
            "\t cubic rtt:0.5/0.25 bytes_acked:9000\n")
    conns = parse_ss(text)
    assert [(c.local, c.remote, c.rtt_ms, c.lastsnd_ms) for c in conns] == [
        ("10.0.0.1", "10.0.0.2", 3.5, 4), ("fd00::1", "fd00::2", 0.5, 0)]


def test_lines_it_cannot_read_are_skipped():
    text = ("garbage\n\t rtt:1/1\nESTAB 0 0 *:* 10.0.0.2:1\n\t rtt:2/1 bytes_acked:5\n"
            "ESTAB 0 0 10.0.0.1:5 10.0.0.2:6\n\t cubic wscale:7,7\n")
    conns = parse_ss(text)
    assert [(c.remote, c.rtt_ms) for c in conns] == [("10.0.0.2", None)]
    assert summarise(conns, active_ms=5000).peers == ()


@pytest.fixture
def busy_connection():
    """A real TCP connection on loopback that has just sent 1 MB; its local port."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    size = 1 << 20

    def read() -> None:
        got = 0
        while got < size:
            got += len(peer.recv(size - got))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    client.sendall(b"x" * size)
    reader.join()
    try:
        yield client.getsockname()[1]
    finally:
        for s in (client, peer, server):
            s.close()


def test_this_machines_ss_output_is_read(busy_connection: int):
    probe = TcpProbe(active_ms=60_000)
    if probe.ss is None:
        pytest.fail("ss (iproute2) is not installed: the probe cannot be tested")
    out = subprocess.run([probe.ss, "-tinH", "state", "established"], capture_output=True,
                         text=True, check=True).stdout
    mine = [c for c in parse_ss(out) if c.local_port == busy_connection]
    assert len(mine) == 1, out[:2000]
    assert mine[0].rtt_ms is not None and mine[0].rtt_ms > 0
    assert mine[0].bytes_acked > 1 << 19
    sample = probe.sample()
    assert sample is not None and "127.0.0.1" not in {p.address for p in sample.peers}


def test_a_probe_without_ss_samples_nothing_and_says_so(caplog: pytest.LogCaptureFixture):
    probe = TcpProbe(active_ms=1000, ss="/nonexistent/ss")
    assert probe.sample() is None and probe.sample() is None
    assert sum("TCP probe off" in r.getMessage() for r in caplog.records) == 1


def test_the_time_spent_sending_is_the_busiest_connections_since_the_sample_before():
    """``busy`` less ``rwnd_limited`` (a receiver slow to read is not the link), counted
    from the sample before; a connection new since then counts all of its own."""
    text = ("ESTAB 0 0 10.0.0.1:41824 10.0.0.2:29500\n"
            "\t bbr rtt:1.5/0.5 bytes_acked:9000001 lastsnd:4 busy:2500ms "
            "rwnd_limited:300ms(1.2%) sndbuf_limited:20ms(0.1%)\n"
            "ESTAB 0 0 10.0.0.1:41830 10.0.0.3:29500\n"
            "\t bbr rtt:0.2/0.1 bytes_acked:5000001 lastsnd:4 busy:40ms\n"
            "ESTAB 0 0 10.0.0.1:41840 10.0.0.4:29500\n"
            "\t cubic rtt:0.2/0.1 bytes_acked:5000001 lastsnd:4\n")  # an older kernel
    conns = parse_ss(text)
    assert [c.sending_ms for c in conns] == [2200, 40, 0]
    first = summarise(conns, active_ms=5000)
    assert [(p.address, p.bytes, p.sending_ms) for p in first.peers] == [
        ("10.0.0.2", 9_000_000, 2200.0), ("10.0.0.3", 5_000_000, 40.0),
        ("10.0.0.4", 5_000_000, 0.0)]
    before = counters(conns)
    assert before[key(conns[0])] == (9_000_001, 2200)
    later = parse_ss(text.replace("9000001", "12000001").replace("busy:2500ms", "busy:3100ms")
                     .replace("5000001 lastsnd:4 busy:40ms", "5000002 lastsnd:4 busy:40ms"))
    again = summarise(later, active_ms=5000, before=before)
    assert [(p.address, p.bytes, p.sending_ms) for p in again.peers] == [
        ("10.0.0.2", 3_000_000, 600.0), ("10.0.0.3", 1, 0.0)]
    assert again.peers[0].to_dict()["sending_ms"] == 600.0


def test_a_connection_that_moved_nothing_since_the_sample_before_is_idle():
    """Its lastsnd recent (a keep-alive, a zero window probe) but no byte acknowledged
    since: its RTT says nothing new."""
    conn = _conn("10.0.0.9", acked=123_456, lastsnd=5)
    assert len(summarise([conn], 60_000).peers) == 1
    assert summarise([conn], 60_000, before={key(conn): (conn.bytes_acked, 0)}).peers == ()


def test_the_probe_thread_keeps_each_new_sample_under_a_new_serial(busy_connection: int):
    seen = []
    thread = ProbeThread(TcpProbe(active_ms=60_000), 0.05, seen.append)
    thread.start()
    try:
        for _ in range(400):
            if len(seen) >= 2:
                break
            threading.Event().wait(0.05)
    finally:
        thread.stop()
    assert len(seen) >= 2
    assert thread.latest is not None and thread.latest[0] >= 2
