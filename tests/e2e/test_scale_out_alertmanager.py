"""Alertmanager in HA, as deploy/kubernetes/README.md runs it: three replicas gossiping on
loopback, the repo's routing, and two sidecars whose Alertmanager channel lists all three
URLs. (Prometheus sending to all three is proven in test_scale_out_job.py.)

The ranks are real ``monitor_client.Monitor`` instances in this process (no model: the
sidecar's NaN detector needs only the loss). A NaN on rank 1 of a run pages once; the
replica that delivered the page is SIGKILLed mid-incident; the incident's resolve still
arrives, once; and while that replica stays dead a second run's NaN pages and resolves
once too, the sidecars counting no failed delivery.

About 60 s: mostly the compressed group_interval (15 s) that carries each resolve.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from monitor_client import Monitor, MonitorSettings
from tests.e2e.cluster import AlertmanagerCluster, Notifications
from tests.e2e.test_stack import have
from tests.e2e.webhook import Webhook
from tests.eventually import eventually
from tests.sidecar_process import REPO, SidecarProcess

pytestmark = [pytest.mark.binaries, pytest.mark.slow, pytest.mark.timeout(300)]

PROJECT, FIRST, SECOND = "ha", "ha-first", "ha-second"
TOKEN = "ha-token"
RESOLVE_AFTER = "3s"  # the rule's 10 min, so the resolve comes within the test
WAIT = 60.0


def sidecar_rules(path: Path) -> Path:
    """The packaged default rules, with TrainingNanInf resolving after ``RESOLVE_AFTER``."""
    rules = yaml.safe_load((REPO / "monitor_agent" / "default_rules.yaml").read_text())
    for rule in rules["rules"]:
        if rule["name"] == "TrainingNanInf":
            rule["resolve_after"] = RESOLVE_AFTER
    path.write_text(yaml.safe_dump(rules))
    return path


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.hook = Webhook()
        self.am = AlertmanagerCluster(tmp / "am", self.hook.url)
        env = {"MONITOR_AGENT_TOKEN": TOKEN,
               "MONITOR_AGENT_ALERTING__RULES_FILE": str(sidecar_rules(tmp / "rules.yaml")),
               "MONITOR_AGENT_ALERTING__ALERTMANAGER__URLS": json.dumps(self.am.urls),
               "MONITOR_AGENT_ALERTING__ALERTMANAGER__RESEND_INTERVAL_SECONDS": "2"}
        self.sidecars = [SidecarProcess(tmp / f"node{i}", env=env) for i in range(2)]
        self.tmp = tmp

    def start(self) -> None:
        self.am.start()
        for sidecar in self.sidecars:
            sidecar.start()

    def notifications(self) -> Notifications:
        with self.hook.lock:
            return Notifications(list(self.hook.received))

    def notified(self, run: str, status: str) -> list[tuple[str, dict]]:
        return [(path, n) for path, n in self.notifications().about("TrainingNanInf", status)
                if any(a["labels"]["run_id"] == run for a in n["alerts"])]

    def wait_notified(self, run: str, status: str) -> list[tuple[str, dict]]:
        # Critical: PagerDuty and, through `continue`, Slack.
        eventually(lambda: {p for p, _ in self.notified(run, status)} == {"/pagerduty", "/slack"},
                   timeout=WAIT, interval=0.5,
                   what=f"{status} TrainingNanInf of {run} at both receivers",
                   context=lambda: f"{self.notifications().summary()}\n{self.am.logs()}")
        return self.notified(run, status)

    def stop(self) -> None:
        (self.tmp / "notifications.json").write_text(json.dumps(self.hook.received, indent=1))
        for sidecar in self.sidecars:
            sidecar.stop()
        self.am.stop()
        self.hook.close()


def train(cluster: Cluster, run: str, nan_rank: int, steps: int = 6) -> None:
    """Two ranks, one per sidecar, ``steps`` healthy steps with one NaN loss on ``nan_rank``."""
    mons = [Monitor(sc.url, PROJECT, run_id=run, token=TOKEN,
                    settings=MonitorSettings(rank=rank, world_size=2,
                                             spool_dir=cluster.tmp / "spool", install_hooks=False))
            for rank, sc in enumerate(cluster.sidecars)]
    for step in range(1, steps + 1):
        for rank, mon in enumerate(mons):
            nan = rank == nan_rank and step == steps // 2
            mon.log_step(step, loss=math.nan if nan else 2.0 - step / 100, tokens=64)
    for mon in mons:
        assert mon.flush(10)


def sent_and_failed(sidecar: SidecarProcess) -> tuple[float, float]:
    text = httpx.get(sidecar.url + "/metrics", timeout=10).text
    found = dict.fromkeys(("sent", "failed"), 0.0)
    for outcome, value in re.findall(
            r'monitor_agent_notifications_total\{channel="alertmanager",outcome="(\w+)"\} (\S+)',
            text):
        found[outcome] = float(value)
    return found["sent"], found["failed"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not have("prometheus-alertmanager"):
        pytest.skip("prometheus-alertmanager not on PATH: apt-get install prometheus-alertmanager")
    cluster = Cluster(tmp_path_factory.mktemp("ha"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def incident(cluster: Cluster) -> dict:
    """The first run's NaN paged; the replica that paged is killed; the resolve arrived."""
    train(cluster, FIRST, nan_rank=1)
    pages = [n for p, n in cluster.wait_notified(FIRST, "firing") if p == "/pagerduty"]
    assert len(pages) == 1, cluster.notifications().summary()
    page = pages[0]
    # Its notification log reaches the peers by gossip (every 100 ms here): killed before
    # that, a peer sends the page too, which is Alertmanager HA's at-least-once by design,
    # and on a loaded CI machine the log can lag; give it ten gossip rounds first.
    time.sleep(1.0)
    killed = cluster.am.urls.index(page["externalURL"])
    cluster.am.kill(killed)
    before = [sent_and_failed(sc) for sc in cluster.sidecars]
    cluster.wait_notified(FIRST, "resolved")
    train(cluster, SECOND, nan_rank=0)
    cluster.wait_notified(SECOND, "firing")
    cluster.wait_notified(SECOND, "resolved")
    time.sleep(8)  # two peer timeouts and more: a duplicate from another replica would land
    return {"killed": page["externalURL"], "before": before,
            "after": [sent_and_failed(sc) for sc in cluster.sidecars]}


