"""Which rank of a data-parallel run went non-finite first, from each rank's own record.

Under DDP a NaN born on one rank reaches every rank through the gradient all-reduce of the
same step: the rank that made it has a non-finite *local* value (its ``loss``, computed
before any collective), the others a finite loss and a non-finite ``grad_norm`` (measured
after the all-reduce, so it is the same on every rank), and from the next step on every
rank's weights, and so its loss, are NaN too. So the first rank is the one with the
earliest non-finite step whose local loss is non-finite there; the others *followed*,
through the collective at that step or through the poisoned update after it.

``attribute`` is the pure wording of that decision over what each rank showed at its first
non-finite step (its ``RankBreak``); ``NanInfDetector`` (nan_inf.py) decides when enough
ranks have reported to make it, and pages once for the run.

Rank 2's local loss went NaN at step 412; ranks 0, 1 and 3 saw it in the reduced gradient::

    >>> nan = float("nan")
    >>> breaks = {2: RankBreak(412, ["loss", "grad_norm"], nan, nan),
    ...           **{r: RankBreak(412, ["grad_norm"], 2.1, nan) for r in (0, 1, 3)}}
    >>> who = attribute(breaks, {0: 413, 1: 413, 2: 412, 3: 413}, {2: "gpu-node-3"})
    >>> who.lead
    [2]
    >>> print(who.message)
    NaN first on rank 2 (host gpu-node-3) at step 412: its local loss is nan; ranks 0, 1, 3
    followed at step 412 through the gradient all-reduce (their loss finite, grad_norm nan)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class RankBreak:
    """What one rank's own record showed at its first non-finite step of an episode."""

    step: int
    fields: list[str]            # its non-finite global fields (nan_inf's rule)
    loss: float | None           # local: computed before any collective
    grad_norm: float | None      # after DDP's all-reduce: the same on every rank

    @property
    def local(self) -> bool:
        """Its own computation was non-finite, not only what the collective handed it."""
        return "loss" in self.fields


@dataclass(frozen=True, slots=True)
class Attribution:
    """The run-level answer: the ranks named first (``lead``), a sentence, the evidence."""

    lead: list[int]
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


def attribute(breaks: dict[int, RankBreak], last_steps: dict[int, int],
              hosts: dict[int, str | None]) -> Attribution:
    """Name the first rank(s) among ``breaks`` (each rank's first non-finite step);
    ``last_steps`` holds every known rank's latest reported step (the ranks still finite
    are told apart from the ones not heard of), ``hosts`` their host labels."""
    first = min(b.step for b in breaks.values())
    at_first = sorted(r for r, b in breaks.items() if b.step == first)
    local = [r for r in at_first if breaks[r].local]
    everyone = sorted(set(last_steps) | set(breaks))
    lead = local or at_first
    rest = [r for r in everyone if r not in lead]
    evidence: dict[str, Any] = {
        "first_rank": lead[0] if len(local) == 1 else None,
        "first_host": hosts.get(lead[0]) if len(local) == 1 else None,
        "first_step": first,
        "first_ranks": _ranks(lead),
        "followed": _ranks([r for r in rest if r in breaks]),
        "still_finite": _ranks([r for r in rest if r not in breaks]),
        "ranks": len(everyone),
    }
    if local and len(local) == len(everyone):
        head = (f"NaN at step {first} in every rank's local loss at once (ranks "
                f"{_ranks(local)}): a shared cause (the weights, the LR, data every rank "
                f"reads), not one rank")
        return Attribution(lead, head, evidence)
    if local:
        b = breaks[local[0]]
        if len(local) == 1:
            head = (f"NaN first on rank {local[0]}{_host(hosts, local[0])} at step {first}: "
                    f"its local loss is {_word(b.loss)}")
        else:
            head = (f"NaN first on ranks {_ranks(local)} at step {first}: their local losses "
                    f"are {_word(b.loss)}")
    else:
        head = (f"NaN at step {first} on ranks {_ranks(at_first)} through the gradient "
                f"all-reduce, every local loss finite: the collective hides which rank's "
                f"backward pass made it")
    follow = _followers(breaks, rest, last_steps, first)
    return Attribution(lead, "; ".join([head, *follow]), evidence)


def _followers(breaks: dict[int, RankBreak], rest: list[int], last_steps: dict[int, int],
               first: int) -> list[str]:
    """One clause per way the other ranks followed (or did not)."""
    groups: dict[tuple[int, str], list[int]] = {}
    for r in rest:
        b = breaks.get(r)
        if b is None:
            continue
        if not b.local:
            how = (f"through the gradient all-reduce (their loss finite, grad_norm "
                   f"{_word(b.grad_norm)})")
        elif b.step > first:
            how = "through the update that applied it (their loss non-finite)"
        else:
            how = "in their own loss"
        groups.setdefault((b.step, how), []).append(r)
    out = [f"{_noun(rs)} {_ranks(rs)} followed at step {s} {how}"
           for (s, how), rs in sorted(groups.items())]
    quiet = [r for r in rest if r not in breaks]
    if quiet:
        last = min(last_steps.get(r, -1) for r in quiet)
        seen = "still finite" if last >= first else "not heard from since"
        out.append(f"{_noun(quiet)} {_ranks(quiet)} {seen} (step {last})")
    return out


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _noun(ranks: list[int]) -> str:
    return "rank" if len(ranks) == 1 else "ranks"


def _host(hosts: dict[int, str | None], rank: int) -> str:
    host = hosts.get(rank)
    return f" (host {host})" if host else ""


def _word(x: float | None) -> str:
    """nan, inf or -inf, as the record had it."""
    if x is None or math.isfinite(x):
        return "non-finite"
    return str(x)
