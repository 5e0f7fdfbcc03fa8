"""Issue 24, item 1: a run id reused by a new process. The same training script, run as a
real client subprocess against a real sidecar, twice with a fixed ``run_id``: the second run
is stored as attempt 2 (a new run reusing the id, or the same run resumed from a
checkpoint, its replayed range kept as abandoned), and the client says so, once. Also with
the sidecar down during the second run, its spool delivered when the sidecar is back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "gpt-exp-1"

SCRIPT = """
import pathlib, sys, time
import monitor_client

run_id, first, last, offset, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \\
    float(sys.argv[4]), sys.argv[5]
mon = monitor_client.Monitor(run_id=run_id, config={"lr": 3e-4, "offset": offset})
for step in range(first, last + 1):
    mon.log_step(step, loss=offset + 1.0 / step)
if go != "-":  # wait for the test to bring the sidecar back, then deliver the spool
    pathlib.Path(go + ".logged").touch()
    while not pathlib.Path(go).exists():
        time.sleep(0.05)  # the test's go-ahead; it bounds the wait
    print("flushed", mon.flush(timeout=60), file=sys.stderr)
mon.close(timeout=30)
"""


def _train(tmp_path: Path, url: str, first: int, last: int, offset: float,
           go: str = "-", wait: bool = True) -> subprocess.Popen[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "MONITOR_AGENT_URL": url,
           "MONITOR_AGENT_SPOOL_DIR": str(tmp_path / "spool"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script), RUN_ID, str(first), str(last), str(offset), go],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if wait:
        proc.wait(120)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    return proc


def _stderr(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    return proc.stderr.read()


def _steps(url: str, **params: object) -> dict[int, float]:
    r = httpx.get(f"{url}/v1/runs/{RUN_ID}/records",
                  params={"kind": "step", "limit": 10_000, **params}, timeout=10)
    r.raise_for_status()
    records = r.json()["records"]
    steps = [rec["step"] for rec in records]
    assert len(steps) == len(set(steps)), f"a step twice in one history: {steps}"
    return {rec["step"]: rec["loss"] for rec in records}


def _attempts(url: str) -> list[dict]:
    return httpx.get(f"{url}/v1/runs/{RUN_ID}", timeout=10).json()["attempts"]


def _series_loss(url: str) -> dict[int, float]:
    """The loss chart as the run page draws it, once the chart history caught up."""
    def caught_up() -> dict[int, float]:
        body = httpx.get(f"{url}/v1/runs/{RUN_ID}/series", timeout=10).json()
        if body["bucketed"]:
            raise RuntimeError("the loss chart is bucketed: this test reads every step")
        found = {int(s): v for s, v in zip(body["steps"], body["series"]["loss"]["mean"],
                                           strict=True)}
        assert found and max(found) == max(_steps(url)), sorted(found)[-3:]
        return found

    return eventually(caught_up, timeout=20, interval=0.2, what="the chart history caught up")


def test_the_same_script_twice_with_a_fixed_run_id_keeps_both_runs(sidecar, tmp_path):
    first = _train(tmp_path, sidecar.url, 1, 30, offset=0.0)
    assert "already exists" not in _stderr(first)
    second = _train(tmp_path, sidecar.url, 1, 20, offset=10.0)
    said = _stderr(second)
    line = (f"monitor_client: run {RUN_ID} already exists on the sidecar; this is attempt 2 "
            "(a new run reusing the id; attempt 1 kept)")
    assert said.count(line) == 1, said

    one, two = _attempts(sidecar.url)
    assert (one["kind"], one["first_step"], one["last_step"], one["steps"]) == (
        "first", 1, 30, 30)
    assert (two["kind"], two["start_step"], two["last_step"], two["current"]) == (
        "restarted", 1, 20, True)
    # The current history is the new run alone; the first stays readable as attempt 1.
    assert _steps(sidecar.url) == {s: 10.0 + 1.0 / s for s in range(1, 21)}
    assert _steps(sidecar.url, attempt=1) == {s: 1.0 / s for s in range(1, 31)}
    assert _series_loss(sidecar.url) == _steps(sidecar.url)
    [listed] = httpx.get(f"{sidecar.url}/v1/runs", timeout=10).json()["runs"]
    assert (listed["attempts"], listed["last_step"]) == (2, 20)


def test_a_relaunch_from_a_checkpoint_resumes_and_keeps_the_replayed_steps(sidecar, tmp_path):
    _train(tmp_path, sidecar.url, 1, 40, offset=0.0)  # crashed after step 40
    resumed = _train(tmp_path, sidecar.url, 25, 60, offset=5.0)  # checkpoint at step 24
    said = _stderr(resumed)
    line = ("this is attempt 2 (resumed from step 25; steps 25-40 of attempt 1 kept as "
            "abandoned)")
    assert said.count(line) == 1, said

    one, two = _attempts(sidecar.url)
    assert (two["kind"], two["start_step"], two["superseded_from"], two["superseded_to"]) == (
        "resumed", 25, 25, 40)
    # One line: attempt 1 up to the checkpoint, then the resumed branch; never both.
    current = {s: 1.0 / s for s in range(1, 25)} | {s: 5.0 + 1.0 / s for s in range(25, 61)}
    assert _steps(sidecar.url) == current
    assert set(_steps(sidecar.url, attempt=1)) == set(range(1, 41))  # kept, abandoned
    assert _series_loss(sidecar.url) == current
    # Detectors judged the resumed steps (not late) from the state they had at step 24.
    detail = httpx.get(f"{sidecar.url}/v1/runs/{RUN_ID}", timeout=10).json()
    assert detail["last_step"] == 60 and detail["ranks"]["0"]["steps_total"] == 60


def test_a_second_run_spooled_while_the_sidecar_was_down_is_its_own_attempt(
        sidecar, tmp_path):
    _train(tmp_path, sidecar.url, 1, 30, offset=0.0)
    sidecar.stop()
    go = tmp_path / "go"
    proc = _train(tmp_path, sidecar.url, 1, 30, offset=20.0, go=str(go), wait=False)
    def logged() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(_stderr(proc))
        return Path(f"{go}.logged").exists()

    eventually(logged, timeout=60, what="the trainer logged against the stopped sidecar")
    sidecar.start()
    go.touch()
    proc.wait(120)
    said = _stderr(proc)
    assert proc.returncode == 0 and "flushed True" in said, said
    assert said.count("this is attempt 2 (a new run reusing the id; attempt 1 kept)") == 1, said
    assert [a["kind"] for a in _attempts(sidecar.url)] == ["first", "restarted"]
    assert _steps(sidecar.url) == {s: 20.0 + 1.0 / s for s in range(1, 31)}
    assert _steps(sidecar.url, attempt=1) == {s: 1.0 / s for s in range(1, 31)}
