"""A multi-node job as deploy/kubernetes/README.md scales it out, natively on loopback:
4 nodes x 4 ranks of one run, one sidecar per node, one Prometheus with the repo's rules
(durations compressed: see e2e/cluster.py), a 3-replica Alertmanager cluster with the repo's
routing, Prometheus and every sidecar sending to every replica.

The ranks are real ``monitor_client.Monitor`` instances training tiny real models, one
process per node driving its 4 ranks (tests/e2e/scale_out_node.py says why), the nodes in
lockstep through a gloo all-reduce. Then, in order:

1. rank 13 (node 3) computes 3x longer: ``TrainingRankStraggler`` fires once, naming rank 13,
   a judgement no single sidecar can make (it compares against the median of all 16 ranks);
2. node 2 hangs (its trainer frozen, its sidecar SIGKILLed): the other nodes block in the
   all-reduce, so ``TrainingRunStalled`` fires once for the run and ``MonitorAgentDown``
   once for node 2's sidecar, and the three Alertmanager replicas deliver each just once.

About 90 s, most of it the compressed ``for`` durations.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import (
    AlertmanagerCluster,
    Notifications,
    compressed_rules,
    write_prometheus_config,
)
from tests.e2e.test_stack import Binary, have
from tests.e2e.webhook import Webhook
from tests.eventually import eventually
from tests.sidecar_process import REPO, SidecarProcess, free_port

pytestmark = [pytest.mark.binaries, pytest.mark.slow, pytest.mark.timeout(420)]

NODES, RANKS = 4, 4
PROJECT, RUN = "scale", "ddp-16"
TOKEN = "scale-out-token"
SLOW_RANK, HUNG_NODE = 13, 2  # rank 13 lives on node 3
ALERT_WAIT = 120.0


class Job:
    """Alertmanager cluster, sidecars, Prometheus and node processes, started in that order."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hook = Webhook()
        self.am = AlertmanagerCluster(tmp / "am", self.hook.url)
        env = {"MONITOR_AGENT_TOKEN": TOKEN,
               "MONITOR_AGENT_ALERTING__ALERTMANAGER__URLS": json.dumps(self.am.urls),
               "MONITOR_AGENT_ALERTING__ALERTMANAGER__RESEND_INTERVAL_SECONDS": "5"}
        self.sidecars = [SidecarProcess(tmp / f"node{i}", env=env) for i in range(NODES)]
        self.prom_port = free_port()
        self.prom_url = f"http://127.0.0.1:{self.prom_port}"
        self.prom: Binary | None = None
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.control = tmp / "control"
        self.control.mkdir()

    def instance(self, node: int) -> str:
        return f"127.0.0.1:{self.sidecars[node].port}"

    def start(self) -> None:
        self.am.start()
        with ThreadPoolExecutor(NODES) as pool:  # the sidecars boot in parallel, as nodes do
            list(pool.map(SidecarProcess.start, self.sidecars))
        config = self.tmp / "prometheus.yml"
        write_prometheus_config(config, [self.instance(i) for i in range(NODES)],
                                f"127.0.0.1:{self.prom_port}", self.am.addresses,
                                compressed_rules(self.tmp / "rules"))
        self.prom = Binary(["prometheus", f"--config.file={config}",
                            f"--storage.tsdb.path={self.tmp / 'tsdb'}",
                            f"--web.listen-address=127.0.0.1:{self.prom_port}"],
                           self.tmp / "prometheus.log", self.prom_url + "/-/ready")
        master = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO), str(REPO / "client"), os.environ.get("PYTHONPATH", "")])}
        for node in range(NODES):
            cmd = [sys.executable, str(Path(__file__).with_name("scale_out_node.py")),
                   f"--node={node}", f"--nodes={NODES}", f"--ranks={RANKS}",
                   f"--sidecar={self.sidecars[node].url}", f"--master-port={master}",
                   f"--run-id={RUN}", f"--project={PROJECT}", f"--control={self.control}",
                   f"--token={TOKEN}", f"--slow-rank={SLOW_RANK}"]
            log = (self.tmp / f"node{node}.log").open("wb")
            self.nodes.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        eventually(lambda: self.ranks_seen() == NODES * RANKS, timeout=90, interval=0.5,
                   what="all 16 ranks in Prometheus", context=self.logs)

    def ranks_seen(self) -> int:
        result = self.query(f'count(training_last_step{{run_id="{RUN}"}} > 3)')
        return int(float(result[0]["value"][1])) if result else 0

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = httpx.get(self.prom_url + "/api/v1/query", params={"query": expr}, timeout=10)
        assert resp.status_code == 200, f"{expr}: {resp.text}"
        return resp.json()["data"]["result"]

    def hang(self, node: int) -> None:
        """The node is lost: its trainer freezes mid-collective and its sidecar is gone."""
        self.nodes[node].send_signal(signal.SIGSTOP)
        self.sidecars[node].kill()

    def notifications(self) -> Notifications:
        with self.hook.lock:
            return Notifications(list(self.hook.received))

    def logs(self) -> str:
        nodes = "\n".join((self.tmp / f"node{i}.log").read_text(errors="replace")[-1500:]
                          for i in range(len(self.nodes)))
        prom = self.prom.tail() if self.prom else ""
        return f"{nodes}\n{prom}\n{self.am.logs()}\n{self.notifications().summary()}"

    def stop(self) -> None:
        (self.tmp / "notifications.json").write_text(json.dumps(self.hook.received, indent=1))
        for proc in self.nodes:
            proc.kill()
            proc.wait(10)
        if self.prom is not None:
            self.prom.stop()
        for sidecar in self.sidecars:
            sidecar.stop()
        self.am.stop()
        self.hook.close()


