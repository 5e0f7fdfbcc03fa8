"""A fake ``pynvml`` (nvidia-ml-py) at the NVML boundary, for CPU "GPUs" on netcluster
nodes: each local rank is GPU ``LOCAL_RANK`` of its node, healthy (an H100 at work, no
throttling, no errors) until the node's ``gpu.json`` (``$NETCLUSTER_FAULTS``, see
netcluster/fault_files.py) says otherwise: an XID event, an uncorrectable ECC count.

On ``PYTHONPATH`` ahead of any real one, so the client's own NVML code
(``monitor_client._nvml.nvml_probe``) reads it exactly as it reads a driver.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
NVML_ERROR_TIMEOUT = 10
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8

_init_time: float | None = None


class EventSet:
    """An event set: the GPUs registered with it and the XIDs it has handed out."""

    def __init__(self) -> None:
        self.gpus: set[int] = set()
        self.delivered: dict[int, int] = {}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def _faults() -> dict[str, Any]:
    directory = os.environ.get("NETCLUSTER_FAULTS")
    if not directory:
        return {}
    try:
        return json.loads((Path(directory) / "gpu.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def nvmlInit() -> None:  # noqa: N802 - NVML's names
    global _init_time
    _init_time = time.time()


def nvmlShutdown() -> None:  # noqa: N802
    pass


def nvmlDeviceGetHandleByIndex(index: int) -> int:  # noqa: N802
    return int(index)


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:  # noqa: N802
    raise NVMLError(13)  # FUNCTION_NOT_FOUND: the client falls back to the index


def nvmlDeviceGetUtilizationRates(h: int) -> SimpleNamespace:  # noqa: N802
    return SimpleNamespace(gpu=97, memory=40)


def nvmlDeviceGetTemperature(h: int, sensor: int) -> int:  # noqa: N802
    return 64


def nvmlDeviceGetPowerUsage(h: int) -> int:  # noqa: N802
    return 650_000


def nvmlDeviceGetEnforcedPowerLimit(h: int) -> int:  # noqa: N802
    return 700_000


def nvmlDeviceGetClockInfo(h: int, clock: int) -> int:  # noqa: N802
    return 1980


def nvmlDeviceGetMaxClockInfo(h: int, clock: int) -> int:  # noqa: N802
    return 1980


def nvmlDeviceGetCurrentClocksEventReasons(h: int) -> int:  # noqa: N802
    return 0


def nvmlDeviceGetTotalEccErrors(h: int, kind: int, counter: int) -> int:  # noqa: N802
    if kind != NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        return 0
    return int(_faults().get("ecc_uncorrected", {}).get(str(h), 0))


def nvmlDeviceGetRetiredPagesPendingStatus(h: int) -> int:  # noqa: N802
    return 0


def nvmlDeviceGetRemappedRows(h: int) -> tuple[int, int, bool, bool]:  # noqa: N802
    return (0, 0, False, False)


def nvmlDeviceGetCurrPcieLinkWidth(h: int) -> int:  # noqa: N802
    return 16


def nvmlDeviceGetMaxPcieLinkWidth(h: int) -> int:  # noqa: N802
    return 16


def nvmlDeviceGetCurrPcieLinkGeneration(h: int) -> int:  # noqa: N802
    return 5


def nvmlDeviceGetMaxPcieLinkGeneration(h: int) -> int:  # noqa: N802
    return 5


def nvmlEventSetCreate() -> EventSet:  # noqa: N802
    return EventSet()


def nvmlDeviceRegisterEvents(h: int, types: int, events: EventSet) -> None:  # noqa: N802
    events.gpus.add(int(h))


def nvmlEventSetWait_v2(events: EventSet, timeout_ms: int) -> SimpleNamespace:  # noqa: N802
    """The next XID raised since ``nvmlInit`` on a GPU registered with ``events``."""
    since = _init_time or 0.0
    for gpu in sorted(events.gpus):
        raised = [e for e in _faults().get("xid", [])
                  if int(e["gpu"]) == gpu and float(e["time"]) >= since]
        done = events.delivered.get(gpu, 0)
        if len(raised) > done:
            events.delivered[gpu] = done + 1
            return SimpleNamespace(eventType=NVML_EVENT_TYPE_XID_CRITICAL_ERROR, device=gpu,
                                   eventData=int(raised[done]["code"]))
    raise NVMLError(NVML_ERROR_TIMEOUT)


nvmlEventSetWait = nvmlEventSetWait_v2  # noqa: N816 - older pynvml's name


def nvmlDeviceGetIndex(h: int) -> int:  # noqa: N802
    return int(h)


def nvmlDeviceGetUUID(h: int) -> str:  # noqa: N802
    node = os.environ.get("NETCLUSTER_NODE", "0")
    return f"GPU-00000000-0000-0000-{int(node):04d}-{int(h):012d}"


def nvmlDeviceGetPciInfo(h: int) -> SimpleNamespace:  # noqa: N802
    return SimpleNamespace(busId=f"00000000:{0x18 + int(h):02X}:00.0")


def nvmlDeviceGetSerial(h: int) -> str:  # noqa: N802
    raise NVMLError(3)  # NOT_SUPPORTED


def nvmlSystemGetDriverVersion() -> str:  # noqa: N802
    return "580.159.04"
