"""Which records may not wait behind a backlog: steps whose loss or grad norm is NaN/Inf.

While the sidecar is down, records pile up in the spool and are replayed oldest first once
it answers again; a page about a NaN loss would then wait for minutes of history (85 s was
seen while a sidecar flapped). The record itself must keep its place: the sidecar's
detectors only look forward, so a step that overtook its history would leave that history
unanalysed. So the sender posts a *preview* copy of an alarming step to
``/v1/records/preview`` (the sidecar pages from it and stores nothing) and delivers the
record in order as usual; its finding then joins the alert the preview began.

A loss-scaler overflow step is routine under mixed precision, not alarming: the step was
``skipped``, or its loss is finite while the grad norm is not under a ``loss_scale``. Only
a non-finite loss counts on such a step. This is the sidecar's rule (``amp_overflow`` in
monitor_agent/detectors/support/stats.py, which the ``nan_inf`` detector applies), said
again here in the record's own terms.

A step the client's step guard skipped (``skip_reason`` ``nonfinite_grad`` or
``grad_norm_outlier``) is not alarming either, whatever its loss: the weights never saw it,
and the sidecar pages only when the guard's skips exceed their budget.

A NaN loss is alarming; an AMP overflow is not, nor a step the guard skipped, nor anything
but a step::

    >>> is_alarming({"kind": "step", "loss": float("nan")})
    True
    >>> is_alarming({"kind": "step", "loss": 2.0, "grad_norm": float("inf"),
    ...              "loss_scale": 65536.0})
    False
    >>> is_alarming({"kind": "step", "loss": float("nan"), "skipped": True,
    ...              "skip_reason": "nonfinite_grad"})
    False
    >>> is_alarming({"kind": "eval", "val_loss": float("nan")})
    False
"""

from __future__ import annotations

import math
from typing import Any

# The step guard's reasons (_guard.py): a step it skipped left the weights untouched.
GUARD_SKIP_REASONS = ("nonfinite_grad", "grad_norm_outlier")


def is_alarming(record: Any) -> bool:
    """A step whose loss or grad norm is NaN/Inf, other than a loss-scaler overflow."""
    if not isinstance(record, dict) or record.get("kind") != "step":
        return False
    if record.get("skipped") is True and record.get("skip_reason") in GUARD_SKIP_REASONS:
        return False
    loss, grad_norm = record.get("loss"), record.get("grad_norm")
    if _amp_overflow(record, loss, grad_norm):
        return _nonfinite(loss)
    return _nonfinite(loss) or _nonfinite(grad_norm)


def _amp_overflow(record: dict, loss: Any, grad_norm: Any) -> bool:
    if record.get("skipped") is True:
        return True
    return record.get("loss_scale") is not None and _finite(loss) and not _finite(grad_norm)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _nonfinite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)
