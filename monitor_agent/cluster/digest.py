"""A record's digest: what the run's leader needs of it, without the per-layer payload.

The leader judges across ranks (which rank went NaN first, where a hung job is stuck, the
rank whose loss left its peers, the straggler and its cause), keeps the run's checkpoint
ledger, verdict and actions, and draws the run's charts: scalars per rank and step. The
per-layer tables, histograms, activations and the script's own scalars stay on the node
sidecar, whose detectors judge them and forward only their findings. So a step's digest is
the step record less ``layers``, ``grad_hist``, ``param_hist``, ``activations`` and
``metrics`` (a few hundred bytes: ``bench/leader_load.py`` measures it); of ``gpu`` it keeps
the throttle reasons (the straggler's cause across nodes, detectors/straggler.py; the rest
is judged by the node's own ``gpu_health``), and it keeps ``grad_norms`` only on a step
whose gradient norm is not finite (where the client sends them: the NaN page names the
first parameter from them). Every other kind (run, eval,
end, checkpoint, hang) is small or rare and goes as it is.

The digest is the record's own JSON with keys taken out, so the leader validates and
stores it as any record, and a new scalar field travels without a change here.

    >>> step = {"kind": "step", "run_id": "r", "step": 7, "time": 1.0, "loss": 2.5,
    ...         "layers": {"w": {"grad_norm": 0.1}}, "metrics": {"acc": 0.9}}
    >>> wire.loads(digest("step", wire.dumps(step)))
    {'kind': 'step', 'run_id': 'r', 'step': 7, 'time': 1.0, 'loss': 2.5}
"""

from __future__ import annotations

import math
from typing import Any

from monitor_agent.detectors.straggler import THROTTLE_BITS
from monitor_agent.records import wire

HEAVY_STEP_FIELDS = ("layers", "grad_hist", "param_hist", "activations", "metrics")
"""What stays on the node sidecar (its detectors judge it there)."""
GPU_KEPT = tuple(key for key, _, _ in THROTTLE_BITS)
"""The part of a step's ``gpu`` object the leader judges (the straggler's throttle cause)."""


def digest(kind: str, body: bytes) -> bytes:
    """The digest of a stored record (``body``: its JSON as stored)."""
    if kind != "step":
        return body
    obj: dict[str, Any] = wire.loads(body)
    heavy = [k for k in HEAVY_STEP_FIELDS if k in obj]
    keep_norms = "grad_norms" in obj and _nonfinite(obj.get("grad_norm"))
    if not heavy and "gpu" not in obj and ("grad_norms" not in obj or keep_norms):
        return body
    for k in heavy:
        del obj[k]
    if not keep_norms:
        obj.pop("grad_norms", None)
    gpu = obj.pop("gpu", None)
    if isinstance(gpu, dict) and (kept := {k: gpu[k] for k in GPU_KEPT if k in gpu}):
        obj["gpu"] = kept
    return wire.dumps(obj)


def _nonfinite(value: Any) -> bool:
    if isinstance(value, str):  # the wire's "NaN" / "Infinity"
        return True
    return isinstance(value, float) and not math.isfinite(value)
