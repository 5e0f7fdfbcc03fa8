"""``POST /v1/peer/digests`` (api/peer.py) takes only what its exchange names: a digest or a
finding about a run the exchange's ``runs`` do not list is refused for good, item by item,
and nothing of it is stored or acted on, even for a run this sidecar leads. Over real HTTP,
a real sidecar leading two runs; the door's attacks: tests/reliability/test_peer_hostile.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

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
