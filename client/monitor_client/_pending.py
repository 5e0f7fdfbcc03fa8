"""A step record whose device statistics are still in flight to the host.

``Monitor.log_step`` builds one of these on the training thread: the plain fields are
filled in, the device statistics are still device tensors in a ``StatsPack``. The sender
thread calls ``materialize()``: it copies the pack to the host as one vector (THE sync
point of a step, off the training thread), names the numbers, reads memory and GPU probes
and derives tokens/s and MFU.

``log_step`` hands one to ``Sender.submit``; in the sender thread, ``materialize()`` names
the pack's numbers and derives tokens/s from the step time and MFU from the probes::

    >>> import torch
    >>> from monitor_client._pack import StatsPack
    >>> pack = StatsPack()
    >>> pack.add("grad_norm", torch.tensor(0.5))          # still a device tensor
    >>> record = {"kind": "step", "step": 7, "tokens": 4096, "step_time": 0.5}
    >>> PendingStep(record, pack, Probes(flops_per_token=6e6, peak_flops=1e11)).materialize()
    {'kind': 'step', 'step': 7, 'tokens': 4096, 'step_time': 0.5, 'grad_norm': 0.5,
     'tokens_per_second': 8192.0, 'mfu': 0.49152}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from monitor_client._timings import split


@dataclass
class Probes:
    """Where a step's memory, GPU and MFU figures come from (shared by all steps)."""

    memory: Any = None           # MemoryProbe
    gpu: Any = None              # GpuProbe
    flops_per_token: float | None = None
    peak_flops: float | None = None
    world_size: int = 1
    gate: Any = None             # NormGate: which steps keep their per-parameter norms
    on_host: Any = None          # callable(record) after the host copy (pre-flight checks)


@dataclass
class PendingStep:
    """A step record to finish in the sender thread; see the module docstring."""

    record: dict[str, Any]
    pack: Any = None             # StatsPack: device tensors and their layout
    probes: Probes = field(default_factory=Probes)
    wait: Any = None             # DeviceWait: the all-reduce wait's CUDA events (_timings.py)

    def materialize(self) -> dict[str, Any]:
        record = self.record
        host = self.pack.host() if self.pack is not None else None  # the one copy
        if host is not None:
            decoded = self.pack.decode(host)
            for key, value in decoded.items():
                if record.get(key) is None:
                    record[key] = value
        if self.wait is not None:  # after the pack's copy: its events are done by now
            split(record, *self.wait.read())
        self._gate(record)
        drop_finite_report(record)
        if self.probes.on_host is not None:
            self.probes.on_host(record)
        self._derive(record)
        self._read_probes(record)
        return record

    def _gate(self, record: dict[str, Any]) -> None:
        # Monitored steps carry them in ``layers``; elsewhere only when they matter.
        norms = record.pop("grad_norms", None)
        gate = self.probes.gate
        keep = gate.keep(record.get("grad_norm")) if gate is not None else False
        if norms and keep and "layers" not in record:
            record["grad_norms"] = norms

    def _derive(self, record: dict[str, Any]) -> None:
        tokens, step_time = record.get("tokens"), record.get("step_time")
        if tokens is not None and step_time and record.get("tokens_per_second") is None:
            record["tokens_per_second"] = tokens / step_time
        tps, fpt, peak = record.get("tokens_per_second"), self.probes.flops_per_token, \
            self.probes.peak_flops
        if tps is not None and fpt and peak and record.get("mfu") is None:
            record["mfu"] = tps * fpt / peak

    def _read_probes(self, record: dict[str, Any]) -> None:
        if self.probes.memory is not None and "memory" not in record:
            record["memory"] = self.probes.memory.read()
        if self.probes.gpu is not None and "gpu" not in record:
            gpu = self.probes.gpu.read()
            if gpu:
                record["gpu"] = gpu


def drop_finite_report(record: dict[str, Any]) -> dict[str, Any]:
    """Drop an all-finite module report (``_finite.decode``'s count 0) from a step whose
    loss is finite too: there it says nothing, and healthy steps stay as small as before.

    >>> drop_finite_report({"loss": 2.5, "nonfinite_module_count": 0,
    ...                     "nonfinite_check": "sampled"})
    {'loss': 2.5}
    >>> drop_finite_report({"loss": float("nan"), "nonfinite_module_count": 0})
    {'loss': nan, 'nonfinite_module_count': 0}
    """
    loss = record.get("loss")
    finite_loss = isinstance(loss, int | float) and math.isfinite(loss)
    if record.get("nonfinite_module_count") == 0 and (finite_loss or loss is None):
        del record["nonfinite_module_count"]
        record.pop("nonfinite_check", None)
    return record
