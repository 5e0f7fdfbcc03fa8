"""What the fault-injection cluster of tests/netcluster achieves on this machine: how long
it takes to come up, a torchrun elastic job's rendezvous and first step, the slowdown a
CPU throttle of one node achieves against the factor asked for, what a capped link does to
a step, and how long torchrun takes to restart the group after a SIGKILL.

A job of ``--nodes`` x ``--nproc`` ranks (gloo, CPU, one sidecar per node), compute-bound
steps (``--width``, ``--layers``), runs throughout; each phase is measured over
``--window`` steps after ``--settle`` steps of settling:

* baseline: the job's step time (rank 0's step-to-step wall time, median);
* throttle ``f`` for each ``--factors``: node 1's CPU quota cut to what it used / f, then
  held at ``f`` by the controller of netcluster/throttle.py for ``--converge`` seconds;
  achieved: node 1's compute (forward and backward up to the all-reduce) over the other
  nodes' in the same steps (the controller's own measure), the compute time its ranks' clients report to their sidecar over the
  others', and the job's step time over the baseline (in lockstep the slow node sets the
  pace; how much depends on the share of the step that is compute);
* ``--rate``: node 1's link capped by tc tbf, the step time over the baseline;
* SIGKILL of node 1's local rank 0: seconds to the first step of the restarted group, and
  the checkpoint it resumed from;
* the last node leaves (agent and ranks SIGKILLed; the job runs ``--nnodes=N-1:N``):
  seconds until the other nodes train again without it.

Needs root. Run: ``python -m bench.netcluster_check [--nodes 4] [--factors 1.1,1.3,2]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.netcluster import Cluster, unavailable
from tests.netcluster.elastic import ElasticJob

SICK = 1  # the node every fault goes to


JOB: ElasticJob | None = None


def wait_for(check: Any, what: str, timeout: float = 600.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if JOB is not None and any(p.poll() is not None for i, p in JOB.procs.items()
                                   if i not in JOB.left):
            raise SystemExit(f"an agent exited while waiting for {what}:\n{JOB.logs()}")
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}" + (f"\n{JOB.logs()}" if JOB else ""))


def rank0_steps(job: ElasticJob) -> list[dict[str, Any]]:
    """Rank 0's newest steps (its current process)."""
    return [e for e in job.recent("step", tail_bytes=1 << 18) if e["rank"] == 0]


def last_step(job: ElasticJob) -> int:
    steps = rank0_steps(job)
    return steps[-1]["step"] if steps else 0


def window(job: ElasticJob, settle: int, size: int) -> tuple[int, int, float, float]:
    """Let ``settle`` steps pass, then measure ``size``: (first, last, median step s, the
    sick node's median compute over the other nodes')."""
    start = last_step(job) + settle
    wait_for(lambda: last_step(job) >= start + size, f"step {start + size}")
    events = [e for e in job.recent("step", tail_bytes=1 << 18)
              if start <= e["step"] <= start + size]
    times = {e["step"]: e["time"] for e in events if e["rank"] == 0}
    gaps = [times[s] - times[s - 1] for s in range(start + 1, start + size + 1)
            if s in times and s - 1 in times]
    sick = statistics.median(e["compute_seconds"] for e in events if e["node"] == SICK)
    rest = statistics.median(e["compute_seconds"] for e in events if e["node"] != SICK)
    return start, start + size, statistics.median(gaps), sick / rest


def compute_times(cluster: Cluster, run: str, node: int, first: int, last: int) -> float:
    """Median ``compute_time`` node ``node``'s ranks reported for steps first..last."""
    assert cluster.sidecars is not None
    body = cluster.sidecars.get(node, f"/v1/runs/{run}/records", since_step=first - 1,
                                limit=10000)
    values = [r["compute_time"] for r in body["records"] if r.get("kind") == "step"
              and first <= r["step"] <= last and r.get("compute_time") is not None]
    return statistics.median(values) if values else float("nan")


