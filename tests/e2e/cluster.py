"""The scale-out pieces of deploy/kubernetes/README.md, natively on loopback, for the
test_scale_out_* tests: an Alertmanager cluster of three gossiping replicas with the repo's
routing, Prometheus with the repo's rules on a compressed clock, and what the receiver got.

Time compression: the repo's rules wait minutes (``for: 5m``, ``[5m]`` windows, a 10 min
stall floor). ``compressed_rules`` writes a copy with every duration of the rules divided by
the same factor, so every rule keeps its shape (a window still holds many scrapes, ``for``
still outlasts a flapping scrape) and the tests run in about a minute. Nothing else changes.

Example::

    am = AlertmanagerCluster(tmp, hook.url, replicas=3).start()
    write_prometheus_config(tmp / "prometheus.yml", sidecars, prom, am.addresses, rules)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.e2e.test_stack import DEPLOY, Binary
from tests.eventually import eventually
from tests.sidecar_process import free_port

# Seconds of the repo's clock per second of the test's: 5m windows become 15 s, for: 1m 3 s,
# the 10 min stall floor 30 s. A 2 s scrape still leaves 7 samples in the shortest window.
COMPRESSION = 20
SCRAPE = "2s"
_DURATION = re.compile(r"(\d+)([smh])")
_SECONDS = {"s": 1, "m": 60, "h": 3600}
# The one bare number of seconds in the rules: TrainingRunStalled's 10 min floor.
_STALL_FLOOR = re.compile(r"\b600\b")


def _compress(duration: str, factor: float) -> str:
    seconds = sum(int(n) * _SECONDS[u] for n, u in _DURATION.findall(duration))
    return f"{max(int(seconds / factor), 1)}s"


def compressed_rules(out: Path, factor: float = COMPRESSION, windows: bool = True) -> Path:
    """deploy/prometheus/rules/*.yml with every duration divided by ``factor``, into ``out``.

    ``windows=False`` keeps the range windows (``[5m]``) as they are: for data fed once, a
    rate over a compressed window falls to zero before the test reads it."""
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted((DEPLOY / "prometheus" / "rules").glob("*.yml")):
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = _compress(rule["for"], factor)
                expr = rule["expr"]
                if windows:
                    expr = re.sub(r"\[(\w+)\]", lambda m: f"[{_compress(m[1], factor)}]", expr)
                rule["expr"] = _STALL_FLOOR.sub(str(int(600 / factor)), expr)
        (out / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def write_prometheus_config(path: Path, sidecars: list[str], prom: str, alertmanagers: list[str],
                            rules: Path | None) -> None:
    """deploy/prometheus/prometheus.yml with loopback targets, every Alertmanager replica
    listed (as the README says: replicas, not a load balancer) and short intervals."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval=SCRAPE, evaluation_interval="1s")
    config["rule_files"] = [str(rules / "*.yml")] if rules else []
    config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = alertmanagers
    targets = {"monitor-agent": sidecars, "prometheus": [prom], "alertmanager": alertmanagers}
    for job in config["scrape_configs"]:
        job.update(scrape_interval=SCRAPE, scrape_timeout=SCRAPE)
        job["static_configs"][0]["targets"] = targets[job["job_name"]]
    path.write_text(yaml.safe_dump(config))


def alertmanager_config(path: Path, hook: str) -> None:
    """deploy/alertmanager/alertmanager.yml, routing and inhibition untouched; each receiver
    becomes a webhook at ``hook/<receiver name>`` (structured alerts, not Slack text) and
    the grouping timers are compressed like the rules.

    group_interval stays well above 2 x peer_timeout (15 s against 6 s here, 5 min against
    30 s by default): a replica checks the notification log ``position x peer_timeout``
    after its flush began, so with a shorter group_interval it compares its old group state
    with a newer notification from a peer and sends the old one again
    (prometheus/alertmanager#3551). A 1 s group_interval did exactly that in this test."""
    config = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    config["templates"] = [str(DEPLOY / "alertmanager" / "templates" / "*.tmpl")]
    route = config["route"]
    route.update(group_wait=_compress(route["group_wait"], COMPRESSION),
                 group_interval=_compress(route["group_interval"], COMPRESSION))
    for receiver in config["receivers"]:
        if receiver.pop("slack_configs", None) or receiver.pop("pagerduty_configs", None):
            receiver["webhook_configs"] = [{"url": f"{hook}/{receiver['name']}",
                                            "send_resolved": True}]
    path.write_text(yaml.safe_dump(config))


class AlertmanagerCluster:
    """``replicas`` prometheus-alertmanager processes gossiping on loopback.

    ``peer_timeout`` is how long replica N waits (times N) for a peer's notification log
    before it sends itself: it must outlast gossip on a loaded machine, so it is 3 s here
    rather than 15 s; the rest of the cluster timers are shortened to match.
    """

    def __init__(self, tmp: Path, hook: str, replicas: int = 3) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.config = tmp / "alertmanager.yml"
        alertmanager_config(self.config, hook)
        self.web = [free_port() for _ in range(replicas)]
        self.gossip = [free_port() for _ in range(replicas)]
        self.procs: list[Binary | None] = [None] * replicas

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.web]

    @property
    def urls(self) -> list[str]:
        return [f"http://{a}" for a in self.addresses]

    def args(self, i: int) -> list[str]:
        peers = [f"--cluster.peer=127.0.0.1:{p}" for j, p in enumerate(self.gossip) if j != i]
        return ["prometheus-alertmanager", f"--config.file={self.config}",
                f"--storage.path={self.tmp / f'am{i}'}",
                f"--web.listen-address={self.addresses[i]}",
                f"--web.external-url=http://{self.addresses[i]}",
                f"--cluster.listen-address=127.0.0.1:{self.gossip[i]}",
                f"--cluster.advertise-address=127.0.0.1:{self.gossip[i]}", *peers,
                "--cluster.peer-timeout=3s", "--cluster.settle-timeout=2s",
                "--cluster.gossip-interval=100ms", "--cluster.pushpull-interval=5s",
                "--cluster.probe-interval=500ms", "--cluster.probe-timeout=500ms",
                "--cluster.reconnect-interval=2s"]

    def start(self) -> AlertmanagerCluster:
        for i in range(len(self.web)):
            self.procs[i] = Binary(self.args(i), self.tmp / f"am{i}.log",
                                   f"{self.urls[i]}/-/ready")
        eventually(lambda: all(len(self.peers(i)) == len(self.web) for i in range(len(self.web))),
                   timeout=30, interval=0.5, what="every replica to see every peer",
                   context=self.logs)
        return self

    def peers(self, i: int) -> list[dict[str, Any]]:
        status = httpx.get(f"{self.urls[i]}/api/v2/status", timeout=5).json()
        return status["cluster"].get("peers") or []

    def kill(self, i: int) -> None:
        """SIGKILL: the replica vanishes mid-incident, no goodbye to its peers."""
        proc = self.procs[i]
        assert proc is not None
        proc.proc.kill()
        proc.proc.wait(10)
        self.procs[i] = None

    def logs(self) -> str:
        return "\n".join(p.tail() for p in self.procs if p is not None)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None:
                proc.stop()


class Notifications:
    """What the receiver got from Alertmanager, alert by alert."""

    def __init__(self, received: Iterable[tuple[str, dict[str, Any]]]) -> None:
        self.received = list(received)

    def about(self, alertname: str, status: str = "firing") -> list[tuple[str, dict[str, Any]]]:
        """(receiver path, notification) pairs that carry ``alertname`` with ``status``."""
        return [(path, n) for path, n in self.received
                if any(a["labels"]["alertname"] == alertname and a["status"] == status
                       for a in n["alerts"])]

    def alerts(self, alertname: str) -> list[dict[str, Any]]:
        return [a for _, n in self.received for a in n["alerts"]
                if a["labels"]["alertname"] == alertname]

    def episodes(self, alertname: str) -> set[tuple[str, str]]:
        """Distinct (fingerprint, startsAt): one per time the alert started firing."""
        return {(a["fingerprint"], a["startsAt"]) for a in self.alerts(alertname)}

    def duplicates(self) -> list[str]:
        """Notifications delivered twice: the same group in the same state, to the same
        receiver. Two replicas both sending is exactly this (their externalURL differs)."""
        seen: dict[str, int] = {}
        for path, n in self.received:
            state = sorted((a["fingerprint"], a["status"], a["startsAt"]) for a in n["alerts"])
            key = json.dumps([path, n["groupKey"], n["status"], state])
            seen[key] = seen.get(key, 0) + 1
        return [key for key, count in seen.items() if count > 1]

    def summary(self) -> str:
        return "\n".join(f"{path} {n['status']} from {n.get('externalURL')}: " + ", ".join(
            f"{a['labels']['alertname']}/{a['status']}/{a['labels'].get('rank', '')}"
            f"{a['labels'].get('instance', '')}" for a in n["alerts"])
            for path, n in self.received)
