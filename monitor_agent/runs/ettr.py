"""Meta's effective-training-time figures of a run, read from its goodput ledger.

PyTorch's "ETT%" post (April 2026) and Meta's reliability study (Kokolis et al., arXiv
2410.21680) judge a training job's infrastructure by three numbers beside the **effective
training time ratio** (ETTR: productive time over the wall-clock time the job held its
GPUs, the goodput ratio of runs/goodput.py): how long it takes to **start** (from the
process up to its first step), how many times it **failed** (an interruption that needed a
recovery), and how long each **recovery** took, from the failure to training again.

Here, from the ledger's report (``GoodputReport``: its attempts and incidents):

- time to start: the first attempt's start-up (its first record to its first step, less
  one typical step);
- a failure: a hang (it lasts from where the next step should have ended to the step that
  came, or to the relaunch that ended it), or a relaunch after a crash (an attempt that
  resumed without a rollback plan: its gap, from the last record before it). A hang ended
  by a relaunch is one failure, not two, also when its processes left first (an exit 75
  on a restart, a crash at the collective timeout: their end records end the hang) and the
  launcher ran the job again seconds later (a frozen rank's SIGKILL, the imports).
  Rollbacks are the closed loop's work on the data,
  not failures of the infrastructure;
- time to recover: a failure's seconds from its start to the first step after it (the
  hang's, plus the relaunch's gap and start-up); the work re-done after a relaunch (the
  steps since the checkpoint) is ``lost``, said apart: it is badput but not waiting.

A run that hung at step 40 for 30 s before its relaunch, which took 12 s to its first
step, then re-did 8 s of work::

    >>> report = {"attempts": [{"attempt": 1, "badput_seconds": {"startup": 4.0}}],
    ...           "incidents": [
    ...     {"kind": "hang", "step": 40, "start": 100.0, "seconds": 30.0, "attempt": 1,
    ...      "open": False, "detail": {}},
    ...     {"kind": "restart", "step": 36, "start": 130.0, "seconds": 20.0, "attempt": 2,
    ...      "open": False, "detail": {"gap": 0.0, "startup": 12.0, "discarded": 8.0}}]}
    >>> figures = ettr_of(report, ratio=0.9)
    >>> figures.time_to_start, figures.failures, [(r.kind, r.seconds, r.lost) for r in figures.recoveries]
    (4.0, 1, [('hang', 42.0, 8.0)])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from monitor_agent.runs.goodput import cost_words

__all__ = ["RECOVERY_BUCKETS", "Ettr", "Recovery", "ettr_of", "quantile", "recovery_words"]

RECOVERY_BUCKETS: tuple[float, ...] = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                                       3600.0)
"""Seconds: the issue's goal is 60 s after detection; torchft's measured 948 s; a person's
response at night is tens of minutes."""
_TOUCHING = 1.0  # seconds: a hang ends where the relaunch that ended it begins


@dataclass(frozen=True, slots=True)
class Recovery:
    """One failure: what it was (``hang`` or ``restart``: a relaunch after a crash), the
    step before it, when it began, the seconds until training again, the work re-done after
    it (seconds), and whether it is still going."""

    kind: str
    step: int
    start: float
    seconds: float
    lost: float = 0.0
    open: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "start": self.start,
                "seconds": self.seconds, "lost_seconds": self.lost, "open": self.open}


@dataclass(frozen=True, slots=True)
class Ettr:
    """A run's effective-training-time figures (module docstring)."""

    ratio: float | None
    time_to_start: float | None
    recoveries: tuple[Recovery, ...] = ()

    @property
    def failures(self) -> int:
        return len(self.recoveries)

    def to_dict(self) -> dict[str, Any]:
        done = [r.seconds for r in self.recoveries if not r.open]
        return {"ettr": self.ratio, "time_to_start_seconds": self.time_to_start,
                "failures": self.failures,
                "time_to_recover_seconds": [r.to_dict() for r in self.recoveries],
                "time_to_recover_p50_seconds": quantile(done, 0.5),
                "time_to_recover_p99_seconds": quantile(done, 0.99)}


def ettr_of(report: Mapping[str, Any], ratio: float | None) -> Ettr:
    """The figures of a goodput report (``GoodputReport.to_dict()``'s attempts and
    incidents; ``ratio``: its goodput ratio)."""
    attempts = sorted(report.get("attempts") or [], key=lambda a: a.get("attempt", 0))
    start = None
    if attempts:
        start = float((attempts[0].get("badput_seconds") or {}).get("startup", 0.0))
    return Ettr(ratio, start, tuple(_recoveries(report.get("incidents") or [])))


def _recoveries(incidents: Sequence[Mapping[str, Any]]) -> list[Recovery]:
    out: list[Recovery] = []
    hang: Recovery | None = None  # the latest hang, which a relaunch right after may end
    left = False  # whether its processes' end ended it (the relaunch came after a gap)
    for inc in sorted(incidents, key=lambda i: (i.get("start", 0.0), i.get("attempt", 0))):
        kind, detail = inc.get("kind"), inc.get("detail") or {}
        if kind == "hang":
            hang = Recovery("hang", int(inc.get("step", 0)), float(inc.get("start", 0.0)),
                            float(inc.get("seconds", 0.0)), open=bool(inc.get("open")))
            left = "left" in detail
            out.append(hang)
        elif kind == "restart":
            gap = float(detail.get("gap", 0.0))
            relaunch = gap + float(detail.get("startup", 0.0))
            lost = float(detail.get("discarded", 0.0))
            start = float(inc.get("start", 0.0))
            # A relaunch begins where the attempt before it last sent (``start - gap``).
            began = start - gap if left else start
            if hang is not None and not hang.open and \
                    abs(hang.start + hang.seconds - began) <= _TOUCHING:
                out[-1] = Recovery("hang", hang.step, hang.start, hang.seconds + relaunch,
                                   lost)
            else:
                out.append(Recovery("restart", int(inc.get("step", 0)),
                                    start - float(detail.get("gap", 0.0)), relaunch, lost))
            hang = None
        else:
            hang = None
    return out


def recovery_words(recovery: Recovery, gpus: int, device: str | None = "cuda") -> str:
    """What a relaunch that ended a failure cost, as the resolving page says it.

        >>> recovery_words(Recovery("hang", 40, 100.0, 42.0, 8.0), gpus=16)
        'this incident cost 50 s x 16 GPUs = 0.22 GPU-hours so far: 42 s to recover (from the fault to the first step after the relaunch), 8.0 s of work re-done'
    """
    cost = cost_words(recovery.seconds + recovery.lost, gpus, device)
    return (f"this incident cost {cost} so far: "
            f"{_span(recovery.seconds)} to recover (from the fault to the first step after "
            f"the relaunch), {_span(recovery.lost)} of work re-done")


def _span(seconds: float) -> str:
    return cost_words(seconds, 1, None)


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (nearest rank) of ``values``, None for none.

        >>> quantile([3.0, 1.0, 2.0], 0.5), quantile([], 0.5)
        (2.0, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(math.ceil(q * len(ordered)) - 1, 0))]
