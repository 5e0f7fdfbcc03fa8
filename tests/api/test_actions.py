"""Through a real sidecar: a rule's stop comes back in the ingest answer, on the poll
endpoint and in /metrics, and the page says the run was stopped."""

from __future__ import annotations

import httpx


def _step(step: int, loss: float | str) -> dict:
    return {"kind": "step", "run_id": "stop-me", "step": step, "time": 1000.0 + step,
            "loss": loss, "grad_norm": 1.0}


def test_stop_comes_back_in_the_answer_and_on_the_poll(stopping_sidecar, pd_receiver):
    sc = stopping_sidecar
    first = sc.post([{"kind": "run", "run_id": "stop-me", "config": {"total_steps": 100}},
                     *[_step(s, 2.0) for s in range(1, 5)], _step(5, "NaN")]).json()
    assert first["accepted"] == 6 and first["actions"] == []
    assert httpx.get(sc.url + "/v1/runs/stop-me/actions").json()["stop"] is False
    # nan_inf reports the first NaN step, then the NaN still there 3 steps in a row.
    assert sc.post([_step(6, "NaN")]).json()["actions"] == []
    [action] = sc.post([_step(7, "NaN")]).json()["actions"]
    assert (action["action"], action["step"], action["rule"]) == ("stop", 7, "StopOnRepeatedNaN")
    # Taken once per episode; open actions ride every answer of the run until honoured (a
    # rank whose own records did not decide it hears of it with its next answer), and the
    # client keeps each id once.
    assert [a["id"] for a in sc.post([_step(8, "NaN")]).json()["actions"]] == [action["id"]]

    polled = httpx.get(sc.url + "/v1/runs/stop-me/actions").json()
    assert polled["stop"] is True and [a["id"] for a in polled["actions"]] == [action["id"]]
    later = httpx.get(sc.url + "/v1/runs/stop-me/actions",
                      params={"after": polled["last_id"]}).json()
    assert later["actions"] == [] and later["stop"] is True  # a stop stays a stop
    assert httpx.get(sc.url + "/v1/runs/other/actions").json() == {
        "run_id": "other", "actions": [], "stop": False, "last_id": 0}

    metrics = httpx.get(sc.url + "/metrics").text
    assert ('training_actions_total{project="",run_id="stop-me",action="stop",'
            'rule="StopOnRepeatedNaN"} 1') in metrics
    summaries = [r.json["payload"]["summary"] for r in pd_receiver.wait_for(2, timeout=10)]
    assert any("stop requested at step 7 by rule StopOnRepeatedNaN" in s for s in summaries)
    # The trainer stops at step 9: its end record says so, and so do the actions and pages.
    assert sc.post([_step(9, "NaN"), {"kind": "end", "run_id": "stop-me", "step": 9,
                                      "time": 1010.0, "status": "stopped"}]).status_code == 200
    [done] = httpx.get(sc.url + "/v1/runs/stop-me/actions").json()["actions"]
    assert (done["step"], done["honoured_step"]) == (7, 9)
    told = "run stopped at step 9 by rule StopOnRepeatedNaN (stop requested at step 7)"
    assert done["message"] == told
    summaries = [r.json["payload"]["summary"] for r in pd_receiver.wait_for(3, timeout=10)]
    assert told in summaries[-1]


def test_the_poll_rejects_a_bad_cursor(stopping_sidecar):
    r = httpx.get(stopping_sidecar.url + "/v1/runs/x/actions", params={"after": -1})
    assert r.status_code == 422
