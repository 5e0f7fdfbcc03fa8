"""``gpu_health``: a GPU that is failing or slowing its rank, named by rank, node and GPU, with
what to do about it.

GPU faults were the largest cause of interruptions of Llama 3 405B's 54-day run (58.7% of
419, faulty GPU 30.1% and HBM3 17.2%), and most announce themselves first in NVML's cheap
counters, which the client samples on a thread of its own and sends in each step record's
``gpu`` object (docs/format.md). Each condition below is judged per rank:

- ``gpu_lost`` (critical): NVML answered GPU_IS_LOST or RESET_REQUIRED; the GPU fell off
  the bus or must be reset. No threshold: NVML says it.
- ``ecc_uncorrectable`` (critical): the GPU's uncorrectable ECC count (volatile or
  aggregate, whichever grew more) rose since this rank first reported it. The floor is
  one error: an uncorrectable error is data the GPU could not repair, which NVIDIA's own
  guidance answers with a reset and a health check; errors counted before the run began
  are not news. Corrected errors are shown, not judged (the hardware repaired them).
- ``row_remap_failure`` (critical): a row remap failed (the bank has no spare rows left):
  the GPU needs replacing.
- ``row_remap_pending`` (error): a remapped row (Ampere and later) or a retired page
  (earlier GPUs) waits for a GPU reset to take effect; until then the faulty memory is
  still in use.
- ``xid`` (error, critical for the XIDs that mean lost data or a lost GPU): the driver
  raised XID critical-error events during the run; the message says what the XID means.
- ``pcie_degraded`` (warning): the PCIe link ran narrower than its maximum width for
  ``gpu_pcie_seconds`` (a lane or riser problem: the link trained down), or at a lower
  generation than its maximum for as long while the GPU was at least ``gpu_pcie_busy``
  busy. GPUs lower the generation on an idle link to save power, which is why only a busy
  GPU's generation counts, and why either must persist: a momentary reading is not a link
  that trained down.
- ``throttle`` (warning): the GPU throttles (thermal, power or hardware slowdown, on at
  least half of the rank's last ``gpu_throttle_window`` steps) and the rank is slow with
  it: its own time (data + compute, as the straggler page reads it) is at least
  ``gpu_throttle_min_slowdown`` above the other ranks' median (BLOOM's one slow GPU cost
  5% of throughput), by at least ``gpu_throttle_sigmas`` of their per-step noise (the
  median over the other ranks of each one's robust per-step sigma: two medians of 20
  steps differ by about 0.4 sigma by chance, so 3 sigma is over 7 standard errors). A
  throttle reason most of the other ranks share (every H100 at its power cap) does not
  tell this rank apart and is not named. With no other rank to compare, the rank's own
  time on its recent steps is judged the same way against its steps without any
  throttle reason (``gpu_throttle_baseline`` of them). A throttle with no slowdown is the
  GPU managing its power as designed, and not reported.

A page names the rank, its node (the run record's ``node`` label, else ``hostname``) and
the GPU (``gpu_index``, ``gpu_uuid``, ``gpu_pci_bus_id`` from the run record's
``hardware``), so the fix (drain that node, reset that GPU) needs no lookup.

Rank 1's GPU reports two uncorrectable ECC errors at step 30::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> _ = suite.update(parse_record({"kind": "run", "run_id": "r", "rank": 1,
    ...     "labels": {"hostname": "gpu-node-7"},
    ...     "hardware": {"gpu_index": 1, "gpu_pci_bus_id": "00000000:1B:00.0"}}))
    >>> def rec(s):
    ...     return parse_record({"kind": "step", "run_id": "r", "step": s, "time": s, "rank": 1,
    ...         "gpu": {"ecc_uncorrected_volatile": 2 if s >= 30 else 0,
    ...                 "ecc_uncorrected_aggregate": 5 if s >= 30 else 3}})
    >>> found = [f for s in range(1, 40) for f in suite.update(rec(s)) if f.type == "gpu_health"]
    >>> [(f.step, f.severity.label, f.evidence["condition"]) for f in found]
    [(30, 'critical', 'ecc_uncorrectable')]
    >>> print(found[0].message)
    GPU 1 (PCI 00000000:1B:00.0) on node gpu-node-7, rank 1: 2 new uncorrectable ECC errors
    since step 1 (volatile count 0 -> 2, aggregate 3 -> 5): its memory returned data it
    could not repair
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.own_time import own_time
from monitor_agent.detectors.support.ranked import RankedValues
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, finite
from monitor_agent.records.types import Finding, Record, RunRecord, Severity, StepRecord

DRAIN = ("Drain the node (cordon it / take it out of the scheduler) and move the job off it; "
         "the job's next checkpoint restart should skip this GPU.")
RESET = ("Reset the GPU once nothing runs on it (nvidia-smi -r -i <gpu_index>) and run DCGM "
         "diagnostics (dcgmi diag -r 3) before it takes jobs again; if it fails or the "
         "errors recur, RMA it.")
SUGGESTIONS: dict[str, tuple[str, ...]] = {
    "gpu_lost": ("The GPU fell off the bus or must be reset: the job on it cannot continue. "
                 + DRAIN, "Check the node's kernel log (dmesg: NVRM Xid) and its power and "
                 "PCIe seating; reboot the node, then run DCGM diagnostics.", RESET),
    "ecc_uncorrectable": (DRAIN, RESET, "Resume the run from its last clean checkpoint: "
                          "values computed since the error may be corrupt."),
    "row_remap_failure": ("The memory has no spare rows left: replace (RMA) the GPU. "
                          + DRAIN,),
    "row_remap_pending": ("A reset applies the pending remap: " + RESET, DRAIN),
    "xid": (DRAIN, "Look the XID up in NVIDIA's XID catalogue and the node's kernel log "
            "(dmesg | grep -i xid) for what came with it.", RESET),
    "pcie_degraded": ("The link trained below its maximum: reseat the GPU or its riser, check "
                      "the slot and cable; lspci -vv shows LnkSta against LnkCap.", DRAIN),
    "throttle": ("Thermal: check the node's cooling (fans, airflow, inlet temperature, a "
                 "blocked heatsink); power: its power supply and any power cap "
                 "(nvidia-smi -q -d POWER); hardware slowdown: both, and the GPU's health.",
                 DRAIN, RESET),
}
# XIDs whose meaning is lost data or a lost GPU: critical; the others are errors.
XID_MEANING = {
    13: "a graphics engine exception", 31: "a GPU memory page fault",
    43: "the GPU stopped processing", 45: "preemptive cleanup after an earlier error",
    48: "a double-bit ECC error", 61: "an internal micro-controller breakpoint",
    62: "an internal micro-controller halt", 63: "an ECC page retirement or row remap",
    64: "a failed ECC page retirement or row remap", 74: "an NVLink error",
    79: "the GPU fell off the bus", 92: "a high single-bit ECC error rate",
    94: "a contained ECC error", 95: "an uncontained ECC error",
    119: "a GSP RPC timeout", 120: "a GSP error",
}
CRITICAL_XIDS = frozenset({48, 64, 74, 79, 95, 119, 120})
THROTTLES = {"throttle_thermal": "thermal", "throttle_power": "power",
             "throttle_hw_slowdown": "hardware slowdown"}


class GpuHealthSettings(SharedSettings):
    """The knobs of ``gpu_health`` (``detectors:`` in the sidecar's config)."""

    gpu_throttle_window: int = Field(
        default=20, ge=5, description="A rank's recent steps in the throttle judgment.")
    gpu_throttle_baseline: int = Field(
        default=50, ge=10, description="Unthrottled steps a rank with no peers needs as its "
        "own baseline.")
    gpu_throttle_min_slowdown: float = Field(
        default=0.05, gt=0, description="How much slower (fraction of the others' own time, "
        "or of its own unthrottled time) a throttling rank must be.")
    gpu_throttle_sigmas: float = Field(
        default=3.0, gt=0, description="The slowdown in the others' per-step noise (robust "
        "sigmas) it must also exceed.")
    gpu_pcie_seconds: float = Field(
        default=60.0, gt=0, description="How long a PCIe link must run below its maximum.")
    gpu_pcie_busy: float = Field(
        default=0.5, ge=0, le=1, description="Utilisation from which a generation below the "
        "maximum counts (an idle link lowers its generation by design).")


@dataclass(slots=True)
class GpuRank:
    own: Window                  # own time per step (data + compute)
    calm: Window                 # own time on steps with no throttle reason
    throttle_thermal: Window     # per throttle key of THROTTLES: 1.0 / 0.0, NaN unknown
    throttle_power: Window
    throttle_hw_slowdown: Window
    ecc_volatile: float = math.nan   # uncorrectable counts last judged (baseline)
    ecc_aggregate: float = math.nan
    ecc_since: int = -1
    xids: float = 0.0            # XID events already reported
    pcie_low_since: float = math.nan  # record time the link was first seen below max
    clock: float = math.nan      # latest SM clock and its maximum, for the message
    clock_max: float = math.nan


@dataclass(frozen=True, slots=True)
class Problem:
    """One condition found on a step (several on one step make one finding: a finding is
    one per rank, step and type)."""

    condition: str
    what: str
    severity: Severity
    value: float | None = None
    threshold: float | None = None
    evidence: dict[str, Any] | None = None


@dataclass(slots=True)
class GpuIdentity:
    node: str | None = None
    gpu_index: Any = None
    gpu_uuid: str | None = None
    gpu_pci_bus_id: str | None = None


class GpuHealthDetector(DetectorBase[GpuHealthSettings]):
    """Findings about a rank's GPU (``evidence["condition"]`` says which; see the module
    docstring for each one's rule)."""

    type = "gpu_health"
    # Each finding carries its condition's severity; WARNING is the least of them (the
    # rules' shadow check reads the usual one: the default TrainingGpuFault rule takes
    # error and above, TrainingGpuHealth the rest).
    severity = Severity.WARNING
    settings_model = GpuHealthSettings

    def __init__(self, settings: GpuHealthSettings, ctx: Any) -> None:
        super().__init__(settings, ctx)
        self.identity: dict[int, GpuIdentity] = {}
        self._peers = _Peers()  # derived from the ranks' windows: not snapshotted

    def new_rank(self) -> GpuRank:
        n = self.settings.gpu_throttle_window
        return GpuRank(own=Window.of(n), calm=Window.of(self.settings.gpu_throttle_baseline),
                       throttle_thermal=Window.of(n), throttle_power=Window.of(n),
                       throttle_hw_slowdown=Window.of(n))

    def update(self, record: Record) -> list[Finding]:
        if isinstance(record, RunRecord):
            hw = record.hardware
            self.identity[record.rank] = GpuIdentity(
                node=record.labels.get("node") or record.labels.get("hostname") or None,
                gpu_index=hw.get("gpu_index") if isinstance(hw.get("gpu_index"), int) else None,
                gpu_uuid=_text(hw.get("gpu_uuid")),
                gpu_pci_bus_id=_text(hw.get("gpu_pci_bus_id")))
            return []
        return super().update(record)

    def snapshot_extra(self) -> dict[str, Any]:
        return {str(r): {"node": i.node, "gpu_index": i.gpu_index, "gpu_uuid": i.gpu_uuid,
                         "gpu_pci_bus_id": i.gpu_pci_bus_id} for r, i in self.identity.items()}

    def restore_extra(self, data: dict[str, Any]) -> None:
        self._peers = _Peers(dirty=set(self.ranks))
        self.identity = {int(r): GpuIdentity(node=v.get("node"), gpu_index=v.get("gpu_index"),
                                             gpu_uuid=v.get("gpu_uuid"),
                                             gpu_pci_bus_id=v.get("gpu_pci_bus_id"))
                         for r, v in data.items()}

    # -- per step -------------------------------------------------------------------------
    def on_step(self, rec: StepRecord, st: GpuRank) -> list[Finding]:
        gpu = rec.gpu or {}
        self._times(rec, st, gpu)
        if not gpu:
            return []
        found = [p for check in (self._lost, self._ecc, self._remap, self._xid, self._pcie,
                                 self._throttle) if (p := check(rec, st, gpu)) is not None]
        return [self._finding(rec, found)] if found else []

    def _times(self, rec: StepRecord, st: GpuRank, gpu: dict[str, float | None]) -> None:
        own = own_time(rec)
        if own is None:
            return
        st.own.add(own)
        self._peers.dirty.add(rec.rank)
        throttled = False
        for key in THROTTLES:
            window, value = getattr(st, key), gpu.get(key)
            window.add(math.nan if value is None or not finite(value) else float(value > 0))
            throttled = throttled or bool(value and value > 0)
        if not throttled:
            st.calm.add(own)
        clock, top = gpu.get("sm_clock_mhz"), gpu.get("sm_clock_max_mhz")
        st.clock = clock if finite(clock) else math.nan
        st.clock_max = top if finite(top) else math.nan

    def _lost(self, rec: StepRecord, st: GpuRank, gpu: dict) -> Problem | None:
        if not (gpu.get("gpu_lost") or 0) > 0 or not self._due(rec, "gpu_lost"):
            return None
        return Problem("gpu_lost", "NVML reports the GPU lost (it fell off the bus or needs "
                       "a reset)", Severity.CRITICAL, value=1.0)

    def _ecc(self, rec: StepRecord, st: GpuRank, gpu: dict) -> Problem | None:
        vol, agg = gpu.get("ecc_uncorrected_volatile"), gpu.get("ecc_uncorrected_aggregate")
        vol = vol if finite(vol) else math.nan
        agg = agg if finite(agg) else math.nan
        if math.isnan(vol) and math.isnan(agg):
            return None
        if st.ecc_since < 0:  # the first reading is the baseline: earlier errors are old news
            st.ecc_volatile, st.ecc_aggregate, st.ecc_since = vol, agg, rec.step
            return None
        new_vol = vol - st.ecc_volatile if vol == vol and st.ecc_volatile == st.ecc_volatile \
            else 0.0
        new_agg = agg - st.ecc_aggregate if agg == agg and st.ecc_aggregate == st.ecc_aggregate \
            else 0.0
        if vol < st.ecc_volatile:  # a driver reload reset the volatile count: rebase
            new_vol, st.ecc_volatile = 0.0, vol
        new = max(new_vol, new_agg)
        if new < 1:
            return None
        parts = []
        if new_vol >= 1:
            parts.append(f"volatile count {_n(st.ecc_volatile)} -> {_n(vol)}")
        if new_agg >= 1:
            parts.append(f"aggregate {_n(st.ecc_aggregate)} -> {_n(agg)}")
        since = st.ecc_since
        st.ecc_volatile = vol if vol == vol else st.ecc_volatile
        st.ecc_aggregate = agg if agg == agg else st.ecc_aggregate
        st.ecc_since = rec.step
        return Problem("ecc_uncorrectable",
                       f"{_n(new)} new uncorrectable ECC error{'s' if new != 1 else ''} since "
                       f"step {since} ({', '.join(parts)}): its memory returned data it could "
                       "not repair", Severity.CRITICAL, value=new, threshold=1.0,
                       evidence={"ecc_uncorrected_volatile": vol,
                                 "ecc_uncorrected_aggregate": agg})

    def _remap(self, rec: StepRecord, st: GpuRank, gpu: dict) -> Problem | None:
        if (gpu.get("remapped_rows_failure") or 0) > 0:
            if not self._due(rec, "row_remap_failure"):
                return None
            return Problem("row_remap_failure", "a row remap failed: its memory has "
                           "no spare rows left", Severity.CRITICAL, value=1.0,
                           evidence=_pick(gpu, "remapped_rows_uncorrectable"))
        rows = (gpu.get("remapped_rows_pending") or 0) > 0
        pages = (gpu.get("retired_pages_pending") or 0) > 0
        if not (rows or pages) or not self._due(rec, "row_remap_pending"):
            return None
        what = "a row remap" if rows else "a page retirement"
        return Problem("row_remap_pending", f"{what} is pending: the faulty memory "
                       "stays in use until the GPU is reset", Severity.ERROR, value=1.0,
                       evidence=_pick(gpu, "remapped_rows_uncorrectable",
                                      "remapped_rows_correctable"))

    def _xid(self, rec: StepRecord, st: GpuRank, gpu: dict) -> Problem | None:
        count = gpu.get("xid_count")
        if not finite(count) or count <= st.xids:
            if finite(count) and count < st.xids:  # a new process: its count starts over
                st.xids = count
            return None
        new, st.xids = count - st.xids, count
        last = gpu.get("xid_last")
        code = int(last) if finite(last) and 0 <= last < 2**31 else None  # an XID is small
        meaning = XID_MEANING.get(code, "see NVIDIA's XID catalogue") if code is not None \
            else "unknown"
        severity = Severity.CRITICAL if code in CRITICAL_XIDS else Severity.ERROR
        return Problem("xid", f"the driver raised {_n(new)} XID critical-error "
                       f"event{'s' if new != 1 else ''}, the last XID {code} "
                       f"({meaning})", severity, value=new,
                       evidence={"xid_last": code, "xid_count": count})

    def _pcie(self, rec: StepRecord, st: GpuRank, gpu: dict) -> Problem | None:
        width, width_max = _f(gpu.get("pcie_link_width")), _f(gpu.get("pcie_link_width_max"))
        gen, gen_max = _f(gpu.get("pcie_link_gen")), _f(gpu.get("pcie_link_gen_max"))
        busy = (gpu.get("utilization") or 0.0) >= self.settings.gpu_pcie_busy
        narrow = width < width_max  # False where either is unknown (NaN)
        slow = gen < gen_max and busy
        if not (narrow or slow):
            if width == width or gen == gen:
                st.pcie_low_since = math.nan
            return None
        if math.isnan(st.pcie_low_since):
            st.pcie_low_since = rec.time
        lasted = rec.time - st.pcie_low_since
        if lasted < self.settings.gpu_pcie_seconds or not self._due(rec, "pcie_degraded"):
            return None
        what = []
        if narrow:
            what.append(f"x{_n(width)} of x{_n(width_max)} lanes")
        if slow:
            what.append(f"generation {_n(gen)} of {_n(gen_max)} while "
                        f"{(gpu.get('utilization') or 0.0):.0%} busy")
        return Problem("pcie_degraded", f"its PCIe link runs at {' and '.join(what)} "
                       f"for {lasted:.0f} s: host-device copies and NCCL's PCIe "
                       "traffic slow down", Severity.WARNING, value=lasted,
                       threshold=self.settings.gpu_pcie_seconds,
                       evidence=_pick(gpu, "pcie_link_width", "pcie_link_width_max",
                                      "pcie_link_gen", "pcie_link_gen_max"))

    def _throttle(self, rec: StepRecord, st: GpuRank, gpu: dict) -> Problem | None:
        s = self.settings
        if not st.own.full:
            return None
        mine = _reasons(st)
        if not mine:
            return None
        peers = self._peers.refresh(self.ranks)
        own = st.own.median()
        if peers.count > 1:  # the other ranks with a full window: their medians, in order
            others = peers.count - 1
            theirs = peers.median.median_without(rec.rank)
            noise = peers.mad.median_without(rec.rank)
            # a reason most of the others share does not tell this rank apart
            mine = [k for k in mine if (peers.reasons[k] - 1) * 2 < others]
            against = "the other ranks"
        else:
            if len(st.calm) < s.gpu_throttle_baseline:
                return None
            theirs, noise = st.calm.median(), st.calm.mad()
            against = "its own steps without a throttle"
        if not mine or not (theirs > 0 and own >= theirs * (1 + s.gpu_throttle_min_slowdown)
                            and own - theirs >= s.gpu_throttle_sigmas * noise):
            return None
        if not self._due(rec, "throttle"):
            return None
        steps = max(int(np.nansum(getattr(st, k).values())) for k in mine)
        clock = (f", SM clock {_n(st.clock)} of {_n(st.clock_max)} MHz"
                 if finite(st.clock) and finite(st.clock_max) else "")
        reasons = ", ".join(THROTTLES[k] for k in mine)
        return Problem("throttle", f"its GPU throttles ({reasons}) on {steps} of its last "
                       f"{len(st.own)} steps{clock}, and the rank is slow with it: its own "
                       f"time {_ms(own)} vs {_ms(theirs)} on {against} "
                       f"({own / theirs - 1:+.0%})", Severity.WARNING, value=own,
                       threshold=theirs * (1 + s.gpu_throttle_min_slowdown),
                       evidence={"throttle": [THROTTLES[k] for k in mine], "own_time": own,
                                 "others_own_time": theirs,
                                 "compared_with": "peers" if peers.count > 1 else "self",
                                 "sm_clock_mhz": st.clock, "sm_clock_max_mhz": st.clock_max})

    # -- helpers ---------------------------------------------------------------------------
    def _due(self, rec: StepRecord, condition: str) -> bool:
        return self.repeat.due(f"{rec.rank}/{condition}", rec.step,
                               self.settings.repeat_every_steps)

    def _finding(self, rec: StepRecord, problems: list[Problem]) -> Finding:
        """One finding for the step: the most severe problem first, the others after it."""
        problems = sorted(problems, key=lambda p: -p.severity)
        head = problems[0]
        who = self.identity.get(rec.rank) or GpuIdentity()
        node = who.node or self.ctx.rank(rec.rank).host
        gpu = f"GPU {who.gpu_index}" if who.gpu_index is not None else "the GPU"
        if who.gpu_pci_bus_id:
            gpu += f" (PCI {who.gpu_pci_bus_id})"
        where = f"{gpu} on node {node}" if node else gpu
        message = f"{where}, rank {rec.rank}: " + "; ".join(p.what for p in problems)
        facts: dict[str, Any] = {}
        for p in reversed(problems):
            facts.update(p.evidence or {})
        facts = {"condition": head.condition, "node": node, "gpu_index": who.gpu_index,
                 "gpu_uuid": who.gpu_uuid, "gpu_pci_bus_id": who.gpu_pci_bus_id, **facts}
        if len(problems) > 1:
            facts["conditions"] = [p.condition for p in problems]
        suggestions = tuple(dict.fromkeys(s for p in problems for s in SUGGESTIONS[p.condition]))
        return self.finding(rec, message, value=head.value, threshold=head.threshold,
                            evidence={k: v for k, v in facts.items()
                                      if v is not None and not (isinstance(v, float) and v != v)},
                            suggestions=suggestions, severity=head.severity)


@dataclass(slots=True)
class _Peers:
    """The ranks with a full window, for the throttle check's "the other ranks": each one's
    window median and robust sigma in order (``RankedValues``) and how many of them show
    each throttle reason. Kept up lazily: a record marks its rank ``dirty`` (O(1)), and
    the check brings the dirty ranks up to date first, O(window log window + log ranks)
    each, so the check costs O(log ranks) a record amortised, not a median of every
    other rank's window (O(ranks) a record: 20 ms at 256 ranks whose GPUs all throttle,
    as every H100 at its power cap does)."""

    dirty: set[int] = field(default_factory=set)
    median: RankedValues = field(default_factory=RankedValues)
    mad: RankedValues = field(default_factory=RankedValues)
    reasons: dict[str, int] = field(default_factory=lambda: dict.fromkeys(THROTTLES, 0))
    held: dict[int, list[str]] = field(default_factory=dict)  # each counted rank's reasons
    refreshes: int = 0  # ranks brought up to date (the tests count them)

    @property
    def count(self) -> int:
        return len(self.median)

    def refresh(self, ranks: dict[int, GpuRank]) -> _Peers:
        for r in self.dirty:
            st = ranks.get(r)
            if st is None or not st.own.full:
                continue
            for key in self.held.pop(r, ()):
                self.reasons[key] -= 1
            self.refreshes += 1
            self.median.set(r, st.own.median())
            self.mad.set(r, st.own.mad())
            held = self.held[r] = _reasons(st)
            for key in held:
                self.reasons[key] += 1
        self.dirty.clear()
        return self


def _reasons(st: GpuRank) -> list[str]:
    """The throttle keys on at least half of the rank's window (readings that say)."""
    out = []
    for key in THROTTLES:
        window = getattr(st, key)
        v = window.values()
        v = v[~np.isnan(v)]
        if len(v) * 2 >= len(window.buf) and float(v.mean()) >= 0.5:
            out.append(key)
    return out


def _f(value: Any) -> float:
    """A reading's number, NaN when it is missing or not finite."""
    return float(value) if finite(value) else math.nan


def _pick(gpu: dict, *keys: str) -> dict[str, Any]:
    return {k: gpu[k] for k in keys if finite(gpu.get(k))}


def _text(value: Any) -> str | None:
    return str(value)[:256] if isinstance(value, str) and value else None


def _n(x: float) -> str:
    return f"{x:.0f}" if x == int(x) else f"{x:g}"


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x >= 0.0095 else f"{x * 1000:.1f} ms"
