"""A rollback decided once per run survives a sidecar kill -9 between the decision and its
delivery: a real sidecar subprocess, two ranks posting raw records, the triggering answer
dropped, SIGKILL, restart; every rank then polls the same decision exactly once, the
replayed findings decide nothing again, a resume applies it, and past the budget the run
is stopped with a page saying why. The plans name data positions: the second rollback to
the same checkpoint also skips the first one's window (the resumed run jumped over it, so
step and position differ), and a resume that trains the window again is paged."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path
from typing import Any

import httpx

from tests.e2e import two_ranks
from tests.eventually import eventually

RUN = "roll"
RULES = """
routes: {page: [pagerduty]}
rules:
  - name: RollbackOnNaN
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: [rank]
    action: rollback
    rollback_skip_margin: 20
    rollback_budget: 2
  - name: TrainingWindowTrained
    match: {types: [window_trained]}
    severity: error
    fingerprint: []
"""


def _step(step: int, rank: int, token: str, loss: float | str = 2.0,
          skipped: int = 0) -> dict[str, Any]:
    return two_ranks.step(RUN, step, rank, token, loss, skipped)


def _both(steps: range, token: str, nan_at: int | None = None,
          skipped: int = 0) -> list[dict[str, Any]]:
    return two_ranks.both(RUN, steps, token, nan_at, skipped)


def _post_dropping_the_answer(url: str, records: list[dict[str, Any]]) -> int:
    """POST and read only the status line: the answer (and its actions) never reach us."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/v1/records", body=json.dumps({"records": records}),
                 headers={"Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status


def _poll(url: str, after: int = 0) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/runs/{RUN}/actions", params={"after": after}, timeout=10)
    r.raise_for_status()
    return r.json()


def test_the_decision_survives_kill_9_and_every_rank_gets_it_once(
        tmp_path: Path, sidecar_factory, pd_receiver):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    config = tmp_path / "config.yaml"
    config.write_text(f"alerting:\n  rules_file: {rules}\n  group_wait_seconds: 0.05\n"
                      f"  pagerduty: {{routing_key: k-0123456789abcdef0123456789abcd, "
                      f"url: '{pd_receiver.url}/v2/enqueue'}}\n")
    sc = sidecar_factory(config=config).start()
    ckpt = {"kind": "checkpoint", "run_id": RUN, "rank": 0, "step": 20, "time": 1020.5,
            "path": "/ckpt/step-20.pt", "attempt": "a0", "data_position": 20}
    assert sc.post(_both(range(1, 31), "a") + [ckpt]).json()["accepted"] == 61

    # Step 31 is NaN on both ranks (DDP's all-reduce carries rank 0's to rank 1): the NaN
    # page, waiting for every rank's step 31, decides; the answer is dropped, the sidecar dies.
    fault = [_step(31, 0, "a", "NaN"), _step(31, 1, "a", "NaN")]
    assert _post_dropping_the_answer(sc.url, fault) == 200
    sc.kill()
    sc.start()

    polls = [_poll(sc.url) for _rank in (0, 1)]
    assert polls[0] == polls[1]
    [decided] = polls[0]["actions"]
    assert decided["action"] == "rollback" and decided["honoured_step"] is None
    assert decided["plan"] == {"checkpoint_step": 20, "checkpoint_path": "/ckpt/step-20.pt",
                               "resume_position": 20, "skip": [[21, 51]],
                               "positions": "positions", "skip_from": 21, "skip_to": 51,
                               "lr_factor": None, "lr_steps": None, "number": 1, "budget": 2}
    assert decided["message"] == ("rolled back to step 20 (/ckpt/step-20.pt, data position 20), "
                                  "skipping batches 21-51")
    assert _poll(sc.url, polls[0]["last_id"])["actions"] == []  # exactly once per poller
    # Recovery replayed the stored tail, the NaN step with it: no second decision.
    assert re.search(rf"run {RUN}: restored, replayed [1-9]", sc.log()), sc.log()[-2000:]
    # The batch is retried, and both ranks report the fault again: still the one decision.
    assert sc.post(fault).json()["duplicates"] == 2
    # (the answer carries the open decision, as every answer of the run does until it is
    # applied: no new one)
    again = sc.post([_step(32, 0, "a", "NaN"), _step(32, 1, "a", "NaN")]).json()["actions"]
    assert [a["id"] for a in again] == [decided["id"]]
    assert [a["id"] for a in _poll(sc.url)["actions"]] == [decided["id"]]

    # Both ranks reload step 20 and go on at 21 under new tokens, their data past the
    # window (batch 52 at step 21): the rollback is applied.
    assert sc.post(_both(range(21, 31), "b", skipped=31)).status_code == 200
    [applied] = _poll(sc.url)["actions"]
    assert applied["honoured_step"] == 21
    # The run's history no longer holds the NaN at 31: the save at 20 is clean again.
    ledger = httpx.get(f"{sc.url}/v1/runs/{RUN}/checkpoints").json()
    assert ledger["last_clean"] == {"step": 20, "path": "/ckpt/step-20.pt"}

    # The fault comes back at 35 (batch 66): the second rollback, to the same checkpoint;
    # its window starts at the checkpoint's batch and holds the first one's.
    [second] = sc.post(_both(range(31, 36), "b", nan_at=35, skipped=31)).json()["actions"]
    assert (second["action"], second["plan"]["number"], second["plan"]["skip_to"]) == (
        "rollback", 2, 55)
    assert (second["plan"]["resume_position"], second["plan"]["skip"]) == (20, [[21, 86]])
    assert [p["actions"] for p in (_poll(sc.url, decided["id"]), _poll(sc.url, decided["id"]))] \
        == [[second], [second]]

    # Resumed again, but this loop fast-forwards nothing: batch 21 at step 21, inside the
    # window. It is paged, with the batches, and the run is not healthy for it.
    assert sc.post(_both(range(21, 31), "c")).status_code == 200
    found = httpx.get(f"{sc.url}/v1/runs/{RUN}/findings", timeout=10).json()["findings"]
    trained = [f for f in found if f["type"] == "window_trained"]
    assert trained and trained[0]["step"] == 21 and trained[0]["evidence"]["window"] == [21, 86]
    assert "step 21 trained batch 21, inside rollback 2's skip window 21-86" in \
        trained[0]["message"]
    verdict = httpx.get(f"{sc.url}/v1/runs/{RUN}", timeout=10).json()["verdict"]
    assert verdict["state"] == "unhealthy" and verdict["cause"] == "window_trained", verdict
    # And again NaN: the budget of 2 is spent, so the run is stopped.
    [stop] = sc.post(_both(range(31, 34), "c", nan_at=33)).json()["actions"]
    assert stop["action"] == "stop" and stop["plan"] is None
    assert stop["message"].startswith("rollback budget 2 spent: stopping; a human must look")
    assert _poll(sc.url)["stop"] is True
    assert [a["action"] for a in _poll(sc.url)["actions"]] == ["rollback", "rollback", "stop"]
    def paged() -> list[str]:
        pages = [r.json["payload"]["summary"] for r in pd_receiver.requests
                 if r.json and "payload" in r.json]  # resolves carry none
        assert any("rollback budget 2 spent" in p for p in pages), pages
        return pages

    pages = eventually(paged, timeout=15, what="the page of the spent budget")
    assert any("rollback budget 2 spent: stopping; a human must look" in p for p in pages), pages
    assert any("rolled back to step 20 (/ckpt/step-20.pt, data position 20), skipping batches "
               "21-51" in p and "last clean checkpoint: step 20, /ckpt/step-20.pt" in p
               for p in pages), pages
    assert any("TrainingWindowTrained" in p and "batch 21" in p for p in pages), pages
