"""The faults a node's own processes carry out, as files in the node's faults directory
(``$NETCLUSTER_FAULTS`` on the node): the harness writes them (``Faults``), the training
script (``train.json``) and the fake NVML (``gpu.json``) read them while they run.

``train.json``::

    {"loader_delay": 0.05,                                  # seconds added to every batch
     "nan": [{"id": "nan-1", "step": 40, "local_rank": null}],       # null: every rank
     "bitflip": [{"id": "flip-1", "step": 30, "bit": 25, "local_rank": 0}]}

A NaN or bit flip fires once per rank: the rank that reaches the step writes
``fired/<id>.r<local_rank>`` (step, attempt, time), and a rank restarted from an earlier
checkpoint does not fire it again (``"persist": true`` fires at every pass), so a
restart that resumes before the step is a cure, as after a transient fault.

``gpu.json`` (the node's GPUs, by NVML index = local rank)::

    {"xid": [{"gpu": 0, "code": 79, "time": 1716000000.0}],
     "ecc_uncorrected": {"0": 2}}

An XID is an event: a process sees those raised after it registered for events (its
``nvmlInit``), as the driver delivers them; an ECC count is a counter of the GPU and stays.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

TRAIN, GPU, FIRED = "train.json", "gpu.json", "fired"


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write(path: Path, doc: dict[str, Any]) -> None:
    """Whole or not at all: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


class FaultFiles:
    """One node's faults directory, as the harness writes it."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self._count = 0

    def update(self, name: str, change: Any) -> None:
        doc = _read(self.dir / name)
        change(doc)
        _write(self.dir / name, doc)

    def next_id(self, kind: str) -> str:
        self._count += 1
        return f"{kind}-{self._count}-{time.monotonic_ns()}"

    def fired(self) -> list[dict[str, Any]]:
        """What the node's ranks carried out: one dict per (injection, rank)."""
        d = self.dir / FIRED
        return [json.loads(p.read_text()) for p in sorted(d.glob("*"))] if d.is_dir() else []

    def clear(self) -> None:
        for name in (TRAIN, GPU):
            (self.dir / name).unlink(missing_ok=True)


class Injected:
    """What a rank reads: ``train.json`` reloaded when it changes (one ``stat`` a call)."""

    def __init__(self, directory: str | None, local_rank: int, attempt: int) -> None:
        self.dir = Path(directory) if directory else None
        self.local_rank, self.attempt = local_rank, attempt
        self._mtime = -1.0
        self._doc: dict[str, Any] = {}

    def spec(self) -> dict[str, Any]:
        if self.dir is None:
            return {}
        try:
            mtime = (self.dir / TRAIN).stat().st_mtime
        except FileNotFoundError:
            return {}
        if mtime != self._mtime:
            self._mtime, self._doc = mtime, _read(self.dir / TRAIN)
        return self._doc

    def loader_delay(self) -> float:
        return float(self.spec().get("loader_delay") or 0.0)

    def due(self, kind: str, step: int) -> dict[str, Any] | None:
        """The ``kind`` injection due at ``step`` on this rank (marked fired), or None."""
        for item in self.spec().get(kind, []):
            if item.get("step") != step:
                continue
            if item.get("local_rank") not in (None, self.local_rank):
                continue
            assert self.dir is not None
            marker = self.dir / FIRED / f"{item['id']}.r{self.local_rank}"
            if marker.exists() and not item.get("persist"):
                continue
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps({"id": item["id"], "kind": kind, "step": step,
                                          "local_rank": self.local_rank,
                                          "attempt": self.attempt, "time": time.time()}))
            return item
        return None
