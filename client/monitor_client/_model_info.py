"""What the monitor learns from the model it watches: device, compute dtype, peak FLOP/s,
shape for the run record, and the process group for sharded parameters.

For the run record, and the peak FLOP/s with the dtype it is for (given here; else
``MONITOR_AGENT_PEAK_FLOPS``, else the table of ``_flops.py`` for the parameter's device)::

    >>> import torch
    >>> model = torch.nn.Linear(10, 10)
    >>> describe_model(model, ["weight", "bias"])
    {'name': 'Linear', 'n_params': 110, 'layer_order': ['weight', 'bias']}
    >>> resolve_peak_flops(model.weight, 312e12, "torch.bfloat16")
    (312000000000000.0, 'bf16')

Layers are named as the user's model names them, inside ``torch.compile``'s and
(Distributed)DataParallel's wrappers (which prefix every name with ``_orig_mod.`` or
``module.``)::

    >>> wrapped = torch.nn.DataParallel(torch.nn.Sequential(model))
    >>> [name for name, _ in unwrapped(wrapped).named_parameters()]
    ['0.weight', '0.bias']
"""

from __future__ import annotations

import os
from typing import Any

from monitor_client import _flops


def resolve_peak_flops(param: Any, peak_flops: float | None, compute_dtype: Any
                       ) -> tuple[float | None, str]:
    """Peak FLOP/s of one device (given, ``MONITOR_AGENT_PEAK_FLOPS``, or the table)."""
    dtype = _flops.normalize_dtype(compute_dtype or default_dtype(param))
    env = os.environ.get("MONITOR_AGENT_PEAK_FLOPS")
    peak = peak_flops or (float(env) if env else None) or _flops.peak_flops_for(
        device_name(param.device), dtype)
    return peak, dtype


def default_dtype(param: Any) -> str:
    import torch

    if param.dtype == torch.float32 and param.device.type == "cuda" and \
            torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return str(param.dtype)


def device_name(device: Any) -> str | None:
    if device.type != "cuda":
        return None
    import torch

    return torch.cuda.get_device_name(device)


def default_group() -> Any:
    import torch.distributed as dist

    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def describe_model(model: Any, names: list[str]) -> dict[str, Any]:
    model = unwrapped(model)
    n_params = sum(p.numel() for p in model.parameters())
    info = {"name": type(model).__name__, "n_params": n_params, "layer_order": names}
    info.update(_flops.model_shape(model))
    return info


def unwrapped(model: Any) -> Any:
    """The user's model inside ``torch.compile``'s ``OptimizedModule`` and
    (Distributed)DataParallel: the same parameters and modules, for naming them. Hooks that
    time the whole forward stay on the model the loop calls (inside a compiled region a
    host clock would break the graph)."""
    import torch

    parallel = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    while True:
        inner = getattr(model, "_orig_mod", None)  # torch.compile
        if inner is None and isinstance(model, parallel):
            inner = model.module
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner
