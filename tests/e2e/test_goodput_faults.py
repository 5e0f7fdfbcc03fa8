"""The goodput ledger's proof on real parts: a real sidecar, and a user's plain CPU training
loop written from the README (``goodput_train.py``, the real client) that injects faults of
known cost itself: a slow loader, evaluations, checkpoints on slow storage, a hang its
watchdog reports, a crash after a checkpoint and a relaunch from it after a known gap. Each
fault's cost comes back from ``GET /v1/runs/{id}/goodput`` in its own bucket; the buckets
add up to the wall-clock time the scripts' own clocks measured; a healthy run of the same
script is above 98% goodput. Also a rollback the sidecar decides (``rollback_user_train.py``,
the closed loop's script): the steps it throws away are rollback badput; and a 2-rank gloo
DDP run with one slow rank: the straggler tax.

Tolerances. Each injected cost is a ``time.sleep`` of 0.3-3 s (or, for the crash, the
launcher's gap plus the relaunched interpreter's start, and the steps redone, measured by the
scripts' own clocks, not the client's): a sleep overshoots by a millisecond or so, and the
real work inside a bucket (a tiny model's ``torch.save``, an evaluation's forward pass, the
hand-over of a batch) is a few milliseconds, so 5% of the smallest injected cost (1 s: 50 ms)
holds them with room for a loaded 2-core machine's scheduling. A hang's split into before
and after the watchdog's report depends on the watchdog's once-a-second wake-up: its total
is held to 5%, the split to the watchdog's window. The buckets must add up to the wall-clock
time within 1%: the ledger makes them add up to its own wall exactly (``unaccounted`` takes
what no record explains), so the test compares them with the scripts' clocks instead and
holds ``unaccounted`` under 1% too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar_process import SidecarProcess

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("goodput_train.py")
ROLLBACK_SCRIPT = Path(__file__).with_name("rollback_user_train.py")
REL = 0.05  # each bucket against its injected cost
WALL = 0.01  # the buckets against the wall-clock time
# The loader's own hand-over jitter, which the ledger rightly charges as input (a step that
# waited longer than the loader's floor waited): a fraction of a millisecond a step on an
# idle machine, up to about 0.2 ms more on a loaded 2-core one (measured: 1.275 s of input
# for 1.2 s injected over 350 steps). Allowed on top of the injected loader sleeps.
JITTER_PER_STEP = 0.0005
RULES = """
routes: {page: [console]}
rules:
  - name: RollbackOnDivergence
    match: {types: [divergence]}
    severity: critical
    action: rollback
    rollback_skip_margin: 10
