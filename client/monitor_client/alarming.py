"""Which records may not wait behind a backlog: steps whose loss or grad norm is NaN/Inf.

While the sidecar is down, records pile up in the spool and are replayed oldest first once
it answers again; a page about a NaN loss would then wait for minutes of history (85 s was
seen while a sidecar flapped). The sender holds alarming records apart and sends them
first; the older records they overtake are still stored (the sidecar counts them late).

Example::

    assert is_alarming({"kind": "step", "loss": float("nan")})
    assert not is_alarming({"kind": "eval", "val_loss": float("nan")})
"""

from __future__ import annotations

import math
from typing import Any


def is_alarming(record: Any) -> bool:
    """A step whose loss or grad norm is NaN/Inf: the record a page is waiting for."""
    if not isinstance(record, dict) or record.get("kind") != "step":
        return False
    return any(isinstance(v, float) and not math.isfinite(v)
               for v in (record.get("loss"), record.get("grad_norm")))
