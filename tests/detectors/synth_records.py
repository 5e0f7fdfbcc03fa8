"""Synthetic records for detector unit tests, and the checks every detector test shares.

Example::

    suite = only("loss_spike")
    recs = [step(i, loss=2.0 + noise(i)) for i in range(1, 200)]
    findings = feed(suite, recs)
    assert_restore_equivalent(lambda: only("loss_spike"), recs, cut=120)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from monitor_agent.detectors import FINDING_TYPES, DetectorSettings, DetectorSuite
from monitor_agent.records import wire
from monitor_agent.records.types import (
    EvalRecord,
    Finding,
    LayerTable,
    Memory,
    Record,
    RunRecord,
    StepRecord,
)

T0 = 1_700_000_000.0
DT = 0.5


def only(ftype: str, **settings: Any) -> DetectorSuite:
    """A suite running just the detector of ``ftype``."""
    others = set(FINDING_TYPES) - {ftype}
    return DetectorSuite(DetectorSettings(disabled=others, **settings))


def run(layer_order: list[str] | None = None, **config: Any) -> RunRecord:
    model = {"layer_order": layer_order} if layer_order else {}
    return RunRecord(run_id="r", time=T0, config={"warmup_steps": 0, **config}, model=model)


def noise(i: int, scale: float = 0.02, seed: int = 0) -> float:
    """Deterministic pseudo-noise in [-scale, scale]."""
    return scale * math.sin(i * 12.9898 + seed * 78.233) * 0.999


def step(i: int, rank: int = 0, **fields: Any) -> StepRecord:
    base = dict(loss=2.0 + noise(i), grad_norm=1.0 + noise(i, 0.1), param_norm=10.0,
                update_norm=0.01, step_time=DT, tokens=1000.0, tokens_per_second=2000.0)
    base.update(fields)
    return StepRecord(run_id="r", step=i, time=T0 + i * DT, rank=rank, **base)


def eval_rec(i: int, val: float, train: float | None = None) -> EvalRecord:
    return EvalRecord(run_id="r", step=i, time=T0 + i * DT + 0.01, val_loss=val, train_loss=train)


def memory(used: float, total: float | None = 1000.0) -> Memory:
    return Memory(device="cuda:0", allocated_bytes=used, total_bytes=total)


def layers(names: list[str], grad: Iterable[float], param: Iterable[float] | None = None,
           update: Iterable[float] | None = None) -> LayerTable:
    g = list(grad)
    p = list(param) if param is not None else [1.0] * len(g)
    u = list(update) if update is not None else [0.01] * len(g)
    rows = {n: {"grad_norm": g[k], "param_norm": p[k], "update_norm": u[k]}
            for k, n in enumerate(names)}
    return LayerTable.from_mapping(rows)


def grad_table(names: list[str], grad: Iterable[float]) -> LayerTable:
    """Per-parameter grad norms only: what a gated (non-monitored) step carries."""
    return LayerTable.from_mapping({n: {"grad_norm": g} for n, g in zip(names, grad, strict=True)})


def names(n: int) -> list[str]:
    return [f"layers.{k}.weight" for k in range(n)]


def feed(suite: DetectorSuite, records: Iterable[Record]) -> list[Finding]:
    out: list[Finding] = []
    for rec in records:
        if rec.time is not None:
            out.extend(suite.tick(rec.time))
        out.extend(suite.update(rec))
    return out


def of_type(findings: list[Finding], ftype: str) -> list[Finding]:
    return [f for f in findings if f.type == ftype]


def assert_restore_equivalent(
    make: Callable[[], DetectorSuite], records: list[Record], cut: int,
    final_tick: float | None = None,
) -> None:
    """Snapshot mid-stream through the wire format; the restored suite must then raise
    exactly the findings the uninterrupted one raises, and there must be some: a cut
    after the last finding would compare nothing with nothing and prove nothing."""
    straight = make()
    feed(straight, records[:cut])
    expected = feed(straight, records[cut:])
    first = make()
    feed(first, records[:cut])
    blob = wire.dumps(first.snapshot())
    restored = make()
    restored.restore(wire.loads(blob))
    got = feed(restored, records[cut:])
    if final_tick is not None:
        expected += straight.tick(final_tick)
        got += restored.tick(final_tick)
    assert expected, (f"no finding after the cut at {cut} of {len(records)} records: "
                      "put the cut before something that fires (assert_restore_silent "
                      "for a test about silence)")
    assert [f.to_dict() for f in got] == [f.to_dict() for f in expected]
    for rank in (0, 1):
        assert restored.ema_loss(rank) == straight.ema_loss(rank)


def assert_restore_silent(
    make: Callable[[], DetectorSuite], records: list[Record], cut: int,
) -> None:
    """Snapshot after a finding fired; neither the uninterrupted suite nor the restored one
    may raise anything after the cut. Only worth asserting when something fired before the
    cut: the snapshot then carries the episode that keeps the restored suite quiet."""
    before = feed(make(), records[:cut])
    assert before, f"nothing fired before the cut at {cut}: the silence after it proves nothing"
    straight = make()
    feed(straight, records[:cut])
    assert feed(straight, records[cut:]) == [], "the uninterrupted suite fired after the cut"
    first = make()
    feed(first, records[:cut])
    restored = make()
    restored.restore(wire.loads(wire.dumps(first.snapshot())))
    got = feed(restored, records[cut:])
    assert got == [], f"the restored suite fired again: {[f.message for f in got]}"


def geometric(n: int, first: float, last: float) -> np.ndarray:
    return np.geomspace(first, last, n)
