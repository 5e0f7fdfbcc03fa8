"""Hostile input, part five (issue 48): the peer door and the leader link, attacked as the
fourth adversarial round attacked them, one test per class, over real HTTP between real
sidecars (in-process uvicorn, SQLite), local Slack receivers, and local HTTP servers
playing a leader that an attacker runs or that never answers.

Every sidecar has the same write token, as every job that writes to them does: the
attacker holds it too. What it must not be able to do with it: take a run's placement and
leader, get the write token sent to its host, slip past the peer door's checks, take
ingest down with one malformed finding, read a writer's token, spoof its address, replace
a live job, plant absurd durations and plans, or make one dead leader delay another run.
"""

from __future__ import annotations

import gzip
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
from tests.receivers import Receiver, Reply
from tests.ticks import sample, settled

pytestmark = pytest.mark.timeout(300)

TOKEN = "shared-write-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SUMMARISED = 'monitor_agent_notifications_total{channel="slack",outcome="summarised"}'
FAST = {"peer_timeout_seconds": 0.5, "heartbeat_seconds": 0.2}
STOP_ON_NAN = """
routes: {page: [slack]}
rules:
  - {name: StopOnNaN, match: {types: [nan_inf]}, severity: critical, fingerprint: [],
     action: stop}
"""


@contextmanager
def sidecar(tmp: Path, slack: Receiver, port: int | None = None, rules: str | None = None,
            **cluster: Any) -> Iterator[EmbeddedServer]:
    alerting: dict[str, Any] = {"group_wait_seconds": 0.05, "slack": {
        "webhook_url": slack.url + "/hook", "min_interval_seconds": 0}}
    if rules is not None:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "rules.yaml").write_text(rules)
        alerting["rules_file"] = str(tmp / "rules.yaml")
    made = Settings(port=port or free_port(), data_dir=tmp, token=TOKEN, alerting=alerting,
                    tick_interval_seconds=0.2, cluster={**FAST, **cluster})
    with EmbeddedServer(made) as srv:
        yield srv


def _post(url: str, records: list[dict], headers: dict[str, str] | None = None
          ) -> httpx.Response:
    return httpx.post(url + "/v1/records", json={"records": records},
                      headers={**AUTH, **(headers or {})}, timeout=30)


def _ok(url: str, records: list[dict]) -> dict:
    r = _post(url, records)
    assert r.status_code == 200, r.text
    return r.json()


def _step(run: str, step: int, rank: int = 0, token: str | None = None,
          loss: Any = 2.0) -> dict:
    rec = {"kind": "step", "run_id": run, "rank": rank, "step": step, "time": 1000.0 + step,
           "loss": loss, "grad_norm": 1.0 if loss == 2.0 else "NaN"}
    return {**rec, "attempt": token or f"{run}-r{rank}"}


def _run_record(run: str, rank: int, token: str | None = None, **extra: Any) -> dict:
    return {"kind": "run", "run_id": run, "rank": rank, "time": 1000.0,
            "attempt": token or f"{run}-r{rank}", **extra}


def _texts(slack: Receiver) -> list[str]:
    return [r.json["text"] for r in slack.requests if isinstance(r.json, dict)]


def _leader_answer(run: str, actions: list[dict]) -> Reply:
    """What a (hostile) leader answers an exchange with: the run's "actions"."""
    return Reply(200, {"sidecar": "evil", "accepted": 0, "duplicates": 0, "findings": 0,
                       "runs": {run: {"actions": actions}}})


STOP = {"id": 1, "action": "stop", "rule": "Evil", "type": "nan_inf", "step": 3,
        "message": "stop", "created_at": 1.0}
ROLLBACK = {"id": 2, "action": "rollback", "rule": "Evil", "type": "nan_inf", "step": 3,
            "message": "rolled back", "created_at": 1.0, "plan": {
                "checkpoint_step": 1, "checkpoint_path": "/evil.pt", "resume_position": 1,
                "skip": [[2, 10**15]], "positions": "positions", "skip_from": 2,
                "skip_to": 10**15, "lr_factor": 1e308, "lr_steps": 5, "number": 1,
                "budget": 2}}


# -- class 1: a run's placement and leader ----------------------------------------------------


