"""The GPU's own health through NVML, sampled on a background thread of its own.

Two layers, both behind the one-method ``GpuProbe`` interface (``read() -> dict | None``):

- ``NvmlProbe`` reads one GPU: utilisation, temperature and power, and the cheap signals
  that name a sick GPU before it dies (docs/format.md, ``gpu``): ECC error counts (volatile
  and aggregate, corrected and uncorrected), retired pages / remapped rows pending, clock
  throttle reasons (thermal, power, hardware slowdown), the SM clock against its maximum,
  the PCIe link's width and generation against theirs, and XID critical-error events.
- ``GpuSampler`` calls a probe every ``MonitorSettings.gpu_sample_interval`` seconds (default
  1) on the thread ``monitor-client-gpu`` and keeps the latest reading; the sender thread
  attaches it to each step record. Neither the training thread nor the sender ever calls
  NVML per step: an NVML call can take milliseconds (ECC and row-remap queries go to the
  driver), and on a failing GPU it can hang, which would then stall only this thread,
  never training or the delivery of a NaN page.

NVML (``pip install nvidia-ml-py``) is optional: ``nvml_probe`` answers None when it is
missing or no GPU answers, and the step records then carry no ``gpu`` object. Each group
of fields is read on its own, so one the driver or the GPU does not support (ECC off on a
consumer card, row remapping before Ampere, events without the permission) costs only its
own fields, and is not asked again:

- NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, DEPRECATED, or a call this pynvml does
  not have: that group is switched off for the run;
- GPU_IS_LOST or RESET_REQUIRED: the reading says ``gpu_lost: 1`` (the GPU fell off the
  bus or needs a reset) and stops there; the next sample asks again;
- any other error (a timeout, UNKNOWN, a driver that answers errors): that group is left
  out of this reading and ``nvml_errors`` counts the failed calls since the start.

Any object with NVML's calls will do in place of ``pynvml`` (tests/client/test_nvml.py
has one with each failure mode); here one that knows only the first three readings::

    >>> from types import SimpleNamespace
    >>> nvml = SimpleNamespace(NVML_TEMPERATURE_GPU=0,
    ...                        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=93),
    ...                        nvmlDeviceGetTemperature=lambda h, sensor: 61,
    ...                        nvmlDeviceGetPowerUsage=lambda h: 412_000)     # mW
    >>> probe = NvmlProbe(nvml, handle=0)
    >>> probe.read()
    {'utilization': 0.93, 'temperature_c': 61.0, 'power_w': 412.0}
    >>> sorted(probe.unsupported)[:3]          # the groups this "driver" lacks, not asked again
    ['clocks', 'ecc', 'pcie']
    >>> NvmlProbe(SimpleNamespace(), handle=0).read() is None
    True
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from monitor_client._errors import MonitorClientError


class GpuProbe(Protocol):
    def read(self) -> dict[str, float] | None: ...


# NVML's error codes (nvml.h, nvmlReturn_t) that decide what a failed call means.
NOT_SUPPORTED, NO_PERMISSION, TIMEOUT, FUNCTION_NOT_FOUND = 3, 4, 10, 13
GPU_IS_LOST, RESET_REQUIRED, DEPRECATED = 15, 16, 26
_NEVER = frozenset({NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND, DEPRECATED})
_LOST = frozenset({GPU_IS_LOST, RESET_REQUIRED})

# nvmlClocksEventReasons bits (nvml.h; "throttle reasons" before driver 535). Idle,
# application clocks, sync boost and display clocks are the GPU working as set: not
# reasons a busy GPU is slow.
SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x4, 0x8, 0x20, 0x40, 0x80
THROTTLE_FLAGS = {
    "throttle_thermal": SW_THERMAL | HW_THERMAL,
    "throttle_power": SW_POWER_CAP | HW_POWER_BRAKE,
    "throttle_hw_slowdown": HW_SLOWDOWN,
}
# Every key a reading can hold (docs/format.md, ``gpu``, describes each).
FIELDS = ("utilization", "temperature_c", "power_w", "power_limit_w", "sm_clock_mhz",
          "sm_clock_max_mhz", "throttle_reasons", *THROTTLE_FLAGS, "ecc_corrected_volatile",
          "ecc_corrected_aggregate", "ecc_uncorrected_volatile", "ecc_uncorrected_aggregate",
          "retired_pages_pending", "remapped_rows_correctable", "remapped_rows_uncorrectable",
          "remapped_rows_pending", "remapped_rows_failure", "pcie_link_width",
          "pcie_link_width_max", "pcie_link_gen", "pcie_link_gen_max", "xid_count", "xid_last",
          "gpu_lost", "nvml_errors")
XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
MAX_XIDS_PER_READ = 64  # events drained per sample; a storm beyond is counted next time


class _Lost(MonitorClientError):
    """NVML said the GPU is gone: the reading ends with ``gpu_lost``."""


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


class NvmlProbe:
    """Reads one GPU through pynvml; construct with ``nvml_probe(index, uuid)``.

    ``read()`` is called from ``GpuSampler``'s thread; ``describe()`` once, at ``watch()``,
    for the run record's ``hardware`` (which GPU this rank is: what a page must name).
    """

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle
        self.unsupported: set[str] = set()
        self.errors = 0
        self._events: Any = None  # the XID event set, once registered
        self._xids = 0
        self._last_xid: int | None = None
        self._groups: tuple[tuple[str, Callable[[dict[str, float]], None]], ...] = (
            ("utilization", self._utilization), ("temperature", self._temperature),
            ("power", self._power), ("power_limit", self._power_limit),
            ("clocks", self._clocks), ("throttle", self._throttle), ("ecc", self._ecc),
            ("retired_pages", self._retired_pages), ("remapped_rows", self._remapped_rows),
            ("pcie", self._pcie), ("xid", self._xid))

    def read(self) -> dict[str, float] | None:
        out: dict[str, float] = {}
        for name, group in self._groups:
            if name in self.unsupported:
                continue
            try:
                group(out)
            except _Lost:
                out["gpu_lost"] = 1.0
                break
            except Exception as exc:  # noqa: BLE001 - a driver's error costs its group only
                self._failed(name, exc)
        if self.errors:
            out["nvml_errors"] = float(self.errors)
        if not out and len(self.unsupported) == len(self._groups):
            return None
        return out or None

    def _failed(self, group: str, exc: BaseException) -> None:
        code = _code(exc)
        if code in _NEVER or isinstance(exc, AttributeError | TypeError):
            self.unsupported.add(group)  # this driver, GPU or pynvml cannot: never again
        else:
            self.errors += 1

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, name)(self._handle, *args)
        except Exception as exc:
            if _code(exc) in _LOST:
                raise _Lost from exc
            raise

    # -- the groups: each fills its keys of docs/format.md's ``gpu`` object ------------------
    def _utilization(self, out: dict[str, float]) -> None:
        out["utilization"] = self._call("nvmlDeviceGetUtilizationRates").gpu / 100.0

    def _temperature(self, out: dict[str, float]) -> None:
        out["temperature_c"] = float(self._call("nvmlDeviceGetTemperature",
                                                self._nvml.NVML_TEMPERATURE_GPU))

    def _power(self, out: dict[str, float]) -> None:
        out["power_w"] = self._call("nvmlDeviceGetPowerUsage") / 1000.0  # mW -> W

    def _power_limit(self, out: dict[str, float]) -> None:
        out["power_limit_w"] = self._call("nvmlDeviceGetEnforcedPowerLimit") / 1000.0

    def _clocks(self, out: dict[str, float]) -> None:
        sm = self._nvml.NVML_CLOCK_SM
        now = float(self._call("nvmlDeviceGetClockInfo", sm))
        top = float(self._call("nvmlDeviceGetMaxClockInfo", sm))
        out["sm_clock_mhz"], out["sm_clock_max_mhz"] = now, top

    def _throttle(self, out: dict[str, float]) -> None:
        name = ("nvmlDeviceGetCurrentClocksEventReasons"
                if hasattr(self._nvml, "nvmlDeviceGetCurrentClocksEventReasons")
                else "nvmlDeviceGetCurrentClocksThrottleReasons")
        mask = int(self._call(name))
        out["throttle_reasons"] = float(mask)
        for key, bits in THROTTLE_FLAGS.items():
            out[key] = 1.0 if mask & bits else 0.0

    def _ecc(self, out: dict[str, float]) -> None:
        nv = self._nvml
        for kind, error in (("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                            ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            for scope, counter in (("volatile", nv.NVML_VOLATILE_ECC),
                                   ("aggregate", nv.NVML_AGGREGATE_ECC)):
                out[f"ecc_{kind}_{scope}"] = float(self._call(
                    "nvmlDeviceGetTotalEccErrors", error, counter))

    def _retired_pages(self, out: dict[str, float]) -> None:
        # Pre-Ampere: pages retired for ECC errors take effect at the next driver reload.
        out["retired_pages_pending"] = float(bool(self._call(
            "nvmlDeviceGetRetiredPagesPendingStatus")))

    def _remapped_rows(self, out: dict[str, float]) -> None:
        # Ampere and later: a row remap is pending until the GPU is reset; a failed one
        # means the bank has no spare rows left.
        corrected, uncorrected, pending, failed = self._call("nvmlDeviceGetRemappedRows")
        out.update(remapped_rows_correctable=float(corrected),
                   remapped_rows_uncorrectable=float(uncorrected),
                   remapped_rows_pending=float(bool(pending)),
                   remapped_rows_failure=float(bool(failed)))

    def _pcie(self, out: dict[str, float]) -> None:
        width = float(self._call("nvmlDeviceGetCurrPcieLinkWidth"))
        width_max = float(self._call("nvmlDeviceGetMaxPcieLinkWidth"))
        gen = float(self._call("nvmlDeviceGetCurrPcieLinkGeneration"))
        gen_max = float(self._call("nvmlDeviceGetMaxPcieLinkGeneration"))
        out.update(pcie_link_width=width, pcie_link_width_max=width_max,
                   pcie_link_gen=gen, pcie_link_gen_max=gen_max)

    def _xid(self, out: dict[str, float]) -> None:
        nv = self._nvml
        if self._events is None:
            events = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(self._handle, XID_CRITICAL, events)
            self._events = events
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        for _ in range(MAX_XIDS_PER_READ):
            try:
                data = wait(self._events, 0)  # 0 ms: what is queued, never a wait
            except Exception as exc:
                if _code(exc) == TIMEOUT:  # nothing (more) queued
                    break
                if _code(exc) in _LOST:
                    raise _Lost from exc
                raise
            self._xids += 1
            self._last_xid = int(getattr(data, "eventData", 0) or 0)
        out["xid_count"] = float(self._xids)
        if self._last_xid is not None:
            out["xid_last"] = float(self._last_xid)

    def describe(self) -> dict[str, Any]:
        """Which GPU this is, for the run record's ``hardware``: ``gpu_index`` (NVML's,
        = ``nvidia-smi -i``), ``gpu_uuid``, ``gpu_pci_bus_id``, ``gpu_serial``,
        ``driver_version``; what the driver does not say is left out."""
        found: dict[str, Any] = {}
        nv = self._nvml
        for key, call in (("gpu_index", lambda: nv.nvmlDeviceGetIndex(self._handle)),
                          ("gpu_uuid", lambda: nv.nvmlDeviceGetUUID(self._handle)),
                          ("gpu_pci_bus_id",
                           lambda: nv.nvmlDeviceGetPciInfo(self._handle).busId),
                          ("gpu_serial", lambda: nv.nvmlDeviceGetSerial(self._handle)),
                          ("driver_version", nv.nvmlSystemGetDriverVersion)):
            try:
                value = call()
            except Exception:  # noqa: BLE001 - unsupported or failing: not said
                continue
            found[key] = value.decode() if isinstance(value, bytes) else value
        return found


def nvml_probe(index: int, uuid: str | None = None) -> NvmlProbe | None:
    """An NVML probe for a CUDA device, or None when NVML is unavailable.

    ``uuid`` (torch's ``get_device_properties(i).uuid``) finds the GPU whatever
    ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` did to the numbering: CUDA device
    ``index`` is NVML's ``index`` only when neither renumbered the devices, and a page that
    says "reset GPU 3" must name the GPU that is sick.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = None
        if uuid:
            name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(name)
            except Exception:  # noqa: BLE001 - an older driver: fall back to the index
                handle = None
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return NvmlProbe(pynvml, handle)
    except Exception:  # noqa: BLE001 - missing package, driver or device: no gpu stats
        return None


class GpuSampler:
    """Reads ``probe`` every ``interval`` seconds on a daemon thread; ``read()`` returns the
    latest reading at once (None before the first one, or when the probe has nothing).

    A probe that raises gives no reading for that sample, and a probe that hangs stalls
    this thread only (records then carry its last reading). ``close()`` stops it::

        >>> class Probe:
        ...     n = 0
        ...     def read(self):
        ...         Probe.n += 1
        ...         return {"temperature_c": 60.0 + Probe.n}
        >>> sampler = GpuSampler(Probe(), interval=60.0).start()
        >>> sampler.wait_first(5.0), sampler.read()
        (True, {'temperature_c': 61.0})
        >>> sampler.close()
    """

    def __init__(self, probe: Any, interval: float = 1.0) -> None:
        self.probe, self.interval = probe, float(interval)
        self._latest: dict[str, float] | None = None
        self._first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor-client-gpu",
                                        daemon=True)

    def start(self) -> GpuSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                reading = self.probe.read()
                self._latest = dict(reading) if reading else None
            except Exception:  # noqa: BLE001 - a broken probe: no reading, never a crash
                self._latest = None
            self._first.set()
            self._stop.wait(max(self.interval - (time.monotonic() - started), 0.0))

    def read(self) -> dict[str, float] | None:
        latest = self._latest  # one reference read: the thread replaces, never mutates it
        return dict(latest) if latest else None

    def wait_first(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the first reading (at ``watch()``, so the first step
        records carry one); False if the probe has not answered by then."""
        return self._first.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(1.0)

    def describe(self) -> dict[str, Any]:
        """The probe's ``describe()`` (which GPU), or nothing for a probe without one."""
        describe = getattr(self.probe, "describe", None)
        try:
            return dict(describe()) if describe is not None else {}
        except Exception:  # noqa: BLE001 - identity is a courtesy, never a failure
            return {}