def test_a_nan_on_one_rank_pages_once_through_three_replicas(cluster: Cluster, incident: dict) -> None:
    for path in ("/pagerduty", "/slack"):
        pages = [n for p, n in cluster.notified(FIRST, "firing") if p == path]
        assert len(pages) == 1, cluster.notifications().summary()
    alert = next(a for a in cluster.notifications().alerts("TrainingNanInf")
                 if a["labels"]["run_id"] == FIRST)
    assert alert["labels"]["source"] == "monitor-agent"
    assert alert["labels"]["severity"] == "critical"


def test_the_resolve_arrives_once_after_the_paging_replica_died(cluster: Cluster,
                                                               incident: dict) -> None:
    for path in ("/pagerduty", "/slack"):
        resolves = [n for p, n in cluster.notified(FIRST, "resolved") if p == path]
        assert len(resolves) == 1, cluster.notifications().summary()
        assert resolves[0]["externalURL"] != incident["killed"]


def test_sidecars_keep_delivering_while_a_replica_is_down(cluster: Cluster, incident: dict) -> None:
    for path in ("/pagerduty", "/slack"):
        for status in ("firing", "resolved"):
            got = [n for p, n in cluster.notified(SECOND, status) if p == path]
            assert len(got) == 1, cluster.notifications().summary()
            assert got[0]["externalURL"] != incident["killed"]
    # Every send reached at least one live replica: none counted as failed.
    assert [failed for _, failed in incident["before"] + incident["after"]] == [0] * 4
    assert sum(s for s, _ in incident["after"]) > sum(s for s, _ in incident["before"])


def test_no_notification_is_delivered_twice(cluster: Cluster, incident: dict) -> None:
    got = cluster.notifications()
    assert got.duplicates() == [], got.summary()
    assert len(got.episodes("TrainingNanInf")) == 2  # one per run