"""


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory) -> Iterator[SidecarProcess]:
    """One sidecar for the module's runs (each its own run id); its one rule rolls a
    diverging run back."""
    tmp = tmp_path_factory.mktemp("goodput")
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    config = tmp / "config.yaml"
    config.write_text(f"alerting:\n  rules_file: {rules}\n  group_wait_seconds: 0.05\n")
    proc = SidecarProcess(tmp / "data", config=config).start()
    try:
        yield proc
    finally:
        proc.stop()


def _launch(script: Path, out: Path, *args: str, world: int = 1
            ) -> list[subprocess.CompletedProcess[str]]:
    """The script as ``world`` processes (gloo ranks on loopback when more than one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1",
           "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "MONITOR_AGENT_SPOOL_DIR": str(out / "spool")}
    procs = [subprocess.Popen([sys.executable, str(script), *args],
                              env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(world)]
    done = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=240)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


def _train(url: str, run_id: str, out: Path, *args: str, world: int = 1,
           ok: bool = True) -> list[subprocess.CompletedProcess[str]]:
    procs = _launch(SCRIPT, out, "--url", url, "--run-id", run_id, "--out-dir", str(out),
                    *args, world=world)
    if ok:
        assert all(p.returncode == 0 for p in procs), [p.stderr[-3000:] for p in procs]
    return procs


def _clock(out: Path, rank: int | str = 0) -> list[dict[str, Any]]:
    """The scripts' own clock (every process of ``rank``, ``"*"``: of every rank), in time
    order."""
    events = [json.loads(line) for f in out.glob(f"clock-r{rank}-*.jsonl")
              for line in f.read_text().splitlines()]
    return sorted(events, key=lambda e: e["time"])


def _goodput(url: str, run_id: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/runs/{run_id}/goodput", timeout=10)
    r.raise_for_status()
    return r.json()


def _adds_up_to(g: dict[str, Any], wall: float) -> None:
    """Productive and badput add up to ``wall`` (the scripts' clocks) within 1%, and what
    no record explains is under 1% of it."""
    total = g["productive_seconds"] + sum(g["badput_seconds"].values())
    assert total == pytest.approx(wall, rel=WALL), (total, wall, g["summary"])
    assert g["badput_seconds"]["unaccounted"] < WALL * wall, g["badput_seconds"]


@pytest.mark.slow
def test_a_healthy_run_is_above_98_percent_goodput(sidecar, tmp_path):
    """200 steps of ~25 ms, nothing injected: the start-up (up to the first step) and the
    loader's hand-over of each batch are all the badput there is."""
    _train(sidecar.url, "gp-healthy", tmp_path, "--steps", "200")
    g = _goodput(sidecar.url, "gp-healthy")
    clock = _clock(tmp_path)
    _adds_up_to(g, clock[-1]["time"] - clock[0]["time"])
    assert g["goodput_ratio"] > 0.98, g["summary"]
    assert [a["attempt"] for a in g["attempts"]] == [1] and g["incidents"] == []


@pytest.mark.slow
def test_each_injected_fault_costs_what_it_cost_in_its_own_bucket(sidecar, tmp_path):
    """Attempt 1: four batches read 0.3 s slowly, two 0.5 s evaluations, two checkpoints with
    0.5 s of slow storage each, step 90 stuck 3 s (the watchdog's limit: 1 s), and a crash
    after step 150, 30 steps past the checkpoint at 120. The launcher relaunches it 1.5 s
    later from that checkpoint, to step 200."""
    gap, faults = 1.5, ["--watchdog-floor", "1", "--slow-batches", "20,40,80,110",
                        "--loader-sleep", "0.3", "--eval-at", "50,100", "--eval-sleep", "0.5",
                        "--ckpt-at", "60,120", "--ckpt-sleep", "0.5", "--hang-at", "90",
                        "--hang", "3"]
    [crashed] = _train(sidecar.url, "gp-faults", tmp_path, "--steps", "200", *faults,
                       "--crash-at", "150", ok=False)
    assert crashed.returncode == 1 and "node lost after step 150" in crashed.stderr, \
        crashed.stderr[-3000:]
    time.sleep(gap)  # the relaunch gap the ledger must book
    _train(sidecar.url, "gp-faults", tmp_path, "--steps", "200", *faults,
           "--resume", str(tmp_path / "ckpt-120.pt"))
    g = _goodput(sidecar.url, "gp-faults")
    bad = g["badput_seconds"]
    clock = _clock(tmp_path)
    at = {(e["event"], e["step"]): e for e in clock}
    crash, ups = at["crash", 150], [e for e in clock if e["event"] == "up"]
    assert len(ups) == 2

    steps = 150 + (200 - 120)  # attempt 1 to its crash, attempt 2 from the checkpoint
    assert 4 * 0.3 * (1 - REL) <= bad["input"] <= 4 * 0.3 * (1 + REL) + JITTER_PER_STEP * steps
    assert bad["eval"] == pytest.approx(2 * 0.5, rel=REL)
    assert bad["checkpoint"] == pytest.approx(2 * 0.5, rel=REL)
    hang = bad["hang_undetected"] + bad["hang_detected"]
    assert hang == pytest.approx(3.0, rel=REL)
    # Reported at the watchdog's first wake-up past its 1 s limit (it wakes once a second).
    assert 1.0 - 0.1 <= bad["hang_undetected"] <= 2.0 + 0.1, bad
    # The relaunch: from the crash to the relaunched process's run record (the launcher's
    # gap, then the interpreter and torch starting), on the scripts' clocks.
    assert bad["restart"] == pytest.approx(ups[1]["time"] - crash["time"], rel=REL)
    assert bad["restart"] > gap
    # Steps 121-150 were done twice: their time (less the save after step 120, which the
    # checkpoint bucket holds) is resumed work.
    redone = crash["time"] - at["step", 120]["time"] - at["ckpt", 120]["seconds"]
    assert bad["resume"] == pytest.approx(redone, rel=REL)
    for cause in ("rollback", "skipped", "loss_scale", "straggler"):
        assert bad[cause] == 0.0, cause
    assert bad["startup"] < 0.1, bad  # the two attempts' own, up to their first steps
    _adds_up_to(g, clock[-1]["time"] - ups[0]["time"])

    kinds = [i["kind"] for i in g["incidents"]]
    assert kinds == ["hang", "restart"], g["incidents"]
    hung, restart = g["incidents"]
    assert hung["step"] == 89 and not hung["open"]
    assert hung["seconds"] == pytest.approx(hang)
    assert restart["step"] == 121 and restart["attempt"] == 2
    assert restart["detail"]["discarded"] == pytest.approx(bad["resume"])
    assert restart["detail"]["gap"] == pytest.approx(bad["restart"])
    assert [a["attempt"] for a in g["attempts"]] == [1, 2]


@pytest.mark.slow
def test_the_steps_a_rollback_threw_away_are_rollback_badput(sidecar, tmp_path):
    """The closed loop's script: its data turns corrupt at batch 65, the sidecar's rule rolls
    it back to its checkpoint at step 60 and it goes on past the window. The steps it trained
    from 61 up to the plan are work thrown away: their time, from their own records, less
    the saves among them (checkpoint time), is the rollback bucket."""
    run_id, out = "gp-rollback", tmp_path / "out"
    [proc] = _launch(ROLLBACK_SCRIPT, tmp_path, f"--url={sidecar.url}", f"--run_id={run_id}",
                     f"--out_dir={out}", "--steps=100", "--ckpt_every=10", "--poison=65-70",
                     "--step_delay=0.04")
    assert proc.returncode == 0, proc.stderr[-3000:]
    actions = httpx.get(f"{sidecar.url}/v1/runs/{run_id}/actions", timeout=10).json()
    [plan] = [a["plan"] for a in actions["actions"] if a["action"] == "rollback"]
    assert plan["checkpoint_step"] == 60
    lines = (out / "batches-r0.log").read_text().splitlines()
    applied = next(i for i, line in enumerate(lines) if line.startswith("rollback"))
    last = int(lines[applied - 1].split()[0])  # the last step trained before the plan
    old = httpx.get(f"{sidecar.url}/v1/runs/{run_id}/records",
                    params={"attempt": 1, "limit": 10_000}, timeout=10).json()["records"]
    steps = {r["step"]: r["time"] for r in old if r["kind"] == "step"}
    assert max(steps) == last > 60
    saves = sum(r.get("seconds") or 0.0 for r in old
                if r["kind"] == "checkpoint" and 60 <= r["step"] < last)
    thrown = steps[last] - steps[60] - saves
    g = _goodput(sidecar.url, run_id)
    bad = g["badput_seconds"]
    assert bad["rollback"] == pytest.approx(thrown, rel=REL), (bad, last)
    assert bad["resume"] == 0.0
    [rolled] = [i for i in g["incidents"] if i["kind"] == "rollback"]
    assert rolled["step"] == 61 and rolled["detail"]["discarded"] == pytest.approx(thrown,
                                                                                    rel=REL)
    total = g["productive_seconds"] + sum(bad.values())
    assert total == pytest.approx(g["wall_seconds"], rel=WALL)
    assert bad["unaccounted"] < WALL * g["wall_seconds"], bad


@pytest.mark.slow
def test_a_slow_rank_is_the_straggler_tax(sidecar, tmp_path):
    """Two gloo ranks, 100 steps; rank 1's compute takes 20 ms more each step, and rank 0
    waits that long for it in every all-reduce. The tax is the median rank's summed wait
    less the slowest rank's: with two ranks the median is their mean, so half of 100 x 20 ms
    (runs/goodput.py; what the steps would be shorter at the median rank's pace)."""
    _train(sidecar.url, "gp-straggler", tmp_path, "--steps", "100", "--slow-rank", "1",
           "--slow", "0.02", world=2)
    g = _goodput(sidecar.url, "gp-straggler")
    assert g["gpus"] == 2
    assert g["badput_seconds"]["straggler"] == pytest.approx(100 * 0.02 / 2, rel=REL)
    clock = _clock(tmp_path, rank="*")  # the run: from the first rank up to the last done
    _adds_up_to(g, clock[-1]["time"] - clock[0]["time"])
