"""The straggler tax of one attempt, and what the straggler spent it on: the goodput
ledger's ``straggler_data`` / ``straggler_compute`` / ``straggler_collective`` causes
(runs/goodput.py), named the way the ``straggler`` finding names them
(detectors/straggler.py): its data loading, its own compute, or late to the collective.

Under data parallelism every rank waits at the gradient all-reduce for the slowest one, so
the slowest rank is the one that waits *least* (it arrives last). Over an attempt each
rank's ``sync_wait_time``, data wait and compute are summed (``RankSums``, from its second
step: the first one's wait holds the ranks' start-up skew); the straggler is
the least-waiting rank and the **tax** is the median of the *other* ranks' summed waits less
its own: how much shorter the job's steps would have been at the others' pace. Sums, not
per-step figures: the slowest rank of one step is noise and averages out, a rank that is
slow step after step does not. Leaving the straggler out of the median keeps two ranks
exact (one slow rank of two costs its whole extra time, not half of it), and two slow
ranks of four cost their extra time too.

**Its cause** is what the straggler spends its extra time on, against the median of the
other ranks: its extra data wait and its extra compute share the tax in proportion; what
neither explains (its own work is as fast as theirs, and they still wait for it) is the
collective (its link, its host): ``split_extra`` (detectors/support/extra_time.py), with
which the finding names the largest part of its window's means.

**Who** it is: the rank, and its node (the run record's ``node`` / ``hostname`` label).
When every rank of that node (two or more, not the whole job) waits closer to the
straggler than to the others, the node is slow as a whole and is named instead, as the
finding does ("node gpu-1 (ranks 2-3)").

Rank 2 of four loads each batch 0.3 s longer (100 steps); the others wait for it::

    >>> sums = {r: RankSums(wait=100 * (0.31 if r != 2 else 0.01), steps=100,
    ...                     data=100 * (0.3 if r == 2 else 0.0), compute=100 * 0.05)
    ...         for r in range(4)}
    >>> tax = straggler_tax(sums, {r: f"gpu-{r // 2}" for r in range(4)})
    >>> round(tax.seconds, 6), tax.rank, tax.who, {k: round(v, 6) for k, v in tax.parts.items()}
    (30.0, 2, 'rank 2 on gpu-1', {'data': 30.0, 'compute': 0.0, 'collective': 0.0})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from monitor_agent.detectors.support.extra_time import split_extra

PARTS: tuple[str, ...] = ("data", "compute", "collective")
"""What a straggler spends its extra time on (detectors/straggler.py's causes; a throttling
GPU is compute here: the ledger sees its time, not NVML)."""


@dataclass(slots=True)
class RankSums:
    """One rank's summed step parts over an attempt (seconds)."""

    wait: float = 0.0  # sync_wait_time: its wait in the gradient all-reduce
    data: float = 0.0  # its data wait (StepRecord.input_wait)
    compute: float = 0.0  # its own compute (detectors/straggler.py compute_of)
    steps: int = 0

    def to_list(self) -> list[float]:
        return [self.wait, self.data, self.compute, self.steps]

    @classmethod
    def from_list(cls, v: list[float]) -> RankSums:
        return cls(float(v[0]), float(v[1]), float(v[2]), int(v[3]))


@dataclass(frozen=True, slots=True)
class StragglerTax:
    """The tax of one attempt: its seconds, split by ``PARTS``, and who caused it."""

    seconds: float
    rank: int
    node: str | None
    who: str  # "rank 2 on gpu-1", "node gpu-1 (ranks 2-3)"
    parts: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "rank": self.rank, "node": self.node,
                "who": self.who, "parts": dict(self.parts)}


def straggler_tax(sums: dict[int, RankSums], hosts: dict[int, str]) -> StragglerTax | None:
    """The attempt's tax and its cause (module docstring); None with fewer than two ranks
    reporting waits, or when no rank waits less than the others' median."""
    ranks = sorted(r for r, s in sums.items() if s.steps)
    if len(ranks) < 2:
        return None
    # One array, one median per part (a report reads it: 256 ranks in well under 1 ms).
    table = np.array([(sums[r].wait, sums[r].data, sums[r].compute) for r in ranks])
    at = int(np.argmin(table[:, 0]))  # the least-waiting; the lowest rank of equals
    slow, mine = ranks[at], table[at]
    wait, data, compute = np.median(np.delete(table, at, axis=0), axis=0).tolist()
    tax = wait - float(mine[0])
    if not tax > 0:
        return None
    split = split_extra(tax, float(mine[1]) - data, float(mine[2]) - compute)
    parts = {p: split[p] for p in PARTS}
    node = hosts.get(slow)
    return StragglerTax(tax, slow, node, _who(slow, node, sums, ranks, tax, hosts), parts)


def _who(slow: int, node: str | None, sums: dict[int, RankSums], ranks: list[int],
         tax: float, hosts: dict[int, str]) -> str:
    """The rank, or its whole node when every rank of it waits nearer the straggler's wait
    than the others' median (two or more ranks there, and ranks elsewhere too)."""
    if node is None:
        return f"rank {slow}"
    mates = sorted(r for r in ranks if hosts.get(r) == node)
    line = sums[slow].wait + tax / 2
    if 2 <= len(mates) < len(ranks) and all(sums[r].wait <= line for r in mates):
        span = f"ranks {mates[0]}-{mates[-1]}" if mates == list(
            range(mates[0], mates[-1] + 1)) else "ranks " + ",".join(map(str, mates))
        return f"node {node} ({span})"
    return f"rank {slow} on {node}"
