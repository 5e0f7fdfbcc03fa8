"""The goodput ledger against injected faults of known cost (issue 50), on real parts: a
real sidecar, and the goodput e2e's user-style CPU training script
(``tests/e2e/goodput_train.py``, the real client), which injects each fault itself and keeps
its own clock. Per fault shape it prints the injected cost (nominal, and as the script's
clock measured it), the ledger's bucket from ``GET /v1/runs/{id}/goodput``, their ratio,
the buckets' sum against the wall-clock time of the script's clock, and the findings the
sidecar opened on the same run (the ledger and the findings side by side).

Shapes (``--shapes``, comma-separated; default all but ``two-node``):

* ``healthy``: 30 steps of 1 s, a DataLoader with two prefetching workers, nothing
  injected: its goodput once started (the wall less start-up);
* ``steady``: no prefetch, every batch 100 ms to load, 25 ms of compute (60 steps);
* ``few-workers``: one prefetching worker, 100 ms a batch, 25 ms compute (60 steps);
* ``slowing``: 130 steps at full speed, then every batch 100 ms to load (40 steps);
* ``faults``: four slow batches (0.3 s), two evaluations and two checkpoints of 0.5 s, a
  3 s hang (watchdog 1 s), a crash after step 150 and a relaunch 1.5 s later from the
  checkpoint at 120 (200 steps; fixed, ``--scale`` leaves it);
* ``straggler``: two gloo ranks, rank 1's compute 100 ms slower every step (40 steps);
* ``two-node`` (or ``--two-node``): two sidecars, node 0's leading, one rank each, rank 1's
  batches 100 ms to load (40 steps): the leader's ``straggler_data``.

``--scale`` multiplies every step count but the ``faults`` shape's. The tests that hold
these figures to 5% are ``tests/e2e/test_goodput_faults.py``; this prints them.

    python -m bench.goodput_faults                        # ~3 min on a loaded 2-core box
    python -m bench.goodput_faults --shapes steady,few-workers --scale 2
    python -m bench.goodput_faults --two-node
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.goodput_runs import (
    STRAGGLER_CAUSES,
    findings_of,
    goodput_of,
    script_clock,
    step_waits,
    train_script,
)
from tests.eventually import eventually
from tests.sidecar_process import SidecarProcess

REPO = Path(__file__).resolve().parents[1]

TOKEN = "goodput-faults-bench-token-0123456789"  # the two-node shape's write token
SHAPES = ("healthy", "steady", "few-workers", "slowing", "faults", "straggler", "two-node")
SAID = ("input_bound", "straggler", "throughput_drop")  # the findings that name a bucket


@dataclass
class Row:
    """One bucket: what was injected (``nominal``: the script's arguments), what the script's
    clock measured of it (``clock``: the sleep as it really lasted, with the real work beside
    it), and the ledger's seconds."""

    bucket: str
    nominal: float | None
    clock: float | None
    ledger: float


@dataclass
class Shape:
    run_id: str
    what: str
    g: dict[str, Any]
    wall: float  # the script's clock: first event to last
    rows: list[Row]
    url: str
    notes: list[str] = field(default_factory=list)


def _n(steps: int, scale: float) -> int:
    return max(2, round(steps * scale))


def _first_step_after(clock: list[dict[str, Any]], t: float) -> dict[str, Any]:
    return next(e for e in clock if e["event"] == "step" and e["time"] > t)


def _startup(g: dict[str, Any], clock: list[dict[str, Any]]) -> Row:
    """The ledger's start-up against the script's "up" to its first step (the ledger's is
    that less a typical step: at most the clock's)."""
    ups = [e for e in clock if e["event"] == "up"]
    before = sum(_first_step_after(clock, up["time"])["time"] - up["time"] for up in ups)
    return Row("startup (<= clock)", None, before, g["badput_seconds"]["startup"])


def _single(url: str, out: Path, run_id: str, what: str, *args: str,
            nominal: float | None = None, prefetch: bool = False) -> Shape:
    """One process; its input bucket against every wait for a batch the script measured
    (with prefetching workers, less the first: it spawned them, which is start-up)."""
    train_script(url, run_id, out, *args)
    g, clock = goodput_of(url, run_id), script_clock(out)
    waits = step_waits(clock)
    rows = [Row("input", nominal, sum(waits[1:] if prefetch else waits),
                g["badput_seconds"]["input"]), _startup(g, clock)]
    notes = [f"first wait (spawned the workers, partly start-up): {waits[0]:.3f} s"] \
        if prefetch else []
    return Shape(run_id, what, g, clock[-1]["time"] - clock[0]["time"], rows, url, notes)


def healthy(url: str, out: Path, scale: float) -> Shape:
    s = _single(url, out, "gpb-healthy", f"{_n(30, scale)} steps of 1 s, two prefetching "
                "workers, nothing injected", "--steps", str(_n(30, scale)), "--step-time",
                "1.0", "--workers", "2", nominal=0.0, prefetch=True)
    bad = s.g["badput_seconds"]
    started = s.g["wall_seconds"] - bad["startup"]
    s.notes.append(f"goodput once started: {100 * s.g['productive_seconds'] / started:.2f}% "
                   f"({s.g['productive_seconds']:.2f} s of {started:.2f} s after start-up)")
    return s


def steady(url: str, out: Path, scale: float) -> Shape:
    n = _n(60, scale)
    return _single(url, out, "gpb-steady", f"no prefetch, {n} batches of 100 ms load, "
                   "25 ms compute", "--steps", str(n), "--load-time", "0.1", nominal=n * 0.1)


def few_workers(url: str, out: Path, scale: float) -> Shape:
    n = _n(60, scale)
    return _single(url, out, "gpb-few-workers", f"one prefetching worker, {n} batches of "
                   "100 ms load, 25 ms compute", "--steps", str(n), "--load-time", "0.1",
                   "--workers", "1", nominal=(n - 1) * (0.1 - 0.025), prefetch=True)


def slowing(url: str, out: Path, scale: float) -> Shape:
    fast, slow = _n(130, scale), _n(40, scale)
    return _single(url, out, "gpb-slowing", f"{fast} steps at full speed, then {slow} of "
                   "100 ms load", "--steps", str(fast + slow), "--load-time", "0.1",
                   "--load-from", str(fast + 1), nominal=slow * 0.1)


def faults(url: str, out: Path, scale: float) -> Shape:
    run_id, gap = "gpb-faults", 1.5
    args = ["--steps", "200", "--watchdog-floor", "1", "--slow-batches", "20,40,80,110",
            "--loader-sleep", "0.3", "--eval-at", "50,100", "--eval-sleep", "0.5",
            "--ckpt-at", "60,120", "--ckpt-sleep", "0.5", "--hang-at", "90", "--hang", "3"]
    train_script(url, run_id, out, *args, "--crash-at", "150", ok=False)
    time.sleep(gap)  # the launcher's relaunch gap
    train_script(url, run_id, out, *args, "--resume", str(out / "ckpt-120.pt"))
    g, clock = goodput_of(url, run_id), script_clock(out)
    bad = g["badput_seconds"]
    at = {(e["event"], e["step"]): e for e in clock}
    crash, ups = at["crash", 150], [e for e in clock if e["event"] == "up"]
    steps = [e for e in clock if e["event"] == "step"]
    waited = sum(e["wait"] for e in steps if 120 < e["step"] <= 150
                 and e["time"] <= crash["time"])
    redone = crash["time"] - at["step", 120]["time"] - at["ckpt", 120]["seconds"] - waited
    rows = [
        Row("input", 4 * 0.3, sum(e["wait"] for e in steps), bad["input"]),
        Row("eval", 2 * 0.5, sum(e["seconds"] for e in clock if e["event"] == "eval"),
            bad["eval"]),
        Row("checkpoint", 2 * 0.5, sum(e["seconds"] for e in clock if e["event"] == "ckpt"),
            bad["checkpoint"]),
        Row("hang (both halves)", 3.0, None, bad["hang_undetected"] + bad["hang_detected"]),
        Row("restart", gap, ups[1]["time"] - crash["time"], bad["restart"]),
        Row("resume (steps 121-150 redone)", None, redone, bad["resume"]),
        _startup(g, clock),
    ]
    notes = [f"hang: {bad['hang_undetected']:.2f} s before the watchdog's report, "
             f"{bad['hang_detected']:.2f} s after (watchdog limit 1 s, wakes once a second)",
             "input nominal: the four slow batches only; the clock adds every batch's own load"]
    return Shape(run_id, "slow batches, evals, checkpoints, a hang, a crash and a relaunch",
                 g, clock[-1]["time"] - ups[0]["time"], rows, url, notes)


def straggler(url: str, out: Path, scale: float) -> Shape:
    run_id, n = "gpb-straggler", _n(40, scale)
    train_script(url, run_id, out, "--steps", str(n), "--slow-rank", "1", "--slow", "0.1", world=2)
    g = goodput_of(url, run_id)
    slept = {r: sum(e["slept"] for e in script_clock(out, rank=r) if e["event"] == "step"
                    and e["step"] > 1) for r in (0, 1)}
    clock = script_clock(out, rank="*")
    rows = [Row("straggler_compute", (n - 1) * 0.1, slept[1] - slept[0],
                g["badput_seconds"]["straggler_compute"])]
    return Shape(run_id, f"2 gloo ranks, rank 1's compute 100 ms slower, {n} steps", g,
                 clock[-1]["time"] - clock[0]["time"], rows, url)


def two_node(out: Path, scale: float) -> Shape:
    run_id, n = "gpb-two-nodes", _n(40, scale)
    config = out / "config.yaml"
    out.mkdir(parents=True, exist_ok=True)
    config.write_text(f"tick_interval_seconds: 0.5\ntoken: {TOKEN}\n")
    leader = SidecarProcess(out / "leader", config=config)
    node = SidecarProcess(out / "node1", config=config,
                          env={"MONITOR_AGENT_CLUSTER__LEADER_URL": leader.url})
    try:
        leader.start()
        node.start()

        def node_env(rank: int) -> dict[str, str]:
            return {"MONITOR_AGENT_URL": (leader, node)[rank].url,
                    "MONITOR_AGENT_TOKEN": TOKEN, "GROUP_RANK": str(rank),
                    "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                    "NODE_NAME": f"gpu-node-{rank}",
                    "MONITOR_AGENT_SPOOL_DIR": str(out / f"spool-node{rank}")}

        train_script(None, run_id, out / "run", "--steps", str(n), "--load-time", "0.1",
               "--load-rank", "1", world=2, env_of=node_env)

        def settled() -> dict[str, Any]:
            ended = {r["rank"] for r in leader.records(run_id) if r["kind"] == "end"}
            assert ended == {0, 1}, ended  # node 1's records reached the leader
            return goodput_of(leader.url, run_id)

        g = eventually(settled, timeout=60, what="the leader holds both ranks' ends")
        waits = {r: step_waits(script_clock(out / "run", rank=r)) for r in (0, 1)}
        clock = script_clock(out / "run", rank="*")
        bad = g["badput_seconds"]
        rows = [Row("straggler_data", (n - 1) * 0.1, sum(waits[1][1:]) - sum(waits[0][1:]),
                    bad["straggler_data"]),
                Row("input (rank 0's own waits)", None, sum(waits[0]), bad["input"])]
        shape = Shape(run_id, f"2 nodes x 1 rank, rank 1's batches 100 ms to load, {n} steps",
                      g, clock[-1]["time"] - clock[0]["time"], rows, leader.url,
                      _said(leader.url, run_id))  # before the sidecars stop
        return shape
    finally:
        node.stop()
        leader.stop()


def _said(url: str, run_id: str) -> list[str]:
    """The run's findings by type, and what the ones that name a bucket say."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for f in findings_of(url, run_id):
        by_type.setdefault(f["type"], []).append(f)
    lines = ["findings: " + (", ".join(f"{t} x{len(fs)}" for t, fs in sorted(by_type.items()))
                             or "none")]
    lines += [f"  {t}: {by_type[t][0]['message']}" for t in SAID if t in by_type]
    return lines


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def report(s: Shape, took: float, said: list[str]) -> None:
    g, bad = s.g, s.g["badput_seconds"]
    print(f"\n== {s.run_id}: {s.what} (ran {took:.0f} s)")
    print(f"   {'bucket':<32}{'injected s':>11}{'clock s':>10}{'ledger s':>10}{'ratio':>8}")
    for r in s.rows:
        ref = r.clock if r.clock is not None else r.nominal
        ratio = f"{r.ledger / ref:.3f}" if ref else "-"
        print(f"   {r.bucket:<32}{_f(r.nominal):>11}{_f(r.clock):>10}{r.ledger:>10.3f}"
              f"{ratio:>8}")
    total = g["productive_seconds"] + sum(bad.values())
    print(f"   buckets sum {total:.3f} s vs the script's wall {s.wall:.3f} s "
          f"({100 * (total / s.wall - 1):+.2f}%); unaccounted {bad['unaccounted']:.3f} s "
          f"({100 * bad['unaccounted'] / s.wall:.2f}%)")
    other = {k: round(v, 3) for k, v in bad.items() if v and k not in
             {r.bucket.split()[0] for r in s.rows} | {"unaccounted", "hang_undetected",
                                                       "hang_detected"}}
    if other:
        print(f"   other buckets: {other}")
    if any(bad[c] for c in STRAGGLER_CAUSES) and g.get("straggler"):
        print(f"   straggler: {g['straggler'].get('who')}")
    print(f"   ledger: {g['summary']}")
    for line in s.notes + said:
        print(f"   {line}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES[:-1]),
                   help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--two-node", action="store_true", help="add the 2-node shape")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiplies each shape's step count (not faults')")
    args = p.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    if args.two_node and "two-node" not in shapes:
        shapes.append("two-node")
    unknown = set(shapes) - set(SHAPES)
    if unknown:
        p.error(f"unknown shapes {sorted(unknown)}; known: {', '.join(SHAPES)}")
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                         capture_output=True, text=True).stdout.strip()
    print(f"goodput faults: revision {rev}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}; shapes {', '.join(shapes)}; scale {args.scale}")
    print("injected: the script's arguments; clock: what the script's own clock measured of "
          "it; ratio: ledger / clock (/ injected where the clock has none)")
    runs: dict[str, Callable[[str, Path, float], Shape]] = {
        "healthy": healthy, "steady": steady, "few-workers": few_workers,
        "slowing": slowing, "faults": faults, "straggler": straggler}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        local = [s for s in shapes if s != "two-node"]
        if local:
            with SidecarProcess(Path(tmp) / "data") as sc:
                for name in local:
                    t0 = time.perf_counter()
                    shape = runs[name](sc.url, Path(tmp) / name, args.scale)
                    report(shape, time.perf_counter() - t0, _said(sc.url, shape.run_id))
        if "two-node" in shapes:
            t0 = time.perf_counter()
            shape = two_node(Path(tmp) / "two-node", args.scale)
            report(shape, time.perf_counter() - t0, [])
    print(f"\ntotal {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
