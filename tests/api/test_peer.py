"""``POST /v1/peer/digests`` (api/peer.py) takes only what its exchange names: a digest or a
finding about a run the exchange's ``runs`` do not list is refused for good, item by item,
and nothing of it is stored or acted on, even for a run this sidecar leads. Over real HTTP,
a real sidecar leading two runs; the door's attacks: tests/reliability/test_peer_hostile.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

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
    # No tick within the test: a tick whose write succeeds clears what the test sets.
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN, tick_interval_seconds=60)
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


def _raw(url: str, settings: Any, body: bytes, encoding: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {settings.peer_token_value()}",
               "Content-Type": "application/json"}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    return httpx.post(url + "/v1/peer/digests", content=body, headers=headers, timeout=30)


RUN = {"run_id": "job", "node": 1, "ranks": [2, 3], "known_action": 0}
LINK = {"address": "10.0.0.3", "rtt_ms": 0.4, "rttvar_ms": 0.2, "connections": 1,
        "retransmits": 0}
BAD_ENVELOPES: list[tuple[Any, int, str]] = [
    ([], 400, 'body must be {"sidecar": ..., "runs": [...], "records": [...], '
              '"findings": [...]}'),
    ({"sidecar": "n", "runs": [RUN], "records": 7}, 400,
     "records: must be a list of records"),
    ({"sidecar": "n", "runs": [RUN], "findings": {}}, 400, "findings: must be a list"),
    ({"sidecar": "n\x07", "runs": [RUN]}, 400,
     "sidecar: contains a control character ('\\x07') at 1"),
    ({"sidecar": "n", "runs": {}}, 400, "runs: must be a list of at most 10000 runs"),
    ({"sidecar": "n", "runs": [7]}, 400, "runs[0]: must be an object"),
    ({"sidecar": "n", "runs": [{**RUN, "ranks": 2}]}, 400, "runs[0].ranks: must be a list"),
    ({"sidecar": "n", "runs": [{**RUN, "run_id": "a b"}]}, 400,
     "runs[0].run_id: not a run id (docs/format.md)"),
    ({"sidecar": "n", "runs": [{**RUN, "node": True}]}, 400,
     "runs[0].node: must be an integer in -1..1000000"),
    ({"sidecar": "n", "runs": [{**RUN, "known_action": -1}]}, 400,
     "runs[0].known_action: must be an integer in 0..4611686018427387904"),
    ({"sidecar": "n", "runs": [{**RUN, "host": "a\x00"}]}, 400,
     "runs[0].host: contains a control character ('\\x00') at 1"),
    # A node's TCP figures (cluster/tcp_probe.py): every field bounded.
    ({"sidecar": "n", "runs": [RUN], "links": [LINK] * 257}, 400,
     "links: must be a list of at most 256 addresses"),
    ({"sidecar": "n", "runs": [RUN], "links": [{**LINK, "address": "node-2"}]}, 400,
     "links[0.address]: Value error, not an IP address"),
    ({"sidecar": "n", "runs": [RUN], "links": [{**LINK, "rtt_ms": -1}]}, 400,
     "links[0.rtt_ms]: Input should be greater than or equal to 0"),
    ({"sidecar": "n", "runs": [RUN], "links": [{**LINK, "sending_ms": 1e9}]}, 400,
     "links[0.sending_ms]: Input should be less than or equal to 600000"),
    ({"sidecar": "n", "runs": [RUN], "links": [{**LINK, "sending_ms": "5"}]}, 400,
     "links[0.sending_ms]: Input should be a valid number"),
    ({"sidecar": "n", "runs": [RUN], "links": [LINK, {**LINK, "rtt_ms": 2.0}]}, 400,
     "links: an address listed twice"),
]


@pytest.mark.parametrize("body,status,reason", BAD_ENVELOPES,
                         ids=[r[:30] for _, _, r in BAD_ENVELOPES])
def test_a_malformed_exchange_is_refused_with_its_reason(tmp_path: Path, body: Any,
                                                        status: int, reason: str):
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings) as srv:
        r = _raw(srv.url, settings, json.dumps(body).encode())
        assert (r.status_code, r.json()["detail"]) == (status, reason), r.text


def test_an_exchange_comes_gzipped_or_plain_and_nothing_else(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings) as srv:
        _lead(srv.url, "job")
        body = json.dumps(_node1([_step("job", s, 2) for s in range(1, 4)])).encode()
        zipped = _raw(srv.url, settings, gzip.compress(body), "GZip")
        assert zipped.status_code == 200 and zipped.json()["accepted"] == 3, zipped.text
        plain = _raw(srv.url, settings, body, "identity")
        assert plain.status_code == 200 and plain.json()["duplicates"] == 3, plain.text
        other = _raw(srv.url, settings, body, "br")
        assert (other.status_code, other.json()["detail"]) == (
            415, "unsupported Content-Encoding 'br'; use gzip or none"), other.text
        broken = _raw(srv.url, settings, b'{"sidecar": ')
        assert broken.status_code == 400, broken.text
        assert broken.json()["detail"].startswith("body is not valid JSON: "), broken.text


def test_sidecar_ids_of_one_and_of_sixty_four_characters_are_taken(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings) as srv:
        for sidecar in ("n", "n" * 64):
            r = _exchange(srv.url, settings, _node1([], sidecar=sidecar))
            assert r.status_code == 200, r.text


def test_a_digest_from_the_future_or_a_finding_not_an_object_is_refused_alone(
        tmp_path: Path):
    """Each digest is checked against the leader's clock on arrival, as ``/v1/records``
    checks a record; one bad finding costs only itself."""
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN)
    with LiveServer(settings) as srv:
        _lead(srv.url, "job")
        ahead = {**_step("job", 7, 2), "time": 4e9}
        r = _exchange(srv.url, settings, _node1([_step("job", 6, 2), ahead],
                                                [_nan_finding(2), "nan"]))
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["accepted"] == 1 and [x["index"] for x in got["rejected"]] == [1], got
        assert got["rejected"][0]["reason"].startswith("time: "), got
        assert got["rejected_findings"] == [
            {"index": 1, "reason": 'must be {"flags": N, "finding": {...}}'}], got
