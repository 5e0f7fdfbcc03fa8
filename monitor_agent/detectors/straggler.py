"""``straggler``: one rank's own time far above the other ranks' of the same run, and what
it spends the extra time on: data loading, its own compute, or waiting in the collective;
or every rank of one node slow against the other nodes.

In synchronous data parallelism every rank waits for the slowest at the gradient
all-reduce, so ``step_time`` is the same on every rank; the straggler shows in how its step
splits (the client measures it, ``_timings.py``): its own time (``data_time`` +
``compute_time``, else ``step_time - sync_wait_time``) is long, and it is the one rank that
does NOT wait in the all-reduce while the others do. Each rank's median over
``straggler_window`` steps is compared with the median of the other ranks' medians; a rank
whose own time is ``straggler_ratio`` x theirs is the straggler. So is a rank whose own
work is as fast as the others' but which the others wait for in the all-reduce - their
``sync_wait_time`` above its own by ``straggler_ratio - 1`` x their own work or more: it is
late to the collective for reasons outside its data and compute (its link, its NIC, a host
stall between its measured parts). That names the rank that is late, the one that waits
LEAST: with equal own work, the rank that waits longest is the one that arrived first.

The cause is where its extra time goes: in every step the others' wait for it is its extra
data + its extra compute + its extra time outside both (``collective``), and the largest of
the three over the window's means names it (``cause_of``; means, because medians do not add
up: a slow loader's tight data times move their median later than the others' widely
spread waits move theirs, and a split of medians reads that wait as unexplained, late to
the collective, for half a window). A rank slow in its own compute whose GPU throttles
(the NVML throttle reasons in the record's ``gpu`` object) while most other ranks' GPUs do
not is a straggler with that cause, ``gpu_throttle``.
Where only ``data_time`` splits the step (a CUDA run: the client sends no compute or wait
there, its host timestamps being launch times), the others' own time is their step less
the straggler's extra loading, which they spend waiting for it; the same ratio applies.
Causes are named in one section of this module ("the cause"): ``judge`` on the medians and
means of one rank (or of one node's ranks) and of the rest, ``Throttles`` for a GPU that
throttles.

**A whole node slow.** Ranks carry their host (the run record's ``node``/``hostname``
label). When every rank of one host (two or more) is ``straggler_ratio`` x slower than the
median of the ranks on the *other* hosts, by the same test and with the cause named the
same way, the page says so once, "node gpu-3 (ranks 24-31) is slow as a whole", instead
of naming its ranks one by one: what they share (the host's CPUs, storage, network,
power) is what to look at. A host holding half the ranks or more is judged against the
rest too, where a rank-by-rank view would see half its peers slow and call nobody.
A node fail-slow by less than ``straggler_ratio`` (a throttled CPU, a slower NIC: 1.1x,
1.3x) is named too once it holds: every one of its ranks past the floor (below) at a ratio
of only ``1 + straggler_min_extra_fraction``, on every judgement for a whole window after
the window that first showed it ("node gpu-3 (ranks 24-31) is slow as a whole since step
120"). Its ranks share the host, so all of them slow together is the host's evidence, and
holding it two windows long keeps one slow window (a compaction, a neighbour's burst) out.

**When, and at what cost.** A step is judged once, when every rank still sending has
reported it (or the newest rank is 64 steps past it: ``support/front.py``, at O(log ranks)
a record): each rank that reported since the last judgement is judged against the others,
the window medians of every rank taken in one sort of a ranks x window array and each
rank's "median of the others" read off one sorted array (leave one out). So a record costs
O(log ranks) amortised, not the O(ranks) medians per record of judging each record as it
arrives, which cost 5 ms a record at 256 ranks and cannot keep up with a run leader hearing
1024 ranks a second. At the leader of a multi-node run (monitor_agent/cluster) that view
is the whole run's: the straggler and its cause are named over all nodes.

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

Three hosts of two ranks; both ranks of gpu-1 compute 300 ms where the others take 50::

    >>> suite = DetectorSuite(DetectorSettings())
    >>> for r in range(6):
    ...     _ = suite.update(parse_record({"kind": "run", "run_id": "r", "rank": r,
    ...                                    "labels": {"hostname": f"gpu-{r // 2}"}}))
    >>> def rec(s, r):
    ...     compute = 0.3 if r in (2, 3) else 0.05
    ...     return parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                          "rank": r, "step_time": 0.32, "data_time": 0.01,
    ...                          "compute_time": compute, "sync_wait_time": 0.31 - compute})
    >>> found = [f for s in range(1, 21) for r in range(6) for f in suite.update(rec(s, r))]
    >>> [(f.type, f.step, f.rank, f.evidence["host"], f.evidence["cause"]) for f in found]
    [('straggler', 20, 2, 'gpu-1', 'compute')]
    >>> print(found[0].message)
    node gpu-1 (ranks 2-3) is slow as a whole: its own compute takes 300 ms vs 50 ms on the
    other nodes (their extra time is waiting for it in the all-reduce: 250 ms)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.context import DetectorContext
from monitor_agent.detectors.support.extra_time import largest, split_extra
from monitor_agent.detectors.support.own_time import own_time
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import MAD_TO_SIGMA, Window, finite, sorted_median
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
    "It reaches the gradient all-reduce late with its own work as fast as the others': check "
    "that host's network link (NIC errors, a slower path, NCCL_SOCKET_IFNAME / NCCL_IB_HCA "
    "picking the wrong device), and what that rank does between its measured parts "
    "(logging, checkpoints or evaluation on that rank only, garbage collection).",
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
NODE_FIRST = ("Every rank of that node is slow, not one GPU: look at what they share (the "
              "host's CPUs and memory bandwidth, its storage and network, its power and "
              "cooling), or drain the node.",)


class StragglerSettings(SharedSettings):
    """The knobs of ``straggler`` (``detectors:`` in the sidecar's config)."""

    straggler_ratio: float = Field(
        default=1.5, gt=1, description="A rank's median own time (or, for a rank slow in the "
        "collective, step time) over the others' median; the same for a node's ranks over "
        "the other nodes'.")
    straggler_window: int = Field(default=20, ge=3, description="Steps per rank in the comparison.")
    straggler_min_extra_fraction: float = Field(
        default=0.05, ge=0, lt=1, description="No rank (or node) is a straggler whose extra "
        "time per step over the others is less than this fraction of the run's own step "
        "time (the others' median step): what it costs every rank that waits for it.")
    straggler_noise_sigmas: float = Field(
        default=1.0, ge=0, description="Nor one whose extra time per step is within this "
        "many of the others' own step-to-step spreads (robust standard deviations of their "
        "own time and of their all-reduce wait): the run's measured timing noise.")


@dataclass(slots=True)
class RankTimes:
    times: Window      # own time: data + compute
    data: Window       # each NaN where the record does not say
    compute: Window
    wait: Window
    step: Window
    throttle: Window   # the GPU's throttle reasons per step (throttle_code), NaN unknown


QUANTITIES = ("times", "data", "compute", "wait", "step")  # RankTimes' windows, Times' order


def compute_of(rec: StepRecord) -> float:
    if finite(rec.compute_time):
        return rec.compute_time
    if finite(rec.step_time) and finite(rec.sync_wait_time):
        data = rec.input_wait or 0.0
        return rec.step_time - rec.sync_wait_time - data
    return math.nan


def _num(x: float | None) -> float:
    return x if finite(x) else math.nan


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x >= 0.0095 else f"{x * 1000:.1f} ms"


# -- the cause: what a slow rank (or node) spends its extra time on ---------------------------
# Everything that names a cause is here; the detector below only gathers the medians.


@dataclass(frozen=True, slots=True)
class Times:
    """Window medians of one rank (or of one node's ranks, or of the others): its own time
    and its step's parts, NaN where the records do not say."""

    own: float
    data: float
    compute: float
    wait: float
    step: float


@dataclass(frozen=True, slots=True)
class Slowness:
    ratio: float  # its own time over theirs (or, slow in the collective, its step's ratio)
    cause: str    # a key of SUGGESTIONS


def judge(mine: Times, theirs: Times, threshold: float, floor: float = 0.0,
          means: tuple[Times, Times] | None = None) -> Slowness | None:
    """Whether ``mine`` is a straggler against ``theirs`` (window medians) and why; None
    when it is not.

    Its own time ``threshold`` x theirs (or, when only ``data_time`` splits the step, its
    step over theirs less its extra loading). Else, the others wait for it in the
    all-reduce: their wait above its own by ``threshold - 1`` x their own work or more,
    their step stretched ``threshold`` x by it (``_late_to_collective``). Never the rank
    that waits most: with equal own work that is the one that arrived first. Either way
    the extra must be at least ``floor`` seconds a step (``floor_of``): a fraction of the
    run's own step and more than its measured timing noise, never a fixed number of
    milliseconds.

    The cause is the largest part of its extra time (``cause_of``): its extra data, its
    extra compute, or the others' wait for it that neither explains (late to the
    collective itself), split on ``means`` (the same windows' means: its, theirs) where
    given, else on the medians.

        >>> theirs = Times(own=0.06, data=0.01, compute=0.05, wait=0.26, step=0.32)
        >>> judge(Times(0.31, 0.01, 0.3, 0.01, 0.32), theirs, 1.5)
        Slowness(ratio=5.166666666666667, cause='compute')
        >>> judge(Times(0.06, 0.01, 0.05, 0.005, 0.32), theirs, 1.5).cause
        'collective'
        >>> judge(Times(0.06, 0.01, 0.05, 0.6, 0.66), theirs, 1.5) is None  # early, waits
        True
        >>> judge(theirs, theirs, 1.5) is None
        True
    """
    ratio = mine.own / theirs.own
    if ratio < threshold:
        ratio = max(ratio, _data_only_ratio(mine, theirs))
    if not (ratio >= threshold and _extra(mine, theirs) >= floor):
        late = _late_to_collective(mine, theirs, threshold)
        if late is None or not theirs.wait - mine.wait >= floor:
            return None
        ratio = late
    return Slowness(ratio, cause_of(*(means or (mine, theirs))))


def cause_of(mine: Times, theirs: Times) -> str:
    """The largest part of its extra time a step (``split_extra``): its extra data, its
    extra compute, or the part of the others' wait for it that neither explains.

    Split means, not medians: the others' wait for it is exactly its extra data + extra
    compute + extra time outside both in every step, so in the sum of any steps too, and a
    mean is a sum; medians do not add up. In the first window after a loader slows by one
    step a batch, the median of its tight data times moves only once half the window is
    slow, while the median of the others' widely spread waits moves a step at a time: a
    split of medians reads the extra wait as unexplained, "late to the collective", for
    those steps. Its means split it the way the goodput ledger charges it."""
    return largest(split_extra(theirs.wait - mine.wait, mine.data - theirs.data,
                               mine.compute - theirs.compute))


def floor_of(theirs: Times, spread: float, fraction: float, sigmas: float) -> float:
    """The least extra time a step that makes a straggler, in the run's own units.

    A fraction of the run's step (the others' median step; their own work plus their wait
    where the step is not said): a straggler costs its extra time on every rank that waits
    for it, so what matters is that time against the step, the same fraction on a 1 s step
    as on a 9 ms one (``straggler_min_extra_fraction``, 5%: half of the sustained 10%
    slowdown of one node that must be found). And more than ``sigmas`` x the others'
    step-to-step spread (``spread``: the median over the other ranks of each one's robust
    standard deviation of its own time and of its wait, ``_spreads``): a rank whose extra
    is within one step's jitter of the others' is not told apart from a run whose ranks
    take turns being slow (a runnable thread waiting a scheduler period, the GIL handed
    over every 5 ms move a tiny step's parts by milliseconds from one step to the next,
    and that shows here as spread). One spread of a single step is about 2.5 standard
    errors of the difference of two 20-step medians.

        >>> theirs = Times(own=0.004, data=0.001, compute=0.003, wait=0.005, step=0.009)
        >>> round(floor_of(theirs, 0.0002, 0.05, 1.0), 6)  # 5% of a 9 ms step
        0.00045
        >>> floor_of(theirs, 0.002, 0.05, 1.0)  # the others' steps jitter by 2 ms
        0.002
    """
    step = theirs.step
    if not (finite(step) and step > 0):
        step = theirs.own + (theirs.wait if finite(theirs.wait) else 0.0)
    noise = sigmas * spread if finite(spread) else 0.0
    return max(fraction * step if finite(step) else 0.0, noise)


def _extra(mine: Times, theirs: Times) -> float:
    """Its extra seconds a step: of its own time, or (only ``data_time`` said) of loading."""
    extra = mine.own - theirs.own
    if finite(mine.compute) or finite(mine.wait) or not finite(mine.data - theirs.data):
        return extra
    return max(extra, mine.data - theirs.data)


def _data_only_ratio(mine: Times, theirs: Times) -> float:
    """Its own-time ratio when only ``data_time`` splits the step (a CUDA run: the client
    sends no compute or wait there). In synchronous data parallelism the others wait for
    its extra loading, so their own time is their step less that extra."""
    if finite(mine.compute) or finite(mine.wait):
        return math.nan
    extra = mine.data - theirs.data
    base = theirs.step - extra
    if not (finite(extra) and extra > 0 and finite(base) and base > 0):
        return math.nan
    return mine.step / base


def _late_to_collective(mine: Times, theirs: Times, threshold: float) -> float | None:
    """The others wait for it in the all-reduce: their wait above its own, added to their
    own work, is ``threshold`` x their own work (their step stretched that much by it);
    that ratio, else None. Whoever arrives last waits least, so the late rank is the one
    with LESS wait than the others, never more (with equal own work, the rank that waits
    longer arrived first)."""
    excess = theirs.wait - mine.wait
    if not (finite(excess) and excess > 0 and finite(theirs.own) and theirs.own > 0):
        return None
    ratio = (theirs.own + excess) / theirs.own
    return ratio if ratio >= threshold else None


def _maybe_slow(mine: dict[str, np.ndarray], theirs: dict[str, np.ndarray],
                threshold: float) -> np.ndarray:
    """Which of many ranks ``judge`` could call slow (a superset: it is asked only about
    these), on arrays of their medians keyed by ``QUANTITIES``: its own time or its step
    ``threshold`` x theirs, the others waiting for it (``_late_to_collective``), or only
    ``data_time`` said and more of it. A cause that shows none of these ways must be added
    here too."""
    t = threshold * (1 - 1e-9)  # a ratio at the threshold, whatever the rounding
    with np.errstate(invalid="ignore"):
        own = mine["times"] >= t * theirs["times"]
        late = theirs["wait"] - mine["wait"] >= (t - 1) * theirs["times"]
        data_only = np.isnan(mine["compute"]) & np.isnan(mine["wait"]) \
            & (mine["data"] > theirs["data"])
    return own | late | data_only


def _message(who: str, others: str, cause: str, mine: Times, theirs: Times,
             over: int | None = None) -> str:
    """``who``: "rank 2 is the straggler", "node gpu-3 (ranks 24-31) is slow as a whole";
    ``others``: "the other ranks", "the other nodes"; ``over``: the times are means over
    that many steps (else medians: what a typical step takes)."""
    head = f"{who}: "
    takes, waits = ("averages", "wait on average") if over else ("takes", "wait")
    mean = f" over the last {over} steps" if over else ""
    if cause == "collective":
        return (head + f"it is late to the gradient all-reduce: {others} {waits} "
                f"{_ms(theirs.wait)} there for it vs {_ms(mine.wait)} it waits, while its "
                f"own work {takes} {_ms(mine.own)} vs {_ms(theirs.own)}{mean} (its time goes "
                f"outside its data and compute: its link, or its host)")
    part = "data loading" if cause == "data" else "own compute"
    value, their = (mine.data, theirs.data) if cause == "data" else (mine.compute, theirs.compute)
    if finite(value) and finite(their):
        body = f"its {part} {takes} {_ms(value)} vs {_ms(their)} on {others}{mean}"
    else:  # compute_time and sync_wait_time unreported: only its own time as a whole
        body = f"its own work {takes} {_ms(mine.own)} vs {_ms(theirs.own)} on {others}{mean}"
    if finite(mine.wait) and finite(theirs.wait) and theirs.wait > mine.wait:
        body += (" (their extra time is waiting for it in the all-reduce: "
                 f"{_ms(theirs.wait - mine.wait)})")
    return head + body


# The GPU's throttle reasons as a straggler's cause (issue 34): the client sends NVML's
# throttle reasons as 0/1 in the step record's ``gpu`` object (a digest keeps them); a rank
# slow in its own compute whose GPU throttles on most of its window while most other ranks'
# do not is a straggler with that cause (a throttle every rank shares, such as all GPUs at
# their power cap, explains nothing about this one). A node: every one of its ranks' GPUs.
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


class Throttles:
    """Per reason, how many steps of each rank's window its GPU throttled, and whether on
    most of those that say (one pass over a ranks x window array of ``throttle_code``)."""

    def __init__(self, codes: np.ndarray) -> None:
        said = ~np.isnan(codes)
        bits = np.where(said, codes, 0).astype(int)
        self.window = codes.shape[1]
        self.said = said.sum(axis=1)
        self.on = {bit: ((bits & bit) > 0).sum(axis=1) for _, bit, _ in THROTTLE_BITS}

    def most(self, bit: int) -> np.ndarray:
        return (self.said > 0) & (self.on[bit] * 2 >= self.said)

    def cause(self, rows: np.ndarray, others: np.ndarray) -> tuple[str, str] | None:
        """The throttle reason the GPUs of ``rows`` (one rank, or a node's) show on most of
        their steps and fewer than half of the ``others``' GPUs on most of theirs: (reason,
        a clause for the message)."""
        for _, bit, name in THROTTLE_BITS:
            most = self.most(bit)
            sharing = int(most[others].sum())
            if not most[rows].all() or sharing * 2 >= len(others):
                continue
            if len(rows) == 1:
                return name, (f"; its GPU throttles ({name}) on {int(self.on[bit][rows[0]])} "
                              f"of its last {self.window} steps, {sharing} of {len(others)} "
                              "other ranks' GPUs on most of theirs")
            return name, (f"; each of its GPUs throttles ({name}) on most of its last "
                          f"{self.window} steps, {sharing} of {len(others)} other nodes' "
                          "GPUs on most of theirs")
        return None


# -- the detector ------------------------------------------------------------------------------


class StragglerDetector(DetectorBase[StragglerSettings]):
    """Warning for a rank whose median own time is ``straggler_ratio`` x the others', or
    for a node all of whose ranks are that much slower than the other nodes', with the
    cause (``evidence["cause"]``: data, compute or collective). Judged once a step, when
    every live rank reported it (module docstring)."""

    type = "straggler"
    severity = Severity.WARNING
    settings_model = StragglerSettings
    scope = "run"

    def __init__(self, settings: StragglerSettings, ctx: DetectorContext) -> None:
        super().__init__(settings, ctx)
        self.run_id = ""
        self.judged = -1  # the step the last judgement covered
        # rank -> (step, time) of its latest timed record since the last judgement
        self.fresh: dict[int, tuple[int, float]] = {}
        # host -> the judgement since which every rank of it is slow below the ratio
        self.mild_since: dict[str, int] = {}

    def new_rank(self) -> RankTimes:
        n = self.settings.straggler_window
        return RankTimes(times=Window.of(n), data=Window.of(n), compute=Window.of(n),
                         wait=Window.of(n), step=Window.of(n), throttle=Window.of(n))

    def on_step(self, rec: StepRecord, st: RankTimes) -> list[Finding]:
        t = own_time(rec)
        if t is not None and t > 0:
            st.times.add(t)
            st.data.add(_num(rec.input_wait))
            st.compute.add(compute_of(rec))
            st.wait.add(_num(rec.sync_wait_time))
            st.step.add(_num(rec.step_time))
            st.throttle.add(throttle_code(rec))
            self.run_id = rec.run_id
            self.fresh[rec.rank] = (rec.step, rec.time)
        through = self.ctx.front.judged_through()
        if through <= self.judged or not self.fresh:
            return []
        self.judged = through
        fresh, self.fresh = self.fresh, {}
        return self._judge(fresh)

    def _judge(self, fresh: dict[int, tuple[int, float]]) -> list[Finding]:
        full = [r for r, st in self.ranks.items() if st.times.full]
        if len(full) < 2:
            return []
        index = {r: i for i, r in enumerate(full)}
        med = {q: _row_medians(np.stack([getattr(self.ranks[r], q).buf for r in full]))
               for q in QUANTITIES}
        spread = _spreads([self.ranks[r] for r in full])
        means = _Means([self.ranks[r] for r in full])
        threshold = self.settings.straggler_ratio
        hosts = {r: self.ctx.rank(r).host for r in self.ranks}
        out: list[Finding] = []
        named: set[int] = set()
        throttles: list[Throttles] = []  # made once, when some straggler is slow in compute

        def throttle(rows: list[int], others: list[int]) -> tuple[str, str] | None:
            if not throttles:
                throttles.append(Throttles(np.stack([self.ranks[r].throttle.buf
                                                     for r in full])))
            return throttles[0].cause(np.array(rows), np.array(others, dtype=np.intp))

        for host, ranks, verdict, mine, theirs, split, since in self._slow_nodes(
                full, index, med, spread, hosts, means):
            first = ranks[0]
            named.update(ranks)
            if not any(r in fresh for r in ranks):
                continue
            step, time = fresh.get(first) or next(fresh[r] for r in ranks if r in fresh)
            if self.repeat.due(f"node/{host}", step, self.settings.repeat_every_steps):
                rows = [index[r] for r in ranks]
                why = throttle(rows, [i for i in range(len(full)) if i not in set(rows)]) \
                    if verdict.cause == "compute" else None
                out.append(self._finding(
                    first, step, time, verdict, mine, theirs, split, len(full), hosts,
                    who=f"node {host} ({_span(ranks)}) is slow as a whole" + (
                        f" since step {since}" if since is not None else ""),
                    others="the other nodes", node=ranks, throttle=why))
        loo = {q: _loo_medians(med[q]) for q in QUANTITIES}
        others_spread = _loo_medians(spread)
        maybe = _maybe_slow(med, loo, threshold)
        for r in sorted(fresh):
            i = index.get(r)
            if i is None or r in named or not maybe[i]:
                continue
            mine, theirs = _times(med, i), _times(loo, i)
            split = means.rank(i)
            found = judge(mine, theirs, threshold, self._floor(theirs, float(others_spread[i])),
                          split)
            step, time = fresh[r]
            if found is None or not self.repeat.due(f"{r}/", step,
                                                    self.settings.repeat_every_steps):
                continue
            why = throttle([i], [k for k in range(len(full)) if k != i]) \
                if found.cause == "compute" else None
            out.append(self._finding(r, step, time, found, mine, theirs, split, len(full),
                                     hosts, who=f"rank {r} is the straggler",
                                     others="the other ranks", throttle=why))
        return out

    def _slow_nodes(self, full: list[int], index: dict[int, int], med: dict[str, np.ndarray],
                    spread: np.ndarray, hosts: dict[int, str | None], means: _Means
                    ) -> list[tuple[str, list[int], Slowness, Times, Times,
                                    tuple[Times, Times], int | None]]:
        """Hosts (of two or more ranks, all with a full window) every rank of which is a
        straggler against the median of the ranks on the other hosts: (host, its ranks,
        the verdict on its ranks' medians, those medians, the others', the same of the
        means, the judgement it has been slow since when below the ratio)."""
        by_host: dict[str, list[int]] = {}
        for r in sorted(self.ranks):
            by_host.setdefault(hosts[r] or "", []).append(r)
        by_host.pop("", None)
        if len(by_host) < 2:
            return []
        named = [(h, ranks) for h, ranks in by_host.items()
                 if len(ranks) >= 2 and all(r in index for r in ranks)]
        if not named:
            return []
        threshold = self.settings.straggler_ratio
        groups = [np.array([index[r] for r in ranks]) for _, ranks in named]
        # The others' medians per host, then per rank (its host's), for the prefilter.
        rest = {q: _medians_without(med[q], groups) for q in QUANTITIES}
        rest_spread = _medians_without(spread, groups)
        of_host = np.full(len(full), -1)
        for g, rows in enumerate(groups):
            of_host[rows] = g
        placed = of_host >= 0
        theirs_by_rank = {q: np.where(placed, rest[q][np.maximum(of_host, 0)], np.nan)
                          for q in QUANTITIES}
        mild = 1.0 + self.settings.straggler_min_extra_fraction
        maybe = _maybe_slow(med, theirs_by_rank, mild)
        out: list[tuple[str, list[int], Slowness, Times, Times, tuple[Times, Times],
                        int | None]] = []
        for g, (host, ranks) in enumerate(named):
            rows = groups[g]
            if not maybe[rows].all():
                self.mild_since.pop(host, None)
                continue
            theirs = Times(*(float(rest[q][g]) for q in QUANTITIES))
            floor = self._floor(theirs, float(rest_spread[g]))
            mine = Times(*(_finite_median(med[q][rows]) for q in QUANTITIES))
            verdicts = [judge(_times(med, i), theirs, threshold, floor) for i in rows]
            split = means.node(groups, g)
            if all(verdicts):
                verdict = judge(mine, theirs, threshold, floor, split) or judge(
                    _times(med, rows[0]), theirs, threshold, floor, split)
                assert verdict is not None  # as its first rank's
                out.append((host, ranks, verdict, mine, theirs, split, None))
                continue
            # Fail-slow: every rank of the node past the floor at a lower ratio, held for
            # a whole window after the window first showed it (``_sustained``).
            mild_verdicts = [judge(_times(med, i), theirs, mild, floor) for i in rows]
            if not all(mild_verdicts):
                self.mild_since.pop(host, None)
                continue
            verdict = judge(mine, theirs, mild, floor, split) or judge(
                _times(med, rows[0]), theirs, mild, floor, split)
            assert verdict is not None  # as its first rank's
            since = self.mild_since.setdefault(host, self.judged)
            if self.judged - since >= self.settings.straggler_window:
                out.append((host, ranks, verdict, mine, theirs, split, since))
        return out

    def _floor(self, theirs: Times, spread: float) -> float:
        return floor_of(theirs, spread, self.settings.straggler_min_extra_fraction,
                        self.settings.straggler_noise_sigmas)

    def _finding(self, rank: int, step: int, time: float, verdict: Slowness, mine: Times,
                 theirs: Times, split: tuple[Times, Times], ranks: int,
                 hosts: dict[int, str | None], *, who: str, others: str,
                 node: list[int] | None = None,
                 throttle: tuple[str, str] | None = None) -> Finding:
        cause = verdict.cause
        # The medians say what a typical step of it takes; they are quoted unless they
        # would name another part (a window part-way through a change): then the means
        # that named it are, as means.
        if cause_of(mine, theirs) == cause:
            message = _message(who, others, cause, mine, theirs)
        else:
            message = _message(who, others, cause, *split,
                               over=self.settings.straggler_window)
        mean_mine, mean_theirs = split
        parts = split_extra(mean_theirs.wait - mean_mine.wait, mean_mine.data - mean_theirs.data,
                            mean_mine.compute - mean_theirs.compute)
        if throttle is not None:  # slow in its own compute, and its GPU throttles
            cause, message = "gpu_throttle", message + throttle[1]
        host = hosts.get(rank)
        n_hosts = len({h for h in hosts.values() if h})
        evidence = {"cause": cause, "own_time": mine.own, "others_median": theirs.own,
                    "ratio": verdict.ratio, "ranks": ranks,
                    "throttle": throttle[0] if throttle is not None else None,
                    "data_time": mine.data, "others_data_time": theirs.data,
                    "compute_time": mine.compute, "others_compute_time": theirs.compute,
                    "sync_wait_time": mine.wait, "others_sync_wait_time": theirs.wait,
                    "host": host, "hosts": n_hosts if n_hosts > 1 else None,
                    "node_ranks": _span(node, "") if node else None,
                    **{f"extra_{part}_time": seconds for part, seconds in parts.items()}}
        rec = StepRecord(run_id=self.run_id, step=step, time=time, rank=rank)
        suggestions = (NODE_FIRST if node else ()) + SUGGESTIONS[cause]
        return self.finding(rec, message, value=mine.own,
                            threshold=theirs.own * self.settings.straggler_ratio,
                            evidence={k: v for k, v in evidence.items() if v is not None
                                      and not (isinstance(v, float) and math.isnan(v))},
                            suggestions=suggestions)

    def snapshot_extra(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "judged": self.judged,
                "fresh": {str(r): list(v) for r, v in self.fresh.items()},
                "mild_since": dict(self.mild_since)}

    def restore_extra(self, data: dict[str, Any]) -> None:
        self.run_id = str(data.get("run_id") or "")
        self.judged = int(data.get("judged", -1))
        self.fresh = {int(r): (int(v[0]), float(v[1]))
                      for r, v in (data.get("fresh") or {}).items()}
        self.mild_since = {str(h): int(s) for h, s in (data.get("mild_since") or {}).items()}


# -- medians of many windows at once -----------------------------------------------------------


def _times(med: dict[str, np.ndarray], i: int) -> Times:
    return Times(*(float(med[q][i]) for q in QUANTITIES))


class _Means:
    """The window means of every rank with a full window, and the others' for one rank or
    one node, split into ``Times`` (``cause_of`` splits them). Made on first use: only a
    judgement that finds someone slow needs them."""

    def __init__(self, ranks: list[RankTimes]) -> None:
        self.ranks = ranks
        self._avg: dict[str, np.ndarray] = {}
        self._loo: dict[str, np.ndarray] = {}
        self._rest: dict[str, np.ndarray] = {}  # per host of the one judgement's groups

    def avg(self) -> dict[str, np.ndarray]:
        if not self._avg:
            self._avg = {q: _row_means(np.stack([getattr(st, q).buf for st in self.ranks]))
                         for q in QUANTITIES}
        return self._avg

    def rank(self, i: int) -> tuple[Times, Times]:
        """Rank ``i``'s means and the median of the other ranks' means."""
        avg = self.avg()
        if not self._loo:
            self._loo = {q: _loo_medians(avg[q]) for q in QUANTITIES}
        return _times(avg, i), _times(self._loo, i)

    def node(self, groups: list[np.ndarray], g: int) -> tuple[Times, Times]:
        """The median of the means of the ranks of ``groups[g]`` (one host's), and that of
        every other rank's (the other hosts')."""
        avg = self.avg()
        if not self._rest:
            self._rest = {q: _medians_without(avg[q], groups) for q in QUANTITIES}
        return (Times(*(_finite_median(avg[q][groups[g]]) for q in QUANTITIES)),
                Times(*(float(self._rest[q][g]) for q in QUANTITIES)))


def _row_means(rows: np.ndarray) -> np.ndarray:
    """Each row's mean over its non-NaN values (NaN where it has none)."""
    said = ~np.isnan(rows)
    k = said.sum(axis=1)
    total = np.where(said, rows, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(k > 0, total / np.maximum(k, 1), np.nan)


def _row_medians(rows: np.ndarray) -> np.ndarray:
    """Each row's median over its non-NaN values (NaN where it has none): one sort of the
    whole array (NaN sorts last) and the middle of each row's numbers."""
    s = np.sort(rows, axis=1)
    k = np.count_nonzero(~np.isnan(s), axis=1)
    lo = np.take_along_axis(s, np.maximum((k - 1) // 2, 0)[:, None], axis=1)[:, 0]
    hi = np.take_along_axis(s, np.minimum(k // 2, s.shape[1] - 1)[:, None], axis=1)[:, 0]
    return np.where(k > 0, 0.5 * (lo + hi), np.nan)


def _spreads(ranks: list[RankTimes]) -> np.ndarray:
    """Each rank's step-to-step spread: the larger of its own time's and its wait's robust
    standard deviation over its window (MAD scaled; a wait unsaid counts nothing)."""
    def sigma(rows: np.ndarray) -> np.ndarray:
        med = _row_medians(rows)
        return MAD_TO_SIGMA * _row_medians(np.abs(rows - med[:, None]))
    own = sigma(np.stack([st.times.buf for st in ranks]))
    wait = sigma(np.stack([st.wait.buf for st in ranks]))
    return np.fmax(own, wait)


def _loo_medians(values: np.ndarray) -> np.ndarray:
    """For each entry, the median of the others' non-NaN values (NaN where there are none):
    the middle of one sorted array with the entry's own index skipped."""
    return _Sorted(values).leave_one_out()


class _Sorted:
    """The non-NaN values of an array, sorted, with each entry's place among them."""

    def __init__(self, values: np.ndarray) -> None:
        self.n = len(values)
        keep = np.flatnonzero(~np.isnan(values))
        order = np.argsort(values[keep], kind="stable")
        self.sorted = values[keep][order]
        self.pos = np.full(self.n, -1, dtype=np.intp)
        self.pos[keep[order]] = np.arange(len(keep))

    def leave_one_out(self) -> np.ndarray:
        m = len(self.sorted)
        out = np.full(self.n, np.nan)
        if m == 0:
            return out
        own = self.pos >= 0
        out[~own] = sorted_median(self.sorted)
        if m >= 2:
            p = self.pos[own]
            lo, hi = (m - 2) // 2, (m - 1) // 2
            out[own] = 0.5 * (self.sorted[lo + (lo >= p)] + self.sorted[hi + (hi >= p)])
        return out


def _medians_without(values: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """For each group of entries, the median of the non-NaN values of every other entry:
    the middle of one sorted array with the group's places skipped, for every group at
    once (the ``t``-th value left is at ``t`` plus the skipped places at or before it, a
    fixed point reached in at most one step per skipped place)."""
    srt = _Sorted(values)
    m = len(srt.sorted)
    width = max(len(g) for g in groups)
    gone = np.full((len(groups), width), m + width)  # past any place: never skipped
    for h, g in enumerate(groups):
        places = np.sort(srt.pos[g])
        places = places[places >= 0]
        gone[h, :len(places)] = places
    left = m - np.count_nonzero(gone < m, axis=1)
    out = np.full(len(groups), np.nan)
    ok = left > 0
    if not ok.any():
        return out

    def at(t: np.ndarray) -> np.ndarray:
        j = t.copy()
        for _ in range(width + 1):
            j = t + np.count_nonzero(gone <= j[:, None], axis=1)
        return srt.sorted[np.minimum(j, m - 1)]

    lo, hi = at((left - 1) // 2), at(left // 2)
    out[ok] = (0.5 * (lo + hi))[ok]
    return out


def _finite_median(values: np.ndarray) -> float:
    v = values[~np.isnan(values)]
    return sorted_median(np.sort(v)) if len(v) else math.nan


def _span(ranks: list[int], word: str = "rank") -> str:
    """[2, 3, 5] -> "ranks 2-3, 5" (``word`` "": "2-3, 5")."""
    parts: list[str] = []
    for r in ranks:
        if parts and r == int(parts[-1].rsplit("-", 1)[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{r}"
        else:
            parts.append(str(r))
    text = ", ".join(parts)
    if not word:
        return text
    return f"{word}s {text}" if len(ranks) > 1 else f"{word} {text}"