def test_one_record_takes_neither_a_runs_placement_nor_its_leader(tmp_path):
    """A run record of a rank the victim does not have, under the attacker's own token,
    claiming node 1 of two with the attacker's host as leader (and one claiming two nodes
    only): the victim's placement stays its own, nothing is sent to that host, the victim's
    NaN is one page of its own sidecar with its own rule's action."""
    with Receiver("webhook") as evil, Receiver("slack") as slack, \
            sidecar(tmp_path, slack, rules=STOP_ON_NAN) as srv:
        evil.script(*[_leader_answer("victim", [STOP, ROLLBACK])] * 50)
        _ok(srv.url, [_run_record("victim", 0)] + [_step("victim", s) for s in range(1, 11)])
        taken = _ok(srv.url, [
            _run_record("victim", 5, "evil-1", cluster={
                "node_rank": 1, "nodes": 2, "leader_url": evil.url}),
            _run_record("victim", 6, "evil-2", cluster={"node_rank": 0, "nodes": 2})])
        assert taken["accepted"] == 2  # stored, as any run record of a process is
        answer = _ok(srv.url, [_step("victim", s, loss="NaN") for s in range(11, 14)])
        pages = eventually(lambda: [t for t in _texts(slack) if "StopOnNaN" in t], timeout=20)
        settled(srv.url)  # a second page would have been sent by now
        detail = httpx.get(srv.url + "/v1/runs/victim", timeout=10).json()
        actions = httpx.get(srv.url + "/v1/runs/victim/actions", timeout=10).json()["actions"]
    assert evil.requests == [], [r.headers.get("Authorization") for r in evil.requests]
    assert len(pages) == 1 and "partial view" not in pages[0], pages
    assert detail["leader"] is None
    assert [(a["action"], a["rule"]) for a in actions] == [("stop", "StopOnNaN")]
    assert [a["rule"] for a in answer["actions"]] == ["StopOnNaN"]


def test_the_link_sends_its_own_credential_never_the_write_token(tmp_path):
    """The leader a node sidecar forwards to is its operator's choice (cluster.leader_url
    here); even so it gets the link's credential, not the write token."""
    with Receiver("webhook") as leader, Receiver("slack") as slack, \
            sidecar(tmp_path, slack, leader_url=leader.url) as node:
        leader.script(*[Reply(200, {"sidecar": "lead", "accepted": 1, "duplicates": 0,
                                    "findings": 0, "runs": {}})] * 100)
        _ok(node.url, [_run_record("job", 2, cluster={"node_rank": 1, "nodes": 2})]
            + [_step("job", s, rank=2) for s in range(1, 4)])
        [first, *_] = leader.wait_for(1, timeout=20)
        credential = node.settings.peer_token_value()
    digests = json.loads(gzip.decompress(first.body))["records"]
    assert {d["run_id"] for d in digests} == {"job"}
    assert TOKEN not in first.headers["Authorization"]
    assert first.headers["Authorization"] == f"Bearer {credential}"


# -- class 2: the peer door applies /v1/records' checks ---------------------------------------


