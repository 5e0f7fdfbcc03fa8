"""A sidecar's id: drawn once, kept in its data directory, sent in every peer exchange.

It tells a node sidecar that the "leader" it reached is itself (a single-node job whose
launcher says ``MASTER_ADDR=localhost``), and a run leader which node sidecar is talking.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     first = sidecar_id(d)
    ...     first == sidecar_id(d), len(first)
    (True, 16)
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FILE = "sidecar_id"


def sidecar_id(data_dir: str | os.PathLike[str]) -> str:
    """This data directory's sidecar id (created on first use)."""
    path = Path(data_dir) / FILE
    try:
        found = path.read_text(encoding="ascii").strip()
        if found:
            return found
    except (OSError, UnicodeDecodeError):
        pass
    made = secrets.token_hex(8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(made + "\n", encoding="ascii")
    os.replace(tmp, path)
    return made
