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

Layers and modules are named as the user's model names them, inside the wrappers that
rename them: (Distributed)DataParallel and ``torch.compile`` around the model (``module.``,
``_orig_mod.`` before every name), and ``torch.compile``, activation checkpointing's
``checkpoint_wrapper`` and FSDP around a block (``_orig_mod``, ``_checkpoint_wrapped_module``,
``_fsdp_wrapped_module`` inside its names)::

    >>> wrapped = torch.nn.DataParallel(torch.nn.Sequential(model))
    >>> [name for name, _ in user_parameters(wrapped)]
    ['0.weight', '0.bias']
    >>> user_name("layers.0._checkpoint_wrapped_module.attn._orig_mod.wq.weight")
    'layers.0.attn.wq.weight'
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


# The name segments that wrappers of a block insert into every name below it.
WRAPPER_SEGMENTS = frozenset({"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"})


def user_name(name: str) -> str:
    """``name`` without the segments wrappers insert (``WRAPPER_SEGMENTS``)."""
    if "_orig_mod" not in name and "_wrapped_module" not in name:
        return name
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


def user_parameters(model: Any) -> list[tuple[str, Any]]:
    """``model.named_parameters()`` named as the user's model names them."""
    return [(user_name(name), p) for name, p in unwrapped(model).named_parameters()]


def user_modules(model: Any) -> list[tuple[str, Any]]:
    """``model.named_modules()`` named as the user's model names them; a wrapper and the
    block it wraps share a name, and the outer one (whose forward the model calls) keeps
    it."""
    seen: set[str] = set()
    found = []
    for name, module in unwrapped(model).named_modules():
        name = user_name(name)
        if name not in seen:
            seen.add(name)
            found.append((name, module))
    return found


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
