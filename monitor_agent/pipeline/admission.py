"""What one request may add to the sidecar's memory: new runs, and new ranks.

Bytes and values are budgeted at the edge (``api/body.py``), but what a record costs
once admitted depends on whether it is the first of its run or rank: a new run brings a
detector suite into memory (~150 KiB, ``bench/chaos.py --sections amplification``), a new
rank its counters and per-rank detector state (~35 KiB). So a request may bring at most
``max_new_runs_per_request`` runs and ``max_new_ranks_per_request`` ranks into memory, and
no run holds more than ``max_ranks_per_run`` ranks (a multi-node run's leader holds every
rank of it, each node's sidecar bringing its own); a record over any is rejected alone,
with a reason naming the budget, before anything is built for it.

A run with 2 ranks meets a cap of 2; its third rank is refused, its own ranks are not::

    >>> from monitor_agent.runs.run_state import RunState
    >>> from monitor_agent.settings import Settings
    >>> budget = AdmissionBudget(Settings(max_ranks_per_run=2, max_new_runs_per_request=1))
    >>> run = RunState.new("r1", now=0.0)
    >>> budget.refuse_rank(run, 0), budget.refuse_rank(run, 1), budget.refuse_rank(run, 0)
    (None, None, None)
    >>> print(budget.refuse_rank(run, 7))
    rank 7 would be run r1's third rank, more than max_ranks_per_run=2
    >>> budget.took_run("r1"); print(budget.refuse_run("r2"))
    run r2 is new, and this request brought max_new_runs_per_request=1 runs into memory already; send its records again in another request

A request that would bring a thousand new ranks brings ``max_new_ranks_per_request``::

    >>> budget = AdmissionBudget(Settings(max_new_ranks_per_request=2))
    >>> print([budget.refuse_rank(run, r) for r in range(3)][-1])
    rank 2 of run r1 is new, and this request brought max_new_ranks_per_request=2 ranks into memory already; send its records again in another request
"""

from __future__ import annotations

from monitor_agent.runs.run_state import RunState
from monitor_agent.settings import Settings


class AdmissionBudget:
    """One request's count of the runs and ranks it brought into memory."""

    def __init__(self, settings: Settings) -> None:
        self.max_new_runs = settings.max_new_runs_per_request
        self.max_ranks = settings.max_ranks_per_run
        self.max_new_ranks = settings.max_new_ranks_per_request
        self._runs: set[str] = set()
        self._ranks: dict[str, set[int]] = {}  # ranks of this request not in the run yet
        self._new_ranks = 0

    def refuse_run(self, run_id: str) -> str | None:
        """Why a run not in memory may not be loaded for this request; None: it may."""
        if len(self._runs) < self.max_new_runs:
            return None
        return (f"run {run_id} is new, and this request brought max_new_runs_per_request="
                f"{self.max_new_runs} runs into memory already; send its records again in "
                "another request")

    def took_run(self, run_id: str) -> None:
        self._runs.add(run_id)

    def refuse_rank(self, run: RunState, rank: int) -> str | None:
        """Why a record of ``rank`` may not join ``run``; None: the rank is known, or fits
        (it is counted from now on, whether or not the record is stored)."""
        if rank in run.ranks:
            return None
        pending = self._ranks.setdefault(run.run_id, set())
        if rank in pending:
            return None
        if self._new_ranks >= self.max_new_ranks:
            return (f"rank {rank} of run {run.run_id} is new, and this request brought "
                    f"max_new_ranks_per_request={self.max_new_ranks} ranks into memory "
                    "already; send its records again in another request")
        if len(run.ranks) + len(pending) < self.max_ranks:
            pending.add(rank)
            self._new_ranks += 1
            return None
        nth = len(run.ranks) + len(pending) + 1
        return (f"rank {rank} would be run {run.run_id}'s {_ordinal(nth)} rank, more than "
                f"max_ranks_per_run={self.max_ranks}")


def _ordinal(n: int) -> str:
    words = {1: "first", 2: "second", 3: "third"}
    if n in words:
        return words[n]
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
