"""GPU utilisation, temperature and power through NVML, behind a one-method interface.

NVML (``pip install nvidia-ml-py``) is optional: ``nvml_probe`` answers None when it is
missing or no GPU answers, and the step records then simply carry no ``gpu`` object.
Tests substitute any object with ``read() -> dict`` (NVML is a boundary we cannot reach
without a GPU). ``Monitor.watch`` asks ``nvml_probe(device.index)`` for one when the model
is on a CUDA device (``MonitorConfig(gpu_probe=...)`` overrides it); the example of
``NvmlProbe`` reads a fake NVML.
"""

from __future__ import annotations

from typing import Any, Protocol


class GpuProbe(Protocol):
    def read(self) -> dict[str, float] | None: ...


class NvmlProbe:
    """Reads one GPU through pynvml; construct with ``nvml_probe(index)``.

    Any object with NVML's calls will do in place of ``pynvml``; a driver that fails gives
    None::

        >>> from types import SimpleNamespace
        >>> nvml = SimpleNamespace(NVML_TEMPERATURE_GPU=0,
        ...                        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=93),
        ...                        nvmlDeviceGetTemperature=lambda h, sensor: 61,
        ...                        nvmlDeviceGetPowerUsage=lambda h: 412_000)     # mW
        >>> NvmlProbe(nvml, handle=0).read()
        {'utilization': 0.93, 'temperature_c': 61.0, 'power_w': 412.0}
        >>> NvmlProbe(SimpleNamespace(), handle=0).read() is None
        True
    """

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle

    def read(self) -> dict[str, float] | None:
        nv = self._nvml
        try:
            util = nv.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100.0
            temp = nv.nvmlDeviceGetTemperature(self._handle, nv.NVML_TEMPERATURE_GPU)
            power = nv.nvmlDeviceGetPowerUsage(self._handle) / 1000.0  # mW -> W
        except Exception:  # noqa: BLE001 - a flaky driver must not break the record
            return None
        return {"utilization": float(util), "temperature_c": float(temp), "power_w": power}


def nvml_probe(index: int) -> NvmlProbe | None:
    """An NVML probe for GPU ``index``, or None when NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return NvmlProbe(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
    except Exception:  # noqa: BLE001 - missing package, driver or device: no gpu stats
        return None