def firing(job: Job, alertname: str, *paths: str) -> bool:
    """``alertname`` has reached every receiver path in ``paths`` (any, when none)."""
    got = {path for path, _ in job.notifications().about(alertname)}
    return set(paths) <= got if paths else bool(got)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    for binary in ("prometheus", "prometheus-alertmanager"):
        if not have(binary):
            pytest.skip(f"{binary} not on PATH: apt-get install prometheus prometheus-alertmanager")
    job = Job(tmp_path_factory.mktemp("job"))
    try:
        job.start()
        yield job
    finally:
        job.stop()


@pytest.fixture(scope="module")
def straggled(job: Job) -> Job:
    (job.control / "slow").touch()
    eventually(lambda: firing(job, "TrainingRankStraggler"), timeout=ALERT_WAIT, interval=0.5,
               what="TrainingRankStraggler at the receiver", context=job.logs)
    return job


@pytest.fixture(scope="module")
def hung(straggled: Job) -> Job:
    job = straggled
    job.hang(HUNG_NODE)
    # A page goes to PagerDuty and on to Slack, which may hold it one group_interval.
    pages = ("/pagerduty", "/slack")
    eventually(lambda: firing(job, "TrainingRunStalled", *pages)
               and firing(job, "MonitorAgentDown", *pages), timeout=ALERT_WAIT, interval=0.5,
               what="TrainingRunStalled and MonitorAgentDown at the receiver", context=job.logs)
    time.sleep(8)  # two peer timeouts more: a late duplicate from another replica would land
    return job


def test_every_rank_reports_through_its_own_nodes_sidecar(job: Job) -> None:
    by_instance = job.query(f'count by (instance) (training_last_step{{run_id="{RUN}"}})')
    assert {s["metric"]["instance"]: s["value"][1] for s in by_instance} == {
        job.instance(i): str(RANKS) for i in range(NODES)}


def test_the_straggler_is_named_once_across_sidecars(straggled: Job) -> None:
    got = straggled.notifications()
    alerts = got.alerts("TrainingRankStraggler")
    assert {a["labels"]["rank"] for a in alerts} == {str(SLOW_RANK)}, got.summary()
    assert len(got.episodes("TrainingRankStraggler")) == 1, got.summary()
    assert {a["labels"]["run_id"] for a in alerts} == {RUN}
    # A warning: the chat receiver, not the pager.
    assert {path for path, _ in got.about("TrainingRankStraggler")} == {"/slack"}


def test_a_hung_node_stalls_the_run_once(hung: Job) -> None:
    got = hung.notifications()
    assert len(got.episodes("TrainingRunStalled")) == 1, got.summary()
    assert {a["labels"]["run_id"] for a in got.alerts("TrainingRunStalled")} == {RUN}
    paths = {path for path, _ in got.about("TrainingRunStalled")}
    assert paths == {"/pagerduty", "/slack"}, got.summary()


def test_the_lost_sidecar_is_reported_down_once(hung: Job) -> None:
    got = hung.notifications()
    down = got.alerts("MonitorAgentDown")
    assert {a["labels"]["instance"] for a in down} == {hung.instance(HUNG_NODE)}, got.summary()
    assert len(got.episodes("MonitorAgentDown")) == 1
    # Its own group (alertname, instance): one page, although three replicas hold it.
    assert len([1 for path, _ in got.about("MonitorAgentDown") if path == "/pagerduty"]) == 1


def test_three_replicas_deliver_each_notification_once(hung: Job) -> None:
    got = hung.notifications()
    assert got.duplicates() == [], got.summary()
    senders = {n["externalURL"] for _, n in got.received}
    assert senders <= set(hung.am.urls)
