"""What the goodput ledger costs the engine thread per record (``GoodputLedger.feed``,
monitor_agent/runs/goodput.py), on a realistic stream, and what a read (``report``) costs.

The stream: one run of ``--ranks`` data-parallel ranks (default 8) for ``--steps`` steps,
rank by rank per step as they arrive, each step record with its ``step_time``,
``data_time`` and ``sync_wait_time`` (rank ``--ranks - 1`` the slow one), an evaluation
every 250 steps and a checkpoint every 500 (rank 0, with their ``seconds``), and a hang
reported once. Records are made before the clock starts: the figure is the ledger's own
work, not parsing or storage. Past 1024 steps the ledger also trims the step marks a
resume's discard reads, so the figure is given before and after that point too.

    python -m bench.goodput_ledger                 # 8 ranks x 20,000 steps
    python -m bench.goodput_ledger --ranks 64 --steps 5000
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from monitor_agent.records.types import (
    CheckpointRecord,
    EvalRecord,
    HangRecord,
    Record,
    RunRecord,
    StepRecord,
)
from monitor_agent.runs.goodput import MARKS_KEPT, GoodputLedger


def stream(ranks: int, steps: int, seed: int = 0) -> list[Record]:
    rng = random.Random(seed)
    t = 1_000_000.0
    out: list[Record] = [RunRecord("bench", time=t, rank=r, hardware={"world_size": ranks})
                         for r in range(ranks)]
    for step in range(1, steps + 1):
        data = 0.002 + abs(rng.gauss(0.0, 0.0005)) + (0.3 if step % 997 == 0 else 0.0)
        t += 0.25 + data + (30.0 if step == steps // 2 else 0.0)
        for r in range(ranks):
            slow = 0.02 if r == ranks - 1 else 0.0
            out.append(StepRecord("bench", step, time=t, rank=r, loss=2.0, step_time=0.25,
                                  data_time=data, sync_wait_time=0.03 - slow + 0.02,
                                  compute_time=0.2 + slow))
        if step == steps // 2 - 1:
            out.append(HangRecord("bench", step, time=t + 20.0, stuck_seconds=20.0))
        if step % 250 == 0:
            out.append(EvalRecord("bench", step, time=t + 1.0, val_loss=2.0, seconds=1.0))
            t += 1.0
        if step % 500 == 0:
            out.append(CheckpointRecord("bench", step, time=t + 2.0, path=f"/c/{step}",
                                        seconds=2.0))
            t += 2.0
    return out


def feed_once(records: list[Record], split_at: int) -> tuple[float, float, GoodputLedger]:
    """Seconds spent feeding the records before ``split_at`` and from it on."""
    book = GoodputLedger()
    feed = book.feed
    t0 = time.perf_counter()
    for row, record in enumerate(records[:split_at], 1):
        feed(record, 1, row)
    t1 = time.perf_counter()
    for row, record in enumerate(records[split_at:], split_at + 1):
        feed(record, 1, row)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, book


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    records = stream(args.ranks, args.steps)
    # The first record of step MARKS_KEPT + 1: from there on the marks are trimmed.
    split = next(i for i, r in enumerate(records)
                 if isinstance(r, StepRecord) and r.step > MARKS_KEPT)
    early, late = [], []
    book = GoodputLedger()
    for _ in range(args.repeats):
        a, b, book = feed_once(records, split)
        early.append(a / split)
        late.append(b / (len(records) - split))
    reads = []
    for _ in range(50):
        t0 = time.perf_counter()
        book.report(now=1e12)
        reads.append(time.perf_counter() - t0)
    print(f"stream: {args.ranks} ranks x {args.steps} steps = {len(records)} records "
          f"(median of {args.repeats} feeds)")
    print(f"feed steps 1-{MARKS_KEPT}: {1e6 * statistics.median(early):.2f} us/record")
    print(f"feed steps {MARKS_KEPT + 1}-{args.steps}: {1e6 * statistics.median(late):.2f} "
          "us/record")
    print(f"report: {1e6 * statistics.median(reads):.0f} us")
    print(f"summary: {book.report().summary()}")


if __name__ == "__main__":
    main()
