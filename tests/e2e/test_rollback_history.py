"""After a rollback the run continues as one history (issue 22, item 4), on a real sidecar
subprocess over real HTTP. The client side is simulated exactly as the closed-loop contract
says: applying a rollback plan to the checkpoint of step C, the process draws a fresh
``attempt`` token and sends steps C+1, C+2, ... again.

The run: loss about 2.0 with a small deterministic wobble; from step ``FAULT`` the loss and
gradient norm run away (a divergence, paged). The loop rolls back to the checkpoint at
``CHECKPOINT`` (< onset), resumes with healthy values, and at step ``SPIKE`` one batch
reaches 1.5x the pre-fault level: a spike against the state the detectors had at the
checkpoint, invisible against a baseline the divergence had dragged up (an EMA near 100).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx

from tests.eventually import eventually
from tests.receivers import Receiver
from tests.sidecar_process import SidecarProcess
from tests.ticks import settled

RUN = "rollback-run"
FAULT, CHECKPOINT, ABANDONED_TO, SPIKE, END = 300, 250, 330, 420, 450
BATCH = 25


def _loss(step: int) -> float:
    return 2.0 + 0.02 * math.sin(step * 1.7) + 0.01 * math.cos(step * 0.37)


def _grad(step: int) -> float:
    return 1.0 + 0.1 * math.sin(step * 1.3)


def _diverging(step: int) -> tuple[float, float]:
    if step < FAULT:
        return _loss(step), _grad(step)
    return 2.0 * 1.15 ** (step - FAULT + 1), 1.3 ** (step - FAULT + 1)


def _resumed(step: int) -> tuple[float, float]:
    return (3.0 if step == SPIKE else _loss(step)), _grad(step)


def _batches(token: str, first: int, last: int, values: Any) -> list[list[dict[str, Any]]]:
    steps = [{"kind": "step", "run_id": RUN, "step": s, "time": 1000.0 + s, "attempt": token,
              "loss": values(s)[0], "grad_norm": values(s)[1]} for s in range(first, last + 1)]
    return [steps[i:i + BATCH] for i in range(0, len(steps), BATCH)]


def _end(token: str) -> list[dict[str, Any]]:
    return [{"kind": "end", "run_id": RUN, "step": END, "time": 1000.0 + END + 1,
             "status": "completed", "attempt": token}]


def _config(tmp_path: Path, pd: Receiver) -> Path:
    config = tmp_path / "config.yaml"
    # Snapshots every 0.2 s: the run has several below the checkpoint and some past it
    # (which the rollback must not restore from).
    config.write_text(f"snapshot_interval_seconds: 0.2\nalerting:\n  group_wait_seconds: 0.05\n"
                      f"  pagerduty: {{routing_key: k-0123456789abcdef0123456789abcd, "
                      f"url: '{pd.url}/v2/enqueue'}}\n")
    return config


def _post(sc: SidecarProcess, batch: list[dict[str, Any]]) -> dict[str, Any]:
    r = sc.post(batch)
    assert r.status_code == 200, r.text
    time.sleep(0.25)  # a snapshot now and then, as a live run gets them
    return r.json()


def _first_attempt(sc: SidecarProcess) -> None:
    for batch in _batches("a", 1, ABANDONED_TO, _diverging):
        _post(sc, batch)
    # The process fails (its client's exit hook says so): the relaunch may replace it at
    # once (a new attempt does not replace a job that is still sending).
    _post(sc, [{"kind": "end", "run_id": RUN, "step": ABANDONED_TO,
                "time": 1000.0 + ABANDONED_TO + 1, "status": "failed", "attempt": "a"}])


def _get(sc: SidecarProcess, path: str) -> Any:
    r = httpx.get(sc.url + path, timeout=10)
    r.raise_for_status()
    return r.json()


def _answers(sc: SidecarProcess) -> dict[str, Any]:
    """What the API says of the run, without what differs between two sidecars anyway
    (times of arrival, ids)."""
    run = _get(sc, f"/v1/runs/{RUN}")
    listed = [r for r in _get(sc, "/v1/runs")["runs"] if r["run_id"] == RUN]

    def findings(query: str) -> list[tuple[Any, ...]]:
        return sorted((f["type"], f["step"], f["rank"], f["severity"], f["attempt"])
                      for f in _get(sc, f"/v1/runs/{RUN}/findings?limit=1000{query}")["findings"])

    def records(number: int) -> list[tuple[Any, ...]]:
        got = _get(sc, f"/v1/runs/{RUN}/records?attempt={number}&limit=10000")["records"]
        return sorted((r["kind"], r["step"], r.get("loss")) for r in got)

    series = _series(sc)
    attempts = [{k: a[k] for k in ("number", "kind", "start_step", "superseded_from",
                                   "superseded_to", "first_step", "last_step", "steps",
                                   "current")} for a in run["attempts"]]
    return {
        "status": run["status"], "verdict": run["verdict"], "attempts": attempts,
        "listed": [(r["status"], r["verdict"]) for r in listed],
        "findings": findings(""), "current_findings": findings("&current=true"),
        "records": {a["number"]: records(a["number"]) for a in attempts},
        "chart": {"steps": series["steps"], "loss": series["series"]["loss"]["mean"],
                  "branches": series["branches"]},
    }


def _series(sc: SidecarProcess) -> dict[str, Any]:
    """The run page's series once the chart history has folded the run's last step (the
    indexer follows the records from a thread of its own)."""
    def folded() -> dict[str, Any]:
        r = httpx.get(f"{sc.url}/v1/runs/{RUN}/series?points=2000", timeout=10)
        assert r.status_code == 200 and r.json()["range"][1] == END, r.text[:200]
        return r.json()

    return eventually(folded, timeout=20, interval=0.1, what="the history folded the last step")


def test_a_rolled_back_run_is_judged_from_its_checkpoint_and_says_so(tmp_path: Path):
    with Receiver("pagerduty") as pd, SidecarProcess(tmp_path / "data",
                                                     config=_config(tmp_path, pd)) as sc:
        _first_attempt(sc)
        paged = pd.wait_for(1, timeout=10)
        assert _get(sc, f"/v1/runs/{RUN}")["verdict"]["state"] == "unhealthy"
        before = {e.json["payload"]["summary"] for e in paged
                  if e.json.get("event_action") == "trigger"}

        first = None
        for batch in _batches("b", CHECKPOINT + 1, END, _resumed):
            answer = _post(sc, batch)
            first = first or answer
        assert first is not None and first["attempts"][0]["kind"] == "resumed"
        assert (first["accepted"], first["duplicates"], first["late"]) == (BATCH, 0, 0)
        _post(sc, _end("b"))
        settled(sc.url)  # what the end sets off, and any page again, has been sent now

        # (a) Nothing paged again for the abandoned fault: the resumed steps are judged
        # from the detectors' state at the checkpoint, and that state never diverged.
        triggers = [e.json for e in pd.requests if e.json.get("event_action") == "trigger"]
        assert {t["payload"]["summary"] for t in triggers} == before, triggers
        current = _get(sc, f"/v1/runs/{RUN}/findings?limit=1000&current=true")["findings"]
        resumed = [(f["type"], f["step"]) for f in current if f["attempt"] == 2]
        assert not [f for f in resumed if f[0] in ("divergence", "grad_explosion")], resumed
        # (b) A new fault after the resume is caught against the pre-fault level.
        assert ("loss_spike", SPIKE) in resumed, resumed

        # The verdict: judged on the current history, naming what the resume abandoned. No
        # rule decided a rollback plan here, and the first process ended failed: the
        # sidecar says what it saw, a resume after a crash (issue 31), not a rollback.
        abandoned = [f for f in _get(sc, f"/v1/runs/{RUN}/findings?limit=1000")["findings"]
                     if f["type"] == "divergence"]
        onset = min(f["step"] for f in abandoned)
        want = (f"completed, healthy (resumed after a crash once: divergence at step {onset} "
                "abandoned)")
        answers = _answers(sc)
        assert answers["verdict"]["text"].startswith(want + "; goodput ")
        assert answers["verdict"]["state"] == "healthy"
        assert answers["listed"][0][1]["text"] == answers["verdict"]["text"]
        sc.kill()
        sc.start()
        assert _answers(sc) == answers  # the stored verdict, and all else, survives

        # The chart: the current history as one line (no sawtooth: each step once, the
        # resumed values from the checkpoint on), the abandoned steps as a branch apart.
        chart = answers["chart"]
        assert chart["steps"] == list(range(1, END + 1))
        assert max(chart["loss"][FAULT - 1:ABANDONED_TO]) < 2.1
        [branch] = chart["branches"]
        assert (branch["attempt"], branch["rolled_back_to"]) == (2, CHECKPOINT)
        assert branch["steps"] == list(range(CHECKPOINT + 1, ABANDONED_TO + 1))
        assert branch["loss"][-1] == _diverging(ABANDONED_TO)[0]


def test_retries_and_a_kill_9_mid_resume_leave_the_same_history(tmp_path: Path):
    """Two sidecars get the same run; one is killed with SIGKILL right after the resumed
    attempt's first batch was stored (the rollback settled, the run rebuilt, no snapshot
    of it yet) and restarted, and the client re-sends that batch (its answer was lost).
    Both also get retried batches of the abandoned branch (same old token) after the
    resume. Every API answer about the run is the same."""
    with Receiver("pagerduty") as pd:
        config = _config(tmp_path, pd)
        results = []
        for kill in (False, True):
            with SidecarProcess(tmp_path / f"data-{kill}", config=config) as sc:
                _first_attempt(sc)
                old = _batches("a", 1, ABANDONED_TO, _diverging)
                new = _batches("b", CHECKPOINT + 1, END, _resumed)
                _post(sc, new[0])
                if kill:
                    sc.kill()
                    sc.start()
                    again = _post(sc, new[0])
                    assert (again["accepted"], again["duplicates"]) == (0, BATCH)
                # The abandoned branch's last batches, retried after the resume: duplicates.
                for batch in old[-2:]:
                    retried = _post(sc, batch)
                    assert retried["duplicates"] == len(batch), retried
                for batch in new[1:]:
                    _post(sc, batch)
                _post(sc, _end("b"))
                settled(sc.url)  # what the end sets off has been done now
                results.append(_answers(sc))
        plain, killed = results
        assert plain["attempts"][1]["superseded_from"] == CHECKPOINT + 1
        assert killed == plain
