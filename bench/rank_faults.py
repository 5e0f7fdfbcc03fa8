"""Rank faults on real DDP runs: how quiet ``rank_outlier`` is on healthy multi-rank runs,
how soon it names a corrupt shard, and what the NaN page says about the first rank.

Each run is 4 processes (gloo on loopback, the real client in each, a real sidecar), the
user-style script of ``tests/e2e/ddp_rank_fault_train.py``:

* ``--healthy N``: N healthy runs (different seeds via the run id) of ``--steps`` steps;
  prints rank_outlier findings per 10,000 rank-steps (and every finding, if any);
* one run whose rank 3 labels are scaled by ``--scale`` from step 40: the step of the first
  warning (detection delay in steps) and its message;
* one run whose rank 2 input batch has a NaN at step 20: the page's message.

Run: ``python -m bench.rank_faults [--healthy 3] [--steps 300]``
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import httpx

from tests.e2e.ddp_job import WORLD, ddp_job
from tests.sidecar_process import SidecarProcess


def findings(sc: SidecarProcess, run_id: str, ftype: str) -> list[dict]:
    body = httpx.get(f"{sc.url}/v1/runs/{run_id}/findings?limit=10000", timeout=30).json()
    return [f for f in body["findings"] if f["type"] == ftype]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--healthy", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--scale", type=float, default=5.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, SidecarProcess(Path(tmp) / "data") as sc:
        false = []
        for k in range(args.healthy):
            run_id = f"healthy-{k}"
            ddp_job(sc.url, run_id, "--steps", str(args.steps), "--seed", str(k))
            false += findings(sc, run_id, "rank_outlier")
        rank_steps = args.healthy * args.steps * WORLD
        if rank_steps:
            print(f"healthy: {args.healthy} runs x {args.steps} steps x {WORLD} ranks = "
                  f"{rank_steps} rank-steps; rank_outlier findings: {len(false)} "
                  f"({1e4 * len(false) / rank_steps:.2f} per 10k rank-steps)")
        for f in false:
            print("   ", f["step"], f["rank"], f["message"])
        ddp_job(sc.url, "shard", "--steps", "120", "--corrupt-rank", "3", "--corrupt-from", "40",
             "--corrupt-scale", str(args.scale))
        found = findings(sc, "shard", "rank_outlier")
        if found:
            print(f"corrupt shard (labels x{args.scale} on rank 3 from step 40): first warning "
                  f"at step {found[0]['step']} ({found[0]['step'] - 40} steps), ranks named "
                  f"{sorted({f['rank'] for f in found})}: {found[0]['message']}")
        else:
            print("corrupt shard: no warning")
        ddp_job(sc.url, "nan", "--steps", "30", "--nan-rank", "2", "--nan-step", "20")
        nan = sorted(findings(sc, "nan", "nan_inf"), key=lambda f: f["step"])
        print(f"NaN input on rank 2 at step 20: {len(nan)} nan_inf finding(s); first: "
              f"{nan[0]['message'] if nan else None}")


if __name__ == "__main__":
    main()
