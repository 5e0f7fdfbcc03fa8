"""FLOPs per token of a model and the peak FLOP/s of a device, for MFU.

MFU = tokens/s x FLOPs per token / (peak FLOP/s of one device). FLOPs per token default to
the usual dense-transformer estimate 6N + 12 L d T (N trainable parameters; L layers, d
model width, T sequence length when the model's config tells them; PaLM appendix B), or
whatever the user passes. Peak figures are the vendors' dense (no sparsity) numbers per
device and compute dtype; pass ``peak_flops=`` (or set ``MONITOR_AGENT_PEAK_FLOPS``) for
anything not listed or to use a measured figure.

A device from the table, one that is not in it, and a two-layer model's FLOPs per token
(its width and depth read from its config, as from a transformers model's)::

    >>> peak_flops_for("NVIDIA H100 80GB HBM3", "torch.bfloat16")
    989000000000000.0
    >>> peak_flops_for("NVIDIA H100 PCIe", "fp32"), peak_flops_for("Some Future GPU")
    (51000000000000.0, None)
    >>> import torch
    >>> from types import SimpleNamespace
    >>> model = torch.nn.Linear(10, 10)               # N = 110 parameters
    >>> flops_per_token(model)                        # 6 N
    660.0
    >>> model.config = SimpleNamespace(n_layer=2, n_embd=10)
    >>> flops_per_token(model, seq_len=1024)          # 6 N + 12 L d T
    246420.0
"""

from __future__ import annotations

import re
from typing import Any

T = 1e12
# Ordered: the first pattern that matches the device name wins (A100 before A10, L40S
# before L4, H100 PCIe/NVL before plain H100, which is the SXM part).
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    (r"H200", {"bf16": 989 * T, "fp16": 989 * T, "tf32": 495 * T, "fp32": 67 * T}),
    (r"H100.*PCIE", {"bf16": 756 * T, "fp16": 756 * T, "tf32": 378 * T, "fp32": 51 * T}),
    (r"H100.*NVL", {"bf16": 835 * T, "fp16": 835 * T, "tf32": 418 * T, "fp32": 60 * T}),
    (r"H100|GH200", {"bf16": 989 * T, "fp16": 989 * T, "tf32": 495 * T, "fp32": 67 * T}),
    (r"B200", {"bf16": 2250 * T, "fp16": 2250 * T, "tf32": 1100 * T, "fp32": 80 * T}),
    (r"A100", {"bf16": 312 * T, "fp16": 312 * T, "tf32": 156 * T, "fp32": 19.5 * T}),
    (r"A10G|A10\b", {"bf16": 125 * T, "fp16": 125 * T, "tf32": 62.5 * T, "fp32": 31.2 * T}),
    (r"L40S", {"bf16": 362 * T, "fp16": 362 * T, "tf32": 183 * T, "fp32": 91.6 * T}),
    (r"L4\b", {"bf16": 121 * T, "fp16": 121 * T, "tf32": 60 * T, "fp32": 30.3 * T}),
    (r"A6000", {"bf16": 155 * T, "fp16": 155 * T, "tf32": 77 * T, "fp32": 38.7 * T}),
    (r"V100", {"fp16": 125 * T, "fp32": 15.7 * T}),
    (r"T4\b", {"fp16": 65 * T, "fp32": 8.1 * T}),
    (r"MI300X", {"bf16": 1307 * T, "fp16": 1307 * T, "tf32": 654 * T, "fp32": 163 * T}),
]

_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
                  "float": "fp32", "tf32": "tf32"}


def normalize_dtype(dtype: Any) -> str:
    """'torch.bfloat16', 'bfloat16', 'bf16' -> 'bf16'."""
    name = str(dtype).removeprefix("torch.").lower()
    return _DTYPE_ALIASES.get(name, name)


def peak_flops_for(device_name: str | None, dtype: Any = "bf16") -> float | None:
    """Dense peak FLOP/s of one device in ``dtype``, or None when the device is unknown."""
    if not device_name:
        return None
    key = normalize_dtype(dtype)
    for pattern, table in PEAK_FLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return table.get(key) or table.get("fp16")
    return None


def _config_value(model: Any, *names: str) -> int | None:
    holders = [getattr(model, "config", None), model]
    for holder in holders:
        for name in names:
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int) and value > 0:
                return value
    return None


def model_shape(model: Any) -> dict[str, int]:
    """Layers and width when the model (or its HF config) states them."""
    shape = {}
    layers = _config_value(model, "n_layer", "num_hidden_layers", "n_layers", "num_layers")
    width = _config_value(model, "n_embd", "hidden_size", "d_model")
    if layers:
        shape["n_layers"] = layers
    if width:
        shape["d_model"] = width
    return shape


def flops_per_token(model: Any, seq_len: int | None = None) -> float:
    """6N + 12 L d T (the attention term only when L, d and T are known)."""
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    shape = model_shape(model)
    attention = 0
    if seq_len and "n_layers" in shape and "d_model" in shape:
        attention = 12 * shape["n_layers"] * shape["d_model"] * seq_len
    return float(6 * n_params + attention)