def others(cluster: Cluster, run: str, first: int, last: int) -> float:
    vals = [compute_times(cluster, run, n, first, last) for n in range(len(cluster.workers))
            if n != SICK]
    return statistics.median(vals)


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress as it goes
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--factors", default="1.1,1.3,2", help="'' for none")
    p.add_argument("--rate", default="200mbit",
                   help="node 1's link cap (a step all-reduces ~2x the 2.4 MB of gradients; "
                   "'' for none)")
    p.add_argument("--settle", type=int, default=5)
    p.add_argument("--window", type=int, default=30)
    p.add_argument("--converge", type=float, default=20.0,
                   help="seconds the throttle's controller gets before a window")
    p.add_argument("--keep", type=Path, help="work in this directory and keep it (logs)")
    args = p.parse_args()
    why = unavailable()
    if why:
        raise SystemExit(f"netcluster: {why}")
    run = "netcluster-check"
    with tempfile.TemporaryDirectory() as tmp, Cluster(args.keep or Path(tmp),
                                                       nodes=args.nodes) as cluster:
        t0 = time.monotonic()
        print(f"{args.nodes} nodes x {args.nproc} ranks, width {args.width} x {args.layers} "
              f"layers, batch {args.batch}")
        cluster.start_sidecars()
        print(f"sidecars up: {time.monotonic() - t0:.1f} s")
        job = cluster.elastic_job(run, steps=10**7, nproc_per_node=args.nproc,
                                  min_nodes=args.nodes - 1, checkpoint_every=100,
                                  max_restarts=3, script_args=[
                                      f"--width={args.width}", f"--layers={args.layers}",
                                      f"--batch={args.batch}"])
        global JOB
        JOB = job
        t_job = time.time()
        job.start()
        world = args.nodes * args.nproc
        wait_for(lambda: len(job.events("start")) >= world, "every rank in the group")
        starts = job.events("start")
        print(f"rendezvous + process group: {max(e['time'] for e in starts) - t_job:.1f} s "
              f"after the agents started (torch imports included)")
        wait_for(lambda: last_step(job) >= 1, "the first step")
        print(f"first step: {rank0_steps(job)[0]['time'] - t_job:.1f} s after the agents started")

        a, b, base, base_fwd = window(job, args.settle, args.window)
        base_sick = compute_times(cluster, run, SICK, a, b)
        base_other = others(cluster, run, a, b)
        print(f"baseline: step {base * 1000:.0f} ms; node{SICK}'s compute / the others' "
              f"{base_fwd:.2f}; its compute (client) {base_sick * 1000:.0f} ms, the others' "
              f"{base_other * 1000:.0f} ms")
        print(f"throttle of node{SICK}, held for {args.converge:g} s, then {args.window} steps:")
        print("asked  open-loop cores  held cores  compute x peers  compute x peers (client)"
              "  step x baseline")
        for factor in [float(f) for f in args.factors.split(",") if f]:
            held = cluster.faults.throttle(SICK, factor, job=job)
            open_loop = held.quota_cores
            time.sleep(args.converge)
            a, b, step, fwd = window(job, args.settle, args.window)
            sick = compute_times(cluster, run, SICK, a, b)
            other = others(cluster, run, a, b)
            cluster.faults.unthrottle(SICK)
            print(f"{factor:5.2f}  {open_loop:15.2f}  {held.quota_cores:10.2f}  {fwd:15.2f}  "
                  f"{sick / other:24.2f}  {step / base:15.2f}")
            window(job, args.settle, 2)

        if args.rate:
            cluster.faults.cap_link(SICK, rate=args.rate)
            a, b, step, _ = window(job, args.settle, args.window)
            cluster.faults.uncap_link(SICK)
            print(f"link of node{SICK} capped at {args.rate}: step x {step / base:.2f}")

        before = last_step(job)
        t_kill = time.time()
        cluster.faults.kill_rank(SICK, 0)
        resumed = wait_for(lambda: [e for e in job.recent("resume") if e["rank"] == 0],
                           "the restarted group")
        pid = resumed[0]["pid"]
        first = wait_for(lambda: [e for e in rank0_steps(job) if e["pid"] == pid],
                         "a step of the restarted group")[0]
        print(f"SIGKILL of node{SICK} rank 0 at step ~{before}: training again after "
              f"{first['time'] - t_kill:.1f} s, from checkpoint step {resumed[0]['step']}")

        gone = args.nodes - 1
        wait_for(lambda: last_step(job) >= first["step"] + args.settle, "the group going")
        before, t_leave = last_step(job), time.time()
        job.leave(gone)
        world = (args.nodes - 1) * args.nproc
        resumed = wait_for(lambda: [e for e in job.recent("resume")
                                    if e["rank"] == 0 and e["world"] == world], "re-formed")
        first = wait_for(lambda: [e for e in rank0_steps(job) if e["pid"] == resumed[0]["pid"]],
                         "a step of the re-formed group")[0]
        print(f"node{gone} leaves at step ~{before}: the other {args.nodes - 1} nodes train "
              f"again after {first['time'] - t_leave:.1f} s, from checkpoint step "
              f"{resumed[0]['step']}")
        job.kill()


if __name__ == "__main__":
    main()
