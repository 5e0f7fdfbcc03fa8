"""The class recordings (``tests/traces/classes``, ``scripts/traces/classes_runs.py``): real CPU runs
of a burst of bad batches that returns (a spike), an LR raised and kept (a divergence) and
an AdamW LR jump (isolated gradient spikes), on an MLP, a CNN and a small GPT, 3 seeds.

Example::

    for label, path in recordings("burst"):
        findings = replay_trace(path)
"""

from __future__ import annotations

import json
from pathlib import Path

CLASSES = Path(__file__).resolve().parents[1] / "traces" / "classes"


def recordings(shape: str) -> list[tuple[dict, Path]]:
    """(label, path) of every recording of ``shape`` (burst, kept, jump)."""
    labels = json.loads((CLASSES / "labels.json").read_text())
    return [(lab, CLASSES / lab["file"]) for lab in labels if lab["shape"] == shape]


def expected(label: dict, ftype: str) -> dict | None:
    return next((e for e in label["expected"] if e["type"] == ftype), None)
