"""One run, one brain, on real parts: two real sidecars on loopback (node 0's, the run's
leader, and node 1's), each paging its own local Slack receiver, fed the records a
four-rank job's clients send (two ranks per node, each to its own node's sidecar).

The multi-process proofs with real torchrun nodes are in tests/e2e/test_multi_node.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from monitor_agent.serving.embedded import EmbeddedServer, free_port
from monitor_agent.settings import Settings
from tests.eventually import eventually
from tests.receivers import Receiver
from tests.ticks import sample, settled

pytestmark = pytest.mark.timeout(120)
RUN = "job"
CLUSTER = {"peer_timeout_seconds": 0.5, "heartbeat_seconds": 0.2}
STOP_ON_NAN = """
routes: {page: [slack]}
rules:
  - {name: StopOnNaN, match: {types: [nan_inf]}, severity: critical, fingerprint: [],
     action: stop}
"""


@contextmanager
def sidecar(tmp: Path, slack: Receiver, port: int | None = None,
            rules: str | None = None, **cluster: Any) -> Iterator[EmbeddedServer]:
    alerting: dict[str, Any] = {"group_wait_seconds": 0.05, "slack": {
        "webhook_url": slack.url + "/hook", "min_interval_seconds": 0}}
    if rules is not None:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "rules.yaml").write_text(rules)
        alerting["rules_file"] = str(tmp / "rules.yaml")
    settings = Settings(port=port or free_port(), data_dir=tmp, alerting=alerting,
                        cluster={**CLUSTER, **cluster})
    with EmbeddedServer(settings) as srv:
        yield srv


def _post(url: str, records: list[dict]) -> dict:
    resp = httpx.post(url + "/v1/records", content=json.dumps({"records": records}),
                      headers={"content-type": "application/json"}, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _run_record(rank: int) -> dict:
    node = rank // 2
    return {"kind": "run", "run_id": RUN, "rank": rank, "time": 1.0, "attempt": f"t{rank}",
            "hardware": {"reporting_ranks": 4, "world_size": 4},
            "labels": {"hostname": f"gpu-node-{node}"},
            "cluster": {"node_rank": node, "nodes": 2, "local_world_size": 2}}


def _step(rank: int, step: int, nan_from: int | None = None) -> dict:
    """Rank 2's input goes NaN at ``nan_from``: its loss is NaN there, every rank's reduced
    gradient too, and every loss after it."""
    bad = nan_from is not None and (step > nan_from or (step == nan_from and rank == 2))
    grad_bad = nan_from is not None and step >= nan_from
    return {"kind": "step", "run_id": RUN, "rank": rank, "step": step,
            "time": 1000.0 + step, "attempt": f"t{rank}", "loss": "NaN" if bad else 2.0,
            "grad_norm": "NaN" if grad_bad else 1.0,
            "layers": {"w": {"grad_norm": 0.1}} if step % 5 == 0 else None}


def _job(node0: str, node1: str, steps: range, nan_from: int | None = None) -> None:
    for step in steps:
        for rank in range(4):
            _post(node0 if rank < 2 else node1,
                  [_run_record(rank)] * (step == steps.start) + [_step(rank, step, nan_from)])


def _texts(slack: Receiver) -> list[str]:
    return [r.json["text"] for r in slack.requests if isinstance(r.json, dict)]


def test_a_nan_on_node_1_is_one_page_from_the_leader_naming_rank_and_host(tmp_path):
    port = free_port()
    with Receiver("slack") as slack0, Receiver("slack") as slack1, \
            sidecar(tmp_path / "n0", slack0, port=port) as lead, \
            sidecar(tmp_path / "n1", slack1, leader_hosts=[f"127.0.0.1:{port}"]) as node:
        # Node 1's sidecar follows the URL its ranks' clients name (MASTER_ADDR + port):
        # on one host the sidecars' ports differ, so it is listed (cluster.leader_hosts).
        lead_url = lead.url
        for rank in (2, 3):
            _post(node.url, [{**_run_record(rank), "cluster": {
                "node_rank": 1, "nodes": 2, "local_world_size": 2, "leader_url": lead_url}}])
        _job(lead.url, node.url, range(1, 31), nan_from=20)
        pages = eventually(lambda: [t for t in _texts(slack0) if "TrainingNanInf" in t], timeout=20)
        # Anything else would have been sent by now: node 1 forwarded all it had, and
        # each sidecar's ticks ran after it and its outbox is empty.
        eventually(lambda: sample(node.url, "monitor_agent_uplink_queued") == 0, timeout=20)
        for url in (node.url, lead.url):
            settled(url)
        exposed = [httpx.get(u + "/metrics", timeout=5).text for u in (lead.url, node.url)]
        detail = httpx.get(f"{lead.url}/v1/runs/{RUN}", timeout=5).json()
    assert len(pages) == 1 and not _texts(slack1), (pages, _texts(slack1))
    # The leader judges and charts every rank, but each rank is exposed once, by its node's
    # sidecar: Prometheus would count the others twice.
    assert sorted(detail["ranks"]) == ["0", "1", "2", "3"]
    loss = 'training_loss{project="",run_id="job",rank="%d"}'
    assert [loss % r in exposed[0] for r in range(4)] == [True, True, False, False]
    assert [loss % r in exposed[1] for r in range(4)] == [False, False, True, True]
    assert "NaN first on rank 2 (host gpu-node-1) at step 20" in pages[0]
    assert "ranks 0, 1, 3 followed at step 20" in pages[0]


def test_the_leaders_decision_reaches_node_1_under_the_same_id(tmp_path):
    with Receiver("slack") as slack0, Receiver("slack") as slack1, \
            sidecar(tmp_path / "n0", slack0, rules=STOP_ON_NAN) as lead, \
            sidecar(tmp_path / "n1", slack1, rules=STOP_ON_NAN, leader_url=lead.url) as node:
        _job(lead.url, node.url, range(1, 26), nan_from=20)
        leader = httpx.get(f"{lead.url}/v1/runs/{RUN}/actions", timeout=5).json()
        got = eventually(lambda: httpx.get(f"{node.url}/v1/runs/{RUN}/actions",
                                            timeout=5).json()["actions"], timeout=20)
    [stop] = leader["actions"]
    assert stop["id"] == 1 and stop["action"] == "stop"
    assert [(a["id"], a["action"], a["message"]) for a in got] == \
        [(1, "stop", stop["message"])]
    assert not [t for t in _texts(slack1) if "FIRING" in t]  # node 1 decided and paged nothing


def test_with_the_leader_away_node_1_pages_its_partial_view_and_takes_no_action(tmp_path):
    port = free_port()
    leader_url = f"http://127.0.0.1:{port}"
    with Receiver("slack") as slack0, Receiver("slack") as slack1, \
            sidecar(tmp_path / "n1", slack1, rules=STOP_ON_NAN, leader_url=leader_url) as node:
        for step in range(1, 26):
            _post(node.url, [_run_record(2), _run_record(3)] * (step == 1)
                  + [_step(r, step, nan_from=20) for r in (2, 3)])
        pages = eventually(lambda: [t for t in _texts(slack1) if "StopOnNaN" in t], timeout=20)
        assert len(pages) == 1, _texts(slack1)
        assert "[partial view: the run's leader " + leader_url in pages[0]
        # Which of the episode's findings the page carries (the decision naming rank 2 first,
        # or its persistence milestone) depends on when the link was judged lost: its rank.
        assert "rank 2" in pages[0] and "nan" in pages[0]
        actions = httpx.get(f"{node.url}/v1/runs/{RUN}/actions", timeout=5).json()
        assert actions["actions"] == []  # no decision on a partial view
        # The leader comes back, its own ranks' clients send their run records again (a
        # leader takes a node's digests only for runs its own node 0 ranks placed there):
        # node 1 catches it up, and it pages nothing again.
        with sidecar(tmp_path / "n0", slack0, port=port, rules=STOP_ON_NAN) as lead:
            _post(lead.url, [_run_record(0), _run_record(1)])
            told = eventually(lambda: [a for a in httpx.get(
                f"{lead.url}/v1/alerts", timeout=5).json()["alerts"]
                if a["alertname"] == "StopOnNaN"], timeout=20)
            queued = eventually(lambda: httpx.get(node.url + "/metrics", timeout=5).text
                                 .count("monitor_agent_uplink_queued 0.0"), timeout=20)
            # Node 1's page is the leader's incident now: it closes quietly here, so the
            # one resolve the incident gets is the leader's.
            handed = eventually(lambda: [a["state"] for a in httpx.get(
                f"{node.url}/v1/alerts", timeout=5).json()["alerts"]] == ["resolved"], timeout=20)
            for url in (node.url, lead.url):  # a page from either would have been sent now
                settled(url)
    assert told and told[0]["state"] == "firing" and queued and handed
    assert not [t for t in _texts(slack0) if "FIRING" in t], _texts(slack0)
    assert not [t for t in _texts(slack1) if "RESOLVED" in t], _texts(slack1)


def test_a_leader_url_that_reaches_this_very_sidecar_judges_the_run_here(tmp_path):
    port = free_port()
    with Receiver("slack") as slack, \
            sidecar(tmp_path, slack, port=port, leader_url=f"http://127.0.0.1:{port}") as srv:
        for step in range(1, 31):
            _post(srv.url, [_run_record(r) for r in (2, 3)] * (step == 1)
                  + [_step(r, step, nan_from=20) for r in (2, 3)])
        pages = eventually(lambda: [t for t in _texts(slack) if "TrainingNanInf" in t], timeout=20)
        settled(srv.url)  # a second page would have been sent by now
    assert len(pages) == 1 and "partial view" not in pages[0], pages
