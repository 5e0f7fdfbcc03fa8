"""``POST /v1/peer/digests`` (api/peer.py) takes only what its exchange names: a digest or a
finding about a run the exchange's ``runs`` do not list is refused for good, item by item,
and nothing of it is stored or acted on, even for a run this sidecar leads. Over real HTTP,
a real sidecar leading two runs; the door's attacks: tests/reliability/test_peer_hostile.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from monitor_agent.api.body import RETRY_AFTER_S
from monitor_agent.settings import load_settings
from tests.live_server import LiveServer

TOKEN = "write-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NAMES = "run_id: not one of the runs this exchange names"


def _step(run: str, step: int, rank: int, loss: Any = 2.0) -> dict[str, Any]:
    return {"kind": "step", "run_id": run, "rank": rank, "step": step, "time": 1000.0 + step,
            "loss": loss, "grad_norm": 1.0, "attempt": f"{run}-r{rank}"}


def _lead(url: str, run: str) -> None:
    """Node 0's two ranks of a two-node run report here: this sidecar leads the run."""
    cluster = {"node_rank": 0, "nodes": 2, "local_world_size": 2}
    records = [{"kind": "run", "run_id": run, "rank": r, "time": 1000.0, "cluster": cluster,
                "hardware": {"world_size": 4}, "attempt": f"{run}-r{r}"} for r in (0, 1)]
    records += [_step(run, s, r) for s in range(1, 6) for r in (0, 1)]
    r = httpx.post(url + "/v1/records", json={"records": records}, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text


def _ranks(url: str, run: str) -> set[int]:
    got = httpx.get(url + f"/v1/runs/{run}/records", params={"limit": 1000}, headers=AUTH,
                    timeout=30)
    assert got.status_code == 200, got.text
    records = got.json()["records"]
    assert records, got.text
    return {r["rank"] for r in records}


def test_digests_and_findings_of_a_run_the_exchange_does_not_name_are_refused(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings) as srv:
        _lead(srv.url, "job")
        _lead(srv.url, "other")  # led here too: only the exchange's own list decides
        node1 = {"run_id": "job", "node": 1, "ranks": [2, 3], "known_action": 0}
        named = [_step("job", s, r) for s in range(1, 6) for r in (2, 3)]
        unnamed = [_step("other", s, 2) for s in range(1, 6)] + [_step("other", 6, 2, "NaN")]
        finding = {"type": "nan_inf", "severity": "critical", "run_id": "other", "step": 6,
                   "rank": 2, "message": "loss is nan", "evidence": {}}
        body = {"sidecar": "node-1", "runs": [node1], "records": named + unnamed,
                "findings": [{"flags": 0, "finding": finding}]}
        r = httpx.post(srv.url + "/v1/peer/digests", json=body, timeout=30, headers={
            "Authorization": f"Bearer {settings.peer_token_value()}"})
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["accepted"] == len(named) and got["findings"] == 0, got
        assert [x["index"] for x in got["rejected"]] == list(
            range(len(named), len(named) + len(unnamed))), got
        assert all(x["reason"].startswith(NAMES) for x in got["rejected"]), got
        assert [x["index"] for x in got["rejected_findings"]] == [0], got
        assert got["rejected_findings"][0]["reason"].startswith(NAMES), got
        assert set(got["runs"]) == {"job"}, got
        assert _ranks(srv.url, "job") == {0, 1, 2, 3}
        assert _ranks(srv.url, "other") == {0, 1}  # nothing of rank 2 stored


def _exchange(url: str, settings: Any, body: dict[str, Any], source: str = "127.0.0.1"
              ) -> httpx.Response:
    """One exchange as a node sidecar at ``source`` (a loopback address of its own) makes it."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as client:
        return client.post(url + "/v1/peer/digests", json=body, headers={
            "Authorization": f"Bearer {settings.peer_token_value()}"})


def _node1(records: list[dict[str, Any]], findings: list[dict[str, Any]] | None = None,
           sidecar: Any = "node-1") -> dict[str, Any]:
    return {"sidecar": sidecar, "records": records, "findings": findings or [],
            "runs": [{"run_id": "job", "node": 1, "ranks": [2, 3], "known_action": 0}]}


def _nan_finding(rank: int) -> dict[str, Any]:
    return {"flags": 0, "finding": {"type": "nan_inf", "severity": "critical", "run_id": "job",
                                    "step": 6, "rank": rank, "message": "loss is nan",
                                    "evidence": {}}}


def test_a_finding_is_taken_only_from_the_address_that_forwards_its_ranks(tmp_path: Path):
    """The door marks each exchange with the address it connects from: a second caller that
    holds the link's credential and takes node 1's sidecar id, but speaks from another
    machine, cannot make the leader act on the ranks node 1 forwards."""
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings) as srv:
        _lead(srv.url, "job")
        records = [_step("job", s, r) for s in range(1, 6) for r in (2, 3)]
        first = _exchange(srv.url, settings, _node1(records))
        assert first.status_code == 200 and first.json()["accepted"] == len(records), first.text
        forged = _exchange(srv.url, settings, _node1([], [_nan_finding(2)]), "127.0.0.2")
        assert forged.status_code == 200 and forged.json()["findings"] == 0, forged.text
        assert "is forwarded by another node sidecar (node-1@127.0.0.1)" in \
            forged.json()["rejected_findings"][0]["reason"], forged.text
        honest = _exchange(srv.url, settings, _node1([], [_nan_finding(2)]))
        assert honest.status_code == 200 and honest.json()["findings"] == 1, honest.text


def test_an_exchange_whose_every_item_is_refused_says_the_first_and_how_many_more(
        tmp_path: Path):
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings) as srv:
        _lead(srv.url, "job")
        bad = [{**_step("job", s, 2), "step": -s} for s in (1, 2, 3)]
        r = _exchange(srv.url, settings, _node1(bad))
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert detail.startswith("nothing taken: record 0: step") and \
            detail.endswith(" (and 2 more)"), detail
        one = _exchange(srv.url, settings, _node1([], [{"flags": 999, "finding": {}}]))
        assert one.status_code == 422, one.text
        assert one.json()["detail"] == \
            "nothing taken: finding 0: flags: must be an integer in 0..255", one.text


def test_an_exchange_without_a_sidecar_id_is_refused_saying_so(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings) as srv:
        for sidecar in (None, "", "x" * 65, 7):
            r = _exchange(srv.url, settings, _node1([], sidecar=sidecar))
            assert r.status_code == 400, r.text
            assert r.json()["detail"] == "sidecar: must be a string of 1-64 characters", r.text


def test_a_leader_that_cannot_store_tells_its_node_sidecars_to_retry(tmp_path: Path):
    """Not ready (a full disk, corrupt storage: api/readiness.py) is a 503 with Retry-After,
    which the node sidecar's link reads as "keep the items and send them again"."""
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings) as srv:
        _lead(srv.url, "job")
        srv.app.state.services.readiness.set("storage: database or disk is full")
        r = _exchange(srv.url, settings, _node1([_step("job", 1, 2)]))
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == str(RETRY_AFTER_S)
        assert r.json()["detail"] == ("not ready: storage: database or disk is full; "
                                      "retry later"), r.text


def test_the_leader_counts_what_its_node_sidecars_sent_by_kind(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings) as srv:
        _lead(srv.url, "job")
        records = [_step("job", s, r) for s in range(1, 6) for r in (2, 3)]
        r = _exchange(srv.url, settings, _node1(records, [_nan_finding(2)]))
        assert r.status_code == 200 and r.json()["findings"] == 1, r.text
        text = httpx.get(srv.url + "/metrics", timeout=30).text
        for kind, n in (("digest", len(records)), ("finding", 1), ("heartbeat", 1)):
            assert f'monitor_agent_peer_items_total{{kind="{kind}"}} {float(n)}' in text, kind