def _peer(url: str, body: dict, credential: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    return httpx.post(url + "/v1/peer/digests", json=body, headers=headers, timeout=30)


def _led_job(url: str) -> None:
    """Node 0's two ranks of a two-node run report to this sidecar: it leads the run."""
    cluster = {"node_rank": 0, "nodes": 2, "local_world_size": 2}
    _ok(url, [_run_record("job", r, cluster=cluster, hardware={"world_size": 4})
              for r in (0, 1)] + [_step("job", s, r) for s in range(1, 6) for r in (0, 1)])


def _finding(run: str, **extra: Any) -> dict:
    return {"flags": 0, "finding": {"type": "nan_inf", "severity": "critical", "run_id": run,
                                    "step": 5, "rank": 2, "message": "loss is nan",
                                    "evidence": {}, **extra}}


def test_the_peer_door_takes_the_link_credential_and_checks_what_ingest_checks(tmp_path):
    with Receiver("slack") as slack, sidecar(tmp_path, slack, rules=STOP_ON_NAN) as srv:
        _led_job(srv.url)
        _ok(srv.url, [_step("solo", s) for s in range(1, 6)])  # a single-node run
        node1 = {"run_id": "job", "node": 1, "ranks": [2, 3], "known_action": 0}
        heartbeat = {"sidecar": "node-1", "runs": [node1], "records": [], "findings": []}
        # The write token is no node sidecar's credential.
        assert _peer(srv.url, heartbeat, TOKEN).status_code == 401
        credential = srv.settings.peer_token_value()
        digests = [_step("job", s, r) for s in range(1, 6) for r in (2, 3)]
        forged = [
            # a checkpoint under a token the run never placed: not a rollback target
            {"kind": "checkpoint", "run_id": "job", "rank": 2, "step": 5, "time": 1006.0,
             "path": "/evil/ckpt.pt", "attempt": "never-placed"},
            # a hang of a rank past the world size
            {"kind": "hang", "run_id": "job", "rank": 999, "step": 5, "time": 1006.0,
             "stuck_seconds": 90.0},
            # held-back agreements about an action the run never took
            *[{"kind": "agreement", "run_id": "job", "rank": 2, "step": 5 + i,
               "time": 1006.0, "action_id": 7, "action": "rollback", "outcome": "missing"}
              for i in range(200)]]
        r = _peer(srv.url, {**heartbeat, "records": digests + forged}, credential)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["accepted"] == len(digests)
        assert sorted(x["index"] for x in got["rejected"]) == list(
            range(len(digests), len(digests) + len(forged)))
        reasons = {x["reason"].split(":")[0] for x in got["rejected"]}
        assert reasons == {"attempt", "rank", "action_id"}, reasons
        # A finding about a run this sidecar does not lead acts on nothing.
        solo = {"run_id": "solo", "node": 1, "ranks": [2], "known_action": 0}
        r = _peer(srv.url, {"sidecar": "node-1", "runs": [solo], "records": [],
                            "findings": [_finding("solo")]}, credential)
        assert r.status_code == 200 and "solo" in r.json()["deferred"], r.text
        settled(srv.url)  # a page would have been sent by now (actions: before the answer)
        ledger = httpx.get(srv.url + "/v1/runs/job/checkpoints", timeout=10).json()
        solo_actions = httpx.get(srv.url + "/v1/runs/solo/actions", timeout=10).json()
        findings = httpx.get(srv.url + "/v1/runs/job/findings", timeout=10).json()["findings"]
    assert ledger["checkpoints"] == [] and solo_actions["actions"] == []
    assert not [t for t in _texts(slack) if "run solo" in t or "ActionHeld" in t], _texts(slack)
    assert "action_held" not in {f["type"] for f in findings}


def test_a_forged_finding_never_acts_even_with_the_link_credential(tmp_path):
    """The link's credential is derived from the write token unless ``cluster.peer_token``
    is set, so whoever holds the write token can knock on the peer door. A finding makes
    the leader act (here: stop), so it is taken only about a rank whose records the same
    node sidecar forwards: not about another forwarder's rank, not about the leader's own
    ranks, not about a rank no record of reached the leader. The real node's finding acts."""
    with Receiver("slack") as slack, sidecar(tmp_path, slack, rules=STOP_ON_NAN) as srv:
        _led_job(srv.url)
        credential = srv.settings.peer_token_value()
        node1 = {"run_id": "job", "node": 1, "ranks": [2, 3], "known_action": 0}
        r = _peer(srv.url, {"sidecar": "node-1", "runs": [node1], "findings": [],
                            "records": [_step("job", s, r) for s in range(1, 6)
                                        for r in (2, 3)]}, credential)
        assert r.status_code == 200 and r.json()["accepted"] == 10, r.text
        evil = {"sidecar": "evil", "runs": [node1], "records": []}
        for rank, why in ((2, "forwarded by another node sidecar"),
                          (0, "reports to this sidecar itself"),
                          (1, "reports to this sidecar itself")):
            r = _peer(srv.url, {**evil, "findings": [_finding("job", rank=rank)]}, credential)
            assert r.status_code == 200, r.text
            got = r.json()
            assert got["findings"] == 0 and why in got["rejected_findings"][0]["reason"], got
        # A rank no record of reached the leader (a run's node that never spoke).
        _led_job_two = [_run_record("job2", r, cluster={"node_rank": 0, "nodes": 2,
                                                       "local_world_size": 2},
                                    hardware={"world_size": 4}) for r in (0, 1)]
        _ok(srv.url, _led_job_two + [_step("job2", s, r) for s in range(1, 6) for r in (0, 1)])
        r = _peer(srv.url, {"sidecar": "evil", "records": [], "runs": [
            {"run_id": "job2", "node": 1, "ranks": [2, 3], "known_action": 0}],
            "findings": [_finding("job2")]}, credential)
        assert "no record of rank 2" in r.json()["rejected_findings"][0]["reason"], r.text
        settled(srv.url)  # a page would have been sent by now (actions: before the answer)
        for run in ("job", "job2"):
            actions = httpx.get(srv.url + f"/v1/runs/{run}/actions", timeout=10).json()
            assert actions["actions"] == [], (run, actions)
        assert not [t for t in _texts(slack) if "StopOnNaN" in t], _texts(slack)
        # The node sidecar that forwards rank 2 is heard: its finding acts.
        r = _peer(srv.url, {"sidecar": "node-1", "runs": [node1], "records": [],
                            "findings": [_finding("job")]}, credential)
        assert r.json()["findings"] == 1, r.text
        eventually(lambda: [a for a in httpx.get(srv.url + "/v1/runs/job/actions",
                                                 timeout=10).json()["actions"]
                            if a["action"] == "stop"], timeout=30)


# -- class 3: one malformed item costs its exchange, never readiness ---------------------------


def test_a_malformed_finding_is_refused_alone_and_ingest_stays_up(tmp_path):
    with Receiver("slack") as slack, sidecar(tmp_path, slack) as srv:
        _led_job(srv.url)
        credential = srv.settings.peer_token_value()
        node1 = {"run_id": "job", "node": 1, "ranks": [2, 3], "known_action": 0}
        for bad in ({"layer": ["a"]}, {"step": 2**70}, {"rank": 2**70},
                    {"type": "x" * 100_000}, {"type": "nan\ninf"}):
            r = _peer(srv.url, {"sidecar": "node-1", "runs": [node1], "records": [],
                                "findings": [_finding("job", **bad)]}, credential)
            assert r.status_code == 422 and "finding 0" in r.text, (bad, r.status_code, r.text)
            assert httpx.get(srv.url + "/readyz", timeout=10).status_code == 200
            _ok(srv.url, [_step("other", 1)])  # honest ingest goes on
        # In a mixed exchange the bad finding costs only itself.
        r = _peer(srv.url, {"sidecar": "node-1", "runs": [node1],
                            "records": [_step("job", 6, 2)],
                            "findings": [_finding("job", layer=["a"])]}, credential)
        assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
        assert [x["index"] for x in r.json()["rejected_findings"]] == [0]
        exposed = httpx.get(srv.url + "/metrics", timeout=10).text
    assert "xxxxxxxxxx" not in exposed and "nan\ninf" not in exposed


# -- class 4: identity ------------------------------------------------------------------------


def test_reads_never_show_a_writers_token(tmp_path):
    secret = "victim-secret-token"
    with Receiver("slack") as slack, sidecar(tmp_path, slack) as srv:
        _ok(srv.url, [_run_record("victim", 0, secret)]
            + [_step("victim", s, token=secret) for s in range(1, 11)]
            + [{"kind": "checkpoint", "run_id": "victim", "step": 10, "time": 1011.0,
                "path": "/ckpt/10.pt", "attempt": secret}])
        answers = [httpx.get(srv.url + path, timeout=10).text for path in (
            "/v1/runs/victim", "/v1/runs/victim/checkpoints",
            "/v1/runs/victim/checkpoints?points=10",
            "/v1/runs/victim/records?since_step=-1&kind=run&kind=step&kind=checkpoint",
            "/v1/runs/victim/actions", "/v1/runs", "/metrics")]
    assert all(secret not in a for a in answers)
    assert all(len(a) > 20 for a in answers)


def test_a_claimed_forwarded_address_is_not_a_new_source(tmp_path):
    """Six new runs page a NaN each, every request claiming its own X-Forwarded-For from
    loopback: they are one source (the connection's), held to its burst of new runs'
    pages, as the same six without the header are."""
    with Receiver("slack") as slack:
        alerting = {"group_wait_seconds": 0.05,
                    "outbox": {"new_run_burst": 2, "new_run_window_seconds": 600},
                    "slack": {"webhook_url": slack.url + "/hook", "min_interval_seconds": 0}}
        made = Settings(port=free_port(), data_dir=tmp_path, token=TOKEN, alerting=alerting)
        with EmbeddedServer(made) as srv:
            for i in range(6):
                r = _post(srv.url, [_step(f"fake-{i}", 1, loss="NaN")],
                          headers={"X-Forwarded-For": f"10.9.8.{i}"})
                assert r.status_code == 200, r.text
            eventually(lambda: [t for t in _texts(slack) if "fake-" in t], timeout=20)
            # The outbox has decided about every page: two sent alone, four summarised.
            eventually(lambda: sample(srv.url, SUMMARISED) + len(
                [t for t in _texts(slack) if "fake-" in t and "new runs paged" not in t]) >= 6,
                timeout=20)
            singles = [t for t in _texts(slack) if "fake-" in t and "new runs paged" not in t]
    assert len(singles) == 2, singles


def test_a_stranger_cannot_replace_a_live_job(tmp_path):
    """One step under a fresh token as the victim's rank 0 while the victim trains: 409,
    nothing replaced; the victim's NaN is paged with its rule's action. Once the victim's
    job ended, the relaunch replaces its history at once."""
    with Receiver("slack") as slack, sidecar(tmp_path, slack, rules=STOP_ON_NAN) as srv:
        _ok(srv.url, [_run_record("victim", 0)] + [_step("victim", s) for s in range(1, 21)])
        r = _post(srv.url, [_step("victim", 1, token="stranger")])
        assert r.status_code == 409 and "is live" in r.text and r.headers["Retry-After"]
        nan = _ok(srv.url, [_step("victim", 21, loss="NaN")])
        assert [a["action"] for a in nan["actions"]] == ["stop"]
        pages = eventually(lambda: [t for t in _texts(slack) if "StopOnNaN" in t], timeout=20)
        assert "partial view" not in pages[0]
        attempts = httpx.get(srv.url + "/v1/runs/victim", timeout=10).json()["attempts"]
        assert [(a["number"], a["kind"]) for a in attempts] == [(1, "first"), (2, "pending")]
        # The victim's job stops (the stop was honoured); its relaunch is taken at once.
        _ok(srv.url, [{"kind": "end", "run_id": "victim", "step": 21, "time": 1022.0,
                       "status": "stopped", "attempt": "victim-r0"}])
        again = _ok(srv.url, [_step("victim", 15, token="relaunch")])
    assert [(a["number"], a["kind"]) for a in again["attempts"]] == [(3, "resumed")]


# -- class 5: durations, times and plans ------------------------------------------------------


@pytest.mark.parametrize("record, field", [
    ({"kind": "eval", "run_id": "e", "step": 1, "time": 1.0, "seconds": "5"}, "seconds"),
    ({"kind": "eval", "run_id": "e", "step": 1, "time": 1.0, "seconds": True}, "seconds"),
    ({"kind": "eval", "run_id": "e", "step": 1, "time": 1.0, "seconds": 1e308}, "seconds"),
    ({"kind": "checkpoint", "run_id": "e", "step": 1, "time": 1.0, "path": "/c",
      "seconds": 1e308}, "seconds"),
    ({"kind": "step", "run_id": "e", "step": 1, "time": 1e300}, "time"),
    ({"kind": "step", "run_id": "e", "step": 1, "time": 1.0, "step_time": "5"}, "step_time"),
    ({"kind": "hang", "run_id": "e", "step": 1, "time": 1.0, "stuck_seconds": 1e308},
     "stuck_seconds"),
])
def test_absurd_durations_and_times_are_refused_naming_the_field(tmp_path, record, field):
    with Receiver("slack") as slack, sidecar(tmp_path, slack) as srv:
        _ok(srv.url, [{"kind": "step", "run_id": "e", "step": 1, "time": 1.0}])
        r = _post(srv.url, [{**record, "step": 2 if record["kind"] == "step" else 1}])
    assert r.status_code == 422 and f"{field}:" in r.text, r.text


def test_a_leaders_absurd_plan_is_not_adopted(tmp_path):
    """Whatever its leader answers, a node sidecar keeps for its ranks only actions its
    own rules could have decided: a plan with lr_factor 1e308, NaN or -1, or a window of
    10**15 positions, is dropped; the leader's stop is kept."""
    bad = [{**ROLLBACK, "id": 2},
           {**ROLLBACK, "id": 3, "plan": {**ROLLBACK["plan"], "skip": [[2, 50]],
                                          "skip_to": 50, "lr_factor": float("nan")}},
           {**ROLLBACK, "id": 4, "plan": {**ROLLBACK["plan"], "skip": [[2, 50]],
                                          "skip_to": 50, "lr_factor": -1.0}},
           {**ROLLBACK, "id": 5, "plan": {**ROLLBACK["plan"], "lr_factor": 0.5}}]
    with Receiver("webhook") as leader, Receiver("slack") as slack, \
            sidecar(tmp_path, slack, leader_url=leader.url) as node:
        answer = _leader_answer("job", [*bad, {**STOP, "id": 6}])
        leader.script(*[Reply(200, json.loads(json.dumps(answer.body).replace(
            "NaN", '"NaN"')))] * 200)
        _ok(node.url, [_run_record("job", 2, cluster={"node_rank": 1, "nodes": 2})]
            + [_step("job", s, rank=2) for s in range(1, 21)])
        kept = eventually(lambda: httpx.get(node.url + "/v1/runs/job/actions",
                                            timeout=10).json()["actions"], timeout=20)
        since = len(leader.requests)  # every exchange from now on answers the same
        eventually(lambda: len(leader.requests) >= since + 2, timeout=20)
        kept = httpx.get(node.url + "/v1/runs/job/actions", timeout=10).json()["actions"]
    assert [(a["id"], a["action"]) for a in kept] == [(6, "stop")], kept


# -- class 6: the link's queue and threads ----------------------------------------------------


def test_dead_leaders_delay_no_other_run_and_the_queue_has_one_bound(tmp_path):
    """Twenty leaders that never answer (each holds its exchange open) and a real one: the
    real run's NaN on node 1 is paged by its leader while every dead one still holds its
    exchange. The queue kept for them all is bounded once, across leaders."""
    dead = [Receiver("webhook") for _ in range(20)]
    for d in dead:
        d.__enter__()
        d.script(*[Reply(delay=600)] * 20)
    lead_port = free_port()
    # Sorted by URL the dead leaders come first: a link serving leaders one after another
    # reaches the real one only after each dead one's post_timeout_seconds.
    listed = [f"127.0.0.1:{d.url.rsplit(':', 1)[1]}" for d in dead] + [f"localhost:{lead_port}"]
    try:
        with Receiver("slack") as slack0, Receiver("slack") as slack1, \
                sidecar(tmp_path / "n0", slack0, port=lead_port) as lead, \
                sidecar(tmp_path / "n1", slack1, leader_hosts=listed,
                        post_timeout_seconds=60, uplink_max_rows=1000) as node:
            for i, d in enumerate(dead):  # a run following each dead leader, with evals
                _ok(node.url, [_run_record(f"d{i}", 2, cluster={
                    "node_rank": 1, "nodes": 2, "leader_url": d.url})]
                    + [{"kind": "eval", "run_id": f"d{i}", "rank": 2, "step": s,
                        "time": 1000.0 + s, "val_loss": 1.0, "attempt": f"d{i}-r2"}
                       for s in range(1, 101)])
            real = {"node_rank": 1, "nodes": 2, "local_world_size": 2,
                    "leader_url": f"http://localhost:{lead_port}"}
            _ok(lead.url, [_run_record("job", r, cluster={**real, "node_rank": 0})
                           for r in (0, 1)])
            _ok(node.url, [_run_record("job", r, cluster=real) for r in (2, 3)])
            for s in range(1, 26):
                _ok(lead.url, [_step("job", s, r, loss="NaN" if s >= 21 else 2.0)
                               for r in (0, 1)])
                _ok(node.url, [_step("job", s, r, loss="NaN" if s >= 20 else 2.0)
                               for r in (2, 3)])
            pages = eventually(lambda: [t for t in _texts(slack0) if "TrainingNanInf" in t],
                               timeout=30)
            held = [len(d.requests) for d in dead]  # a dead leader records on release only
            queued = httpx.get(node.url + "/metrics", timeout=10).text
    finally:
        for d in dead:
            d.__exit__(None, None, None)
    assert "rank 2" in pages[0] and held == [0] * 20
    depth = [float(line.split()[1]) for line in queued.splitlines()
             if line.startswith("monitor_agent_uplink_queued ")]
    assert depth and depth[0] <= 1000, depth  # 2,000 evals owed to the dead: one bound
