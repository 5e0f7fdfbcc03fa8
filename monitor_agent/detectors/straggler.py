"""``straggler``: one rank's own time far above the other ranks' of the same run, and what
it spends the extra time on: data loading, its own compute, or waiting in the collective.

In synchronous data parallelism every rank waits for the slowest at the gradient
all-reduce, so ``step_time`` is the same on every rank; the straggler shows in how its step
splits (the client measures it, ``_timings.py``): its own time (``data_time`` +
``compute_time``, else ``step_time - sync_wait_time``) is long, and it is the one rank that
does NOT wait in the all-reduce while the others do. Each rank's median over
``straggler_window`` steps is compared with the median of the other ranks' medians; a rank
whose own time is ``straggler_ratio`` x theirs is the straggler, and the larger of its extra
data time and extra compute time names the cause. A rank whose own work is as fast as the
others' but whose step is ``straggler_ratio`` x longer, the extra in ``sync_wait_time``, is
slow in the collective itself (its link, its NIC): that is the third cause. A rank slow in
its own compute whose GPU throttles (the NVML throttle reasons in the record's ``gpu``
object) while most other ranks' GPUs do not is a straggler with that cause, ``gpu_throttle``.
Where only ``data_time`` splits the step (a CUDA run: the client sends no compute or wait
there, its host timestamps being launch times), the others' own time is their step less
the straggler's extra loading, which they spend waiting for it; the same ratio applies.

Four ranks, rank 2's loader 410 ms per batch where the others take 12 ms; the others wait
for it in the all-reduce::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> def rec(s, r):
    ...     data = 0.41 if r == 2 else 0.012
    ...     return parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                          "rank": r, "step_time": 0.47, "data_time": data,
    ...                          "compute_time": 0.05, "sync_wait_time": 0.42 - data})
    >>> found = [f for s in range(1, 21) for r in range(4) for f in suite.update(rec(s, r))]
    >>> [(f.type, f.step, f.rank, f.evidence["cause"]) for f in found]
    [('straggler', 20, 2, 'data')]
    >>> print(found[0].message)
    rank 2 is the straggler: its data loading takes 410 ms vs 12 ms on the other ranks (their
    extra time is waiting for it in the all-reduce: 398 ms)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, finite
from monitor_agent.records.types import Finding, Severity, StepRecord

STRAGGLER_COMPUTE = (
    "Its own compute is slow: check that host (thermal throttling, other processes, a "
    "failing GPU, NUMA/CPU binding).",
    "Uneven work makes one rank compute longer: longer sequences or bigger samples in its "
    "shard; balance or bucket them.",
)
STRAGGLER_DATA = (
    "Its data loading is slow: give that rank's DataLoader more workers (num_workers), "
    "pin_memory=True, a larger prefetch_factor and persistent_workers=True.",
    "Check that host's storage or network read speed, and its shard: bigger or harder to "
    "decode samples make one rank's loading slower.",
)
STRAGGLER_COLLECTIVE = (
    "Its time goes into the gradient all-reduce itself: check that host's network link "
    "(NIC errors, a slower path, NCCL_SOCKET_IFNAME / NCCL_IB_HCA picking the wrong device).",
    "Check that the host is not oversubscribed (other jobs on its network or CPUs).",
)
STRAGGLER_THROTTLE = (
    "Its GPU throttles while the others' do not: thermal, check that node's cooling (fans, "
    "airflow, inlet temperature); power, its power supply and power cap (nvidia-smi -q -d "
    "POWER,PERFORMANCE); hardware slowdown, both.",
    "Drain the node and reset the GPU (nvidia-smi -r), then run DCGM diagnostics before it "
    "takes jobs again (the gpu_health finding names the GPU).",
)
SUGGESTIONS = {"data": STRAGGLER_DATA, "compute": STRAGGLER_COMPUTE,
               "collective": STRAGGLER_COLLECTIVE, "gpu_throttle": STRAGGLER_THROTTLE}


class StragglerSettings(SharedSettings):
    """The knobs of ``straggler`` (``detectors:`` in the sidecar's config)."""

    straggler_ratio: float = Field(
        default=1.5, gt=1, description="A rank's median own time (or, for a rank slow in the "
        "collective, step time) over the others' median.")
    straggler_window: int = Field(default=20, ge=3, description="Steps per rank in the comparison.")


@dataclass(slots=True)
class RankTimes:
    times: Window      # own time: data + compute
    data: Window       # each NaN where the record does not say
    compute: Window
    wait: Window
    step: Window
    throttle: Window   # the GPU's throttle reasons per step (throttle_code), NaN unknown


def own_time(rec: StepRecord) -> float | None:
    """Data + compute time: the part of the step that is this rank's own doing."""
    data = rec.data_time if finite(rec.data_time) else 0.0
    if finite(rec.compute_time):
        return rec.compute_time + data
    if finite(rec.step_time) and finite(rec.sync_wait_time):
        return rec.step_time - rec.sync_wait_time
    return rec.step_time if finite(rec.step_time) else None


def compute_of(rec: StepRecord) -> float:
    if finite(rec.compute_time):
        return rec.compute_time
    if finite(rec.step_time) and finite(rec.sync_wait_time):
        data = rec.data_time if finite(rec.data_time) else 0.0
        return rec.step_time - rec.sync_wait_time - data
    return math.nan


def _num(x: float | None) -> float:
    return x if finite(x) else math.nan


def _median(w: Window) -> float:
    v = w.values()
    v = v[~np.isnan(v)]
    return float(np.median(v)) if len(v) else math.nan


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x >= 0.0095 else f"{x * 1000:.1f} ms"


class StragglerDetector(DetectorBase[StragglerSettings]):
    """Warning for a rank whose median own time is ``straggler_ratio`` x the others', with
    the cause (``evidence["cause"]``: data, compute, collective, or gpu_throttle: its own
    compute is slow and its GPU throttles while the others' do not, ``throttle_cause``)."""

    type = "straggler"
    severity = Severity.WARNING
    settings_model = StragglerSettings
    scope = "run"

    def new_rank(self) -> RankTimes:
        n = self.settings.straggler_window
        return RankTimes(times=Window.of(n), data=Window.of(n), compute=Window.of(n),
                         wait=Window.of(n), step=Window.of(n), throttle=Window.of(n))

    def on_step(self, rec: StepRecord, st: RankTimes) -> list[Finding]:
        t = own_time(rec)
        if t is None or t <= 0:
            return []
        st.times.add(t)
        st.data.add(_num(rec.data_time))
        st.compute.add(compute_of(rec))
        st.wait.add(_num(rec.sync_wait_time))
        st.step.add(_num(rec.step_time))
        st.throttle.add(throttle_code(rec))
        peers = [o for r, o in self.ranks.items() if r != rec.rank and o.times.full]
        if not st.times.full or not peers:
            return []
        ratio = st.times.median() / float(np.median([o.times.median() for o in peers]))
        cause = None
        if ratio < self.settings.straggler_ratio:
            ratio = max(ratio, self._data_only_ratio(st, peers))
        if ratio >= self.settings.straggler_ratio:
            cause = "own"
        elif self._slow_in_collective(st, peers):
            cause = "collective"
        if cause is None or not self.due(rec):
            return []
        return [self._report(rec, st, peers, ratio, cause)]

    @staticmethod
    def _data_only_ratio(st: RankTimes, peers: list[RankTimes]) -> float:
        """Its own-time ratio when only ``data_time`` splits the step (a CUDA run: the
        client sends no compute or wait there). In synchronous data parallelism the others
        wait for its extra loading, so their own time is their step less that extra."""
        if finite(_median(st.compute)) or finite(_median(st.wait)):
            return math.nan
        extra = _median(st.data) - _peer_median(peers, "data")
        base = _peer_median(peers, "step") - extra
        if not (finite(extra) and extra > 0 and finite(base) and base > 0):
            return math.nan
        return _median(st.step) / base

    def _slow_in_collective(self, st: RankTimes, peers: list[RankTimes]) -> bool:
        """Its step is ``straggler_ratio`` x the others' and the extra is all-reduce wait."""
        mine, theirs = _median(st.step), float(np.nanmedian([_median(o.step) for o in peers]))
        wait, their_wait = _median(st.wait), _peer_median(peers, "wait")
        if not (mine >= self.settings.straggler_ratio * theirs and wait > their_wait):
            return False
        return wait - their_wait > (mine - theirs) / 2

    def _report(self, rec: StepRecord, st: RankTimes, peers: list[RankTimes], ratio: float,
                cause: str) -> Finding:
        mine = {k: _median(getattr(st, k)) for k in ("data", "compute", "wait")}
        theirs = {k: _peer_median(peers, k) for k in ("data", "compute", "wait")}
        if cause == "own":
            extra_data = mine["data"] - theirs["data"] if finite(mine["data"]) else -math.inf
            extra_compute = mine["compute"] - theirs["compute"] \
                if finite(mine["compute"]) else -math.inf
            cause = "data" if extra_data > extra_compute else "compute"
        msg = _message(rec.rank, cause, mine, theirs, st.times.median(),
                       float(np.median([o.times.median() for o in peers])))
        throttle = throttle_cause(st, peers) if cause == "compute" else None
        if throttle is not None:  # a rank slow in its own compute whose GPU throttles
            cause, msg = "gpu_throttle", msg + throttle[1]
        own, others = st.times.median(), float(np.median([o.times.median() for o in peers]))
        evidence = {"cause": cause, "own_time": own, "others_median": others, "ratio": ratio,
                    "throttle": throttle[0] if throttle is not None else None,
                    "ranks": len(peers) + 1,
                    "data_time": mine["data"], "others_data_time": theirs["data"],
                    "compute_time": mine["compute"], "others_compute_time": theirs["compute"],
                    "sync_wait_time": mine["wait"], "others_sync_wait_time": theirs["wait"]}
        return self.finding(rec, msg, value=own, threshold=others * self.settings.straggler_ratio,
                            evidence={k: v for k, v in evidence.items() if v is not None
                                      and not (isinstance(v, float) and math.isnan(v))},
                            suggestions=SUGGESTIONS[cause])


# -- the GPU's throttle reasons as a straggler's cause (issue 34) ------------------------------
# The client sends NVML's throttle reasons as 0/1 in the step record's ``gpu`` object; a rank
# slow in its own compute whose GPU throttles on most of its window while most other ranks'
# do not is a straggler with that cause (a throttle every rank shares, such as all GPUs at
# their power cap, explains nothing about this one).
THROTTLE_BITS = (("throttle_thermal", 1, "thermal"), ("throttle_power", 2, "power"),
                 ("throttle_hw_slowdown", 4, "hardware slowdown"))


def throttle_code(rec: StepRecord) -> float:
    """This step's throttle reasons as bits (thermal 1, power 2, hardware slowdown 4); NaN
    when the record says nothing about them."""
    gpu = rec.gpu or {}
    said = [(gpu.get(key), bit) for key, bit, _ in THROTTLE_BITS if gpu.get(key) is not None]
    if not said:
        return math.nan
    return float(sum(bit for value, bit in said if finite(value) and value > 0))


def _throttled(w: Window, bit: int) -> tuple[int, bool]:
    """Steps of the window with ``bit`` set, and whether that is most of those that say."""
    v = w.values()
    v = v[~np.isnan(v)].astype(int)
    on = int(((v & bit) > 0).sum())
    return on, len(v) > 0 and on * 2 >= len(v)


def throttle_cause(st: RankTimes, peers: list[RankTimes]) -> tuple[str, str] | None:
    """The throttle reason the straggler's GPU shows on most of its steps and fewer than half
    of the other ranks' GPUs on most of theirs: (reason, a clause for the message)."""
    for _, bit, name in THROTTLE_BITS:
        on, most = _throttled(st.throttle, bit)
        sharing = sum(_throttled(o.throttle, bit)[1] for o in peers)
        if most and sharing * 2 < len(peers):
            return name, (f"; its GPU throttles ({name}) on {on} of its last {len(st.throttle)} "
                          f"steps, {sharing} of {len(peers)} other ranks' GPUs on most of theirs")
    return None


def _peer_median(peers: list[RankTimes], name: str) -> float:
    meds = [m for m in (_median(getattr(o, name)) for o in peers) if finite(m)]
    return float(np.median(meds)) if meds else math.nan


def _message(rank: int, cause: str, mine: dict[str, float], theirs: dict[str, float],
             own: float, others: float) -> str:
    head = f"rank {rank} is the straggler: "
    if cause == "collective":
        return (head + f"it waits {_ms(mine['wait'])} in the gradient all-reduce vs "
                f"{_ms(theirs['wait'])} on the other ranks, while its own work takes "
                f"{_ms(own)} vs {_ms(others)}")
    part = "data loading" if cause == "data" else "own compute"
    key = "data" if cause == "data" else "compute"
    if finite(mine[key]) and finite(theirs[key]):
        body = f"its {part} takes {_ms(mine[key])} vs {_ms(theirs[key])} on the other ranks"
    else:  # compute_time and sync_wait_time unreported: only its own time as a whole
        body = f"its own work takes {_ms(own)} vs {_ms(others)} on the other ranks"
    if finite(mine["wait"]) and finite(theirs["wait"]) and theirs["wait"] > mine["wait"]:
        body += (" (their extra time is waiting for it in the all-reduce: "
                 f"{_ms(theirs['wait'] - mine['wait'])})")
    return head + body
