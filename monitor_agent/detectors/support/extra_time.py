"""Where a straggler's extra time goes: its extra data loading, its extra compute, or
neither (late to the collective: its link, its host). ``straggler`` names the largest part
as the cause; the goodput ledger's straggler tax (runs/straggler_tax.py) charges each part.

Under synchronous data parallelism every rank leaves the all-reduce together, so in one
step the others' wait less the straggler's is exactly how much later it arrived: its extra
data + its extra compute + its extra time outside both. That identity holds for sums (and
means) over many steps, not for medians: the median of a tight cluster (a loader's times)
and that of a wide one (waits at a loaded host) move at different steps after the same
change, so a split of medians names whichever part's median moved first. Split sums or
means of the same steps.

``late``: the others' extra wait (the seconds they spend waiting for it); ``data`` and
``compute``: its extra over theirs, NaN where unsaid (counted as none). Its own work
explains all of the wait it causes, and more (the others wait less than it works extra:
another rank is slow too), or only part of it: the rest is outside its own work::

    >>> {p: round(s, 3) for p, s in split_extra(late=0.30, data=0.28, compute=0.01).items()}
    {'compute': 0.01, 'data': 0.28, 'collective': 0.01}
    >>> largest(split_extra(late=0.30, data=0.01, compute=0.0))
    'collective'
    >>> split_extra(late=0.10, data=0.15, compute=0.05) == {  # shared in proportion
    ...     "compute": 0.10 * 0.05 / 0.2, "data": 0.10 * 0.15 / 0.2, "collective": 0.0}
    True
    >>> largest(split_extra(late=float("nan"), data=0.2, compute=float("nan")))
    'data'
"""

from __future__ import annotations

from monitor_agent.detectors.support.stats import finite

PARTS: tuple[str, ...] = ("compute", "data", "collective")
"""The parts, in the order a tie names them: its own compute before its data, either before
"late for reasons outside both" (a claim about what was not measured)."""


def split_extra(late: float, data: float, compute: float) -> dict[str, float]:
    """Seconds per part (``PARTS``) of the extra time a straggler costs (module docstring).
    Without a wait to split (``late`` NaN: the client timed no all-reduce; or nobody waits
    for it) its own extras, as they are."""
    extra_data = max(data, 0.0) if finite(data) else 0.0
    extra_compute = max(compute, 0.0) if finite(compute) else 0.0
    own = extra_data + extra_compute
    if not (finite(late) and late > 0):
        return {"compute": extra_compute, "data": extra_data, "collective": 0.0}
    if own >= late:  # its own work explains the whole wait: shared in proportion
        return {"compute": late * extra_compute / own, "data": late * extra_data / own,
                "collective": 0.0}
    return {"compute": extra_compute, "data": extra_data, "collective": late - own}


def largest(parts: dict[str, float]) -> str:
    """The part with the most seconds; ties go to the earlier of ``PARTS``."""
    return max(PARTS, key=lambda p: parts[p])
