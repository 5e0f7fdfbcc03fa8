"""Each fault of the harness, injected for real and seen where it acts: a cgroup quota
that the kernel enforces on the node's processes, a token bucket on both ends of a node's
link that holds packets back, an XID and an ECC count read through the client's own NVML
code from the fake driver, and what a node's ranks do to themselves in a real torchrun
job (a slowed loader, a bit flip, a NaN) with one rank SIGSTOPped and continued."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.eventually import eventually
from tests.netcluster import Cluster

BURN = "while True: pass"


def _throttled(cluster: Cluster, node: int) -> int:
    stat = (cluster.workers[node].cgroup.cpu_dir / "cpu.stat").read_text()
    return int(re.search(r"nr_throttled (\d+)", stat).group(1))  # type: ignore[union-attr]


def test_a_throttle_caps_every_process_of_the_node_and_the_kernel_enforces_it(
        small_cluster: Cluster) -> None:
    node = small_cluster.workers[0]
    burners = [node.popen([sys.executable, "-c", BURN], log=node.dir / f"burn{i}.log")
               for i in range(2)]
    eventually(lambda: {p.pid for p in burners} <= set(node.pids()), timeout=10,
               what="the burners in node0's cgroup")
    before = _throttled(small_cluster, 0)
    applied = small_cluster.faults.throttle(0, 2.0, window=1.0)
    assert applied.used_cores > 0
    quota, period = node.cgroup.quota()
    assert quota / period == applied.quota_cores
    assert quota == round(applied.used_cores / 2.0 * period)  # half what it used
    # the kernel holds the node's processes back, period after period
    eventually(lambda: _throttled(small_cluster, 0) > before + 10, timeout=20,
               what="node0's processes throttled")
    assert small_cluster.workers[1].cgroup.quota()[0] == -1  # the other node runs free
    small_cluster.faults.unthrottle(0)
    assert node.cgroup.quota()[0] == -1
    with pytest.raises(ValueError):
        small_cluster.faults.throttle(0, 0.5)


def test_a_capped_link_queues_traffic_in_a_token_bucket_both_ways(
        small_cluster: Cluster) -> None:
    faults = small_cluster.faults
    faults.cap_link(1, rate="1mbit", burst="16kb", latency="400ms")
    host, inside = faults.link_qdiscs(1)
    for shown in (host, inside):
        assert re.search(r"qdisc tbf \S+ root .*rate 1Mbit", shown), shown
    a, b = small_cluster.workers
    sink = a.popen([sys.executable, "-c", "import socket; s = socket.create_server(('0.0.0.0', "
                    "7001)); c, _ = s.accept(); n = 0\nwhile d := c.recv(65536): n += len(d)\n"
                    "print(n)"], log=a.dir / "sink.log")
    eventually(lambda: b.run([sys.executable, "-c", "import socket; socket.create_connection("
                              f"('{a.ip}', 7001), timeout=2).sendall(b'x' * 300_000)"])
               .returncode == 0, timeout=60, what="300 kB sent from node1 to node0")
    assert sink.wait(60) == 0
    assert (a.dir / "sink.log").read_text().strip() == "300000"
    stats = b.run(["tc", "-s", "qdisc", "show", "dev", "eth0"]).stdout
    overlimits = int(re.search(r"overlimits (\d+)", stats).group(1))  # type: ignore[union-attr]
    assert overlimits > 0, stats  # packets waited for tokens: the cap acted
    faults.uncap_link(1)
    assert "tbf" not in "".join(faults.link_qdiscs(1))


READ_GPUS = """
import json, sys
from monitor_client._nvml import nvml_probe
probes = [nvml_probe(0), nvml_probe(1)]
print(json.dumps([p.read() for p in probes]), flush=True)
sys.stdin.readline()
print(json.dumps([p.read() for p in probes]), flush=True)
"""


def test_an_xid_and_an_ecc_count_reach_the_clients_nvml_code_on_that_node_only(
        small_cluster: Cluster, tmp_path: Path) -> None:
    import subprocess

    readers = {}
    for node in small_cluster.workers:
        readers[node.index] = subprocess.Popen(
            node.command([sys.executable, "-c", READ_GPUS]), env=small_cluster.env(node),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first = {i: json.loads(r.stdout.readline()) for i, r in readers.items()}  # type: ignore[union-attr]
    for readings in first.values():
        assert [g["xid_count"] for g in readings] == [0.0, 0.0]
        assert [g["ecc_uncorrected_volatile"] for g in readings] == [0.0, 0.0]
    small_cluster.faults.xid(1, code=79, gpu=1)
    small_cluster.faults.ecc(1, count=2, gpu=0)
    after = {}
    for i, r in readers.items():
        r.stdin.write("\n")  # type: ignore[union-attr]
        r.stdin.flush()  # type: ignore[union-attr]
        after[i] = json.loads(r.stdout.readline())  # type: ignore[union-attr]
        r.wait(10)
    gpu0, gpu1 = after[1]
    assert (gpu1["xid_count"], gpu1["xid_last"]) == (1.0, 79.0)
    assert gpu0["xid_count"] == 0.0 and gpu0["ecc_uncorrected_volatile"] == 2.0
    assert gpu1["ecc_uncorrected_volatile"] == 0.0
    for g in after[0]:  # the other node's GPUs are healthy
        assert g["xid_count"] == 0.0 and g["ecc_uncorrected_volatile"] == 0.0


@pytest.fixture(scope="module")
def faulty_job(tmp_path_factory: pytest.TempPathFactory, privileged: None) -> Iterator[dict]:
    """Two nodes of one rank each: node 1's loader slowed from the start, node 0's gradient
    bit-flipped at step 4, node 1's loss NaN at step 8; node 0's rank SIGSTOPped at step 10
    until the harness sees it stopped, then continued."""
    with Cluster(tmp_path_factory.mktemp("faults"), nodes=2) as cluster:
        faults = cluster.faults
        faults.slow_loader(1, 0.3)
        flip = faults.bitflip(0, step=4, bit=30)
        nan = faults.nan(1, step=8)
        job = cluster.elastic_job("faults", steps=16, nproc_per_node=1, checkpoint_every=100,
                                  max_restarts=0, script_args=["--step-time=0.05"])
        job.start()
        job.wait_step(10, timeout=300)
        pid = faults.stop_rank(0)
        state = eventually(lambda: _state(pid) == "T" and "T", timeout=10, what="stopped")
        faults.cont_rank(0)
        codes = job.wait(timeout=300)
        yield {"job": job, "codes": codes, "state": state, "fired": [faults.fired(0),
               faults.fired(1)], "flip": flip, "nan": nan}


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]


def test_a_ranks_own_faults_act_at_their_step_once(faulty_job: dict) -> None:
    job = faulty_job["job"]
    assert faulty_job["codes"] == {0: 0, 1: 0}, job.logs()
    assert faulty_job["state"] == "T"  # SIGSTOP held the rank; SIGCONT let it finish
    steps = {(e["node"], e["step"]): e for e in job.events("step")}
    # the bit flip: node 0's replica leaves node 1's at step 4, not before
    assert steps[(0, 3)]["digest"] == steps[(1, 3)]["digest"]
    assert steps[(0, 4)]["digest"] != steps[(1, 4)]["digest"]
    # the NaN: node 1's loss at step 8, everyone's after the all-reduce spread it
    assert steps[(1, 8)]["loss"] != steps[(1, 8)]["loss"]  # NaN
    assert steps[(0, 8)]["loss"] == steps[(0, 8)]["loss"]
    assert steps[(0, 9)]["loss"] != steps[(0, 9)]["loss"]
    # the slow loader: every batch of node 1 waited at least its 0.3 s
    assert all(steps[(1, s)]["data_seconds"] >= 0.3 for s in range(2, 17))
    fired0, fired1 = faulty_job["fired"]
    assert [(f["id"], f["step"]) for f in fired0] == [(faulty_job["flip"], 4)]
    assert [(f["id"], f["step"]) for f in fired1] == [(faulty_job["nan"], 8)]


class RankLogs:
    """What a job's rank logs say, written by the test: compute seconds per node."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def recent(self, kind: str = "step", tail_bytes: int = 0) -> list[dict]:
        return list(self.events)

    def steps(self, first: int, last: int, compute: dict[int, float]) -> None:
        for step in range(first, last + 1):
            self.events += [{"step": step, "node": node, "compute_seconds": seconds}
                            for node, seconds in compute.items() for _ in range(2)]


def test_a_held_throttle_moves_the_quota_until_the_node_is_as_slow_as_asked(
        small_cluster: Cluster) -> None:
    from tests.netcluster.throttle import Controller, Throttle

    group = small_cluster.workers[1].cgroup
    group.set_quota(0.5)
    held = Throttle(node=1, factor=1.3, used_cores=0.65, quota_cores=0.5)
    logs = RankLogs()
    controller = Controller(held, group, logs, interval=0.05)  # type: ignore[arg-type]
    controller.start()
    try:
        logs.steps(1, 8, {0: 0.010, 1: 0.020})  # node 1 twice as slow: too slow, more CPU
        eventually(lambda: held.history, timeout=10, what="a first update")
        assert held.achieved == 2.0 and held.quota_cores > 0.5
        quota, period = group.quota()
        assert quota / period == held.quota_cores
        raised = held.quota_cores
        logs.steps(9, 16, {0: 0.010, 1: 0.010})  # now not slow at all: less CPU
        eventually(lambda: held.quota_cores < raised, timeout=10, what="the quota lowered")
        assert held.achieved == 1.0
        updates = len(held.history)
        time.sleep(0.3)  # six intervals without a step under the new quota: no update
        assert len(held.history) == updates
    finally:
        controller.stop()
