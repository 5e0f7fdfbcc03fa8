"""Detection scorecard: our detectors against the recipes the field uses today, on the
labelled public traces, plus the detectors' cost per step record.

Every method runs through the same harness and is scored the same way:

* recall: expected findings (labels.json) caught inside their window. A recipe raises a
  typeless alarm, credited to any expected ``loss_spike``/``divergence``/``grad_explosion``/
  ``nan_inf`` window it lands in (the faults such recipes exist for); it cannot see stalls,
  dead layers, memory or throughput, and that is part of the comparison.
* false positives: alarm episodes (the same type within 100 steps counts once, as our own
  repeat limit does) that no expected window explains and whose type the trace does not
  allow; a recipe's alarm counts as ``loss_spike`` for ``allowed``. Healthy pages count too.
* lead time: on traces that go NaN, steps from the first divergence/grad_explosion finding
  (a recipe: its first alarm) at or after the fault to the first non-finite loss.

Then precision per detector (``precision.py``): false pages and false warnings per 10,000
healthy steps, healthy runs paged, recall and delay, on the public set and on each half of
the corpus (``tests/traces/corpus``: ``tune`` is what thresholds were checked on,
``heldout`` is reported only).

Then the classes (``precision.class_scores``): spike vs divergence vs explosion on the
class recordings (``tests/traces/classes``, ``scripts/traces/classes_runs.py``): per class, precision
(caught over caught + raised where the label neither expects nor allows it), recall and
delay, on the ``tune`` seed and the held-out seeds.

Then the shapes (``tests/traces/shapes``, ``scripts/traces/shapes_runs.py``: actor-critic, DQN, InfoNCE,
diffusion, AMP, MoE, ... healthy and faulty), per half (seed 1 ``tune``, seeds 2-3
``heldout``): the precision table above (healthy runs paged and by what, false warnings per
10k healthy steps, recall per type, faulty runs fully caught) and the class table.

Run: ``python -m bench.detection [--traces DIR] [--corpus DIR] [--classes DIR]
[--shapes DIR] [--no-cost] [--precision-only] [--details]`` (``--details`` lists every false alarm and miss).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.precision import (
    class_scores,
    load_set,
    precision,
    print_class_scores,
    print_precision,
    replayed,
)
from monitor_agent.detectors import DetectorSuite
from monitor_agent.records import schemas, wire
from monitor_agent.records.types import LayerTable, QuantileTable, Record, StepRecord

TRACES = Path(__file__).resolve().parents[1] / "tests" / "traces" / "public"
CORPUS = TRACES.parent / "corpus"
CLASSES = TRACES.parent / "classes"
SHAPES = TRACES.parent / "shapes"
RECIPE_TYPES = {"loss_spike", "divergence", "grad_explosion", "nan_inf"}
LEAD_TYPES = {"divergence", "grad_explosion"}
EPISODE_STEPS = 100


@dataclass
class Alarm:
    step: int
    type: str | None  # None: a recipe's typeless alarm
    pages: bool = False


@dataclass
class Score:
    expected: int = 0
    caught: int = 0
    false_positives: int = 0
    leads: list[int] = field(default_factory=list)

    def add(self, other: Score) -> None:
        self.expected += other.expected
        self.caught += other.caught
        self.false_positives += other.false_positives
        self.leads += other.leads


# -- methods ------------------------------------------------------------------------------


def ours(records: list[Record]) -> list[Alarm]:
    return [Alarm(f.step, f.type, f.severity.pages) for f in replayed(records)]


def _losses(records: list[Record]) -> Iterable[StepRecord]:
    return (r for r in records if isinstance(r, StepRecord) and r.rank == 0)


def recipe_ema_10x(records: list[Record]) -> list[Alarm]:
    """loss > 10x its moving average (EMA 0.99 of the losses before it)."""
    out, ema = [], None
    for r in _losses(records):
        if r.loss is None:
            continue
        if ema is not None and r.loss > 10 * ema:
            out.append(Alarm(r.step, None))
        ema = r.loss if ema is None else 0.99 * ema + 0.01 * r.loss
    return out


def _window_recipe(n: int, fires: Callable[[float, np.ndarray], bool]) -> Callable:
    def run(records: list[Record]) -> list[Alarm]:
        out, hist = [], deque(maxlen=n)
        for r in _losses(records):
            if r.loss is None:
                continue
            if len(hist) == n and fires(r.loss, np.array(hist)):
                out.append(Alarm(r.step, None))
            hist.append(r.loss)
        return out

    return run


recipe_z2 = _window_recipe(100, lambda x, h: x > h.mean() + 2 * h.std())
recipe_z2.__doc__ = "z-score > 2 against the mean/std of the last 100 losses."
recipe_2x_mean10 = _window_recipe(10, lambda x, h: x > 2 * h.mean())
recipe_2x_mean10.__doc__ = "loss > 2x the mean of the last 10."


def recipe_olmo(records: list[Record]) -> list[Alarm]:
    """OLMo-core: loss or grad norm > mean + 6 sigma of the last 128 values."""
    out, hl, hg = [], deque(maxlen=128), deque(maxlen=128)
    for r in _losses(records):
        hit = False
        for x, h in ((r.loss, hl), (r.grad_norm, hg)):
            if x is None:
                continue
            a = np.array(h)
            hit |= len(h) == h.maxlen and x > a.mean() + 6 * a.std()
            h.append(x)
        if hit:
            out.append(Alarm(r.step, None))
    return out


def recipe_foundry(records: list[Record]) -> list[Alarm]:
    """LLM Foundry: loss >= 2x its running average for more than 4 consecutive steps."""
    out, total, n, streak = [], 0.0, 0, 0
    for r in _losses(records):
        if r.loss is None:
            continue
        streak = streak + 1 if n and r.loss >= 2 * (total / n) else 0
        if streak > 4:
            out.append(Alarm(r.step, None))
        total, n = total + r.loss, n + 1
    return out


METHODS: dict[str, Callable[[list[Record]], list[Alarm]]] = {
    "ours": ours,
    "loss>10x avg": recipe_ema_10x,
    "z>2 last100": recipe_z2,
    "loss>2x mean10": recipe_2x_mean10,
    "OLMo 6 sigma": recipe_olmo,
    "Foundry 2x>4": recipe_foundry,
}


# -- scoring ------------------------------------------------------------------------------


def first_nan(records: list[Record]) -> int | None:
    for r in _losses(records):
        if r.loss is not None and not math.isfinite(r.loss):
            return r.step
    return None


def score(label: dict, records: list[Record], alarms: list[Alarm]) -> Score:
    s = Score(expected=len(label["expected"]))
    windows = [(e["type"], e["first_step"], e["last_step"]) for e in label["expected"]]

    def matches(a: Alarm, t: str) -> bool:
        return a.type == t if a.type is not None else t in RECIPE_TYPES

    for t, lo, hi in windows:
        s.caught += any(matches(a, t) and lo <= a.step <= hi for a in alarms)
    # Once an expected condition has begun, later reports of it are that condition
    # persisting; before its window they are false alarms.
    def explains(a: Alarm, t: str, lo: int, hi: int) -> bool:
        return matches(a, t) and a.step >= lo

    last_fp: dict[str, int] = {}
    for a in sorted(alarms, key=lambda a: a.step):
        kind = a.type or "loss_spike"
        unexplained = not any(explains(a, *w) for w in windows) and kind not in label["allowed"]
        if label["healthy"] and a.pages:
            unexplained = True
        if unexplained and a.step - last_fp.get(kind, -10**9) >= EPISODE_STEPS:
            s.false_positives += 1
            last_fp[kind] = a.step
    s.leads += _lead(label, records, alarms)
    return s


def _lead(label: dict, records: list[Record], alarms: list[Alarm]) -> list[int]:
    nan = first_nan(records)
    if nan is None or label["fault_step"] is None:
        return []
    early = [a.step for a in alarms if (a.type is None or a.type in LEAD_TYPES)
             and label["fault_step"] <= a.step <= nan]
    return [nan - min(early)] if early else [0]


# -- cost ---------------------------------------------------------------------------------


def synthetic_steps(n_layers: int, n_steps: int) -> tuple[list[Record], list[StepRecord]]:
    rng = np.random.default_rng(0)
    names = [f"blocks.{k // 6}.p{k % 6}.weight" for k in range(n_layers)]
    run = schemas.parse_record({"kind": "run", "run_id": "b", "config": {"warmup_steps": 10},
                                "model": {"layer_order": names}})
    steps = []
    for i in range(1, n_steps + 1):
        g = rng.lognormal(0, 0.3, n_layers)
        rows = {n: {"grad_norm": g[k], "param_norm": 10.0, "update_norm": 0.01,
                    "grad_zero_frac": 0.0} for k, n in enumerate(names)}
        steps.append(StepRecord(run_id="b", step=i, time=i * 0.1, loss=2 + rng.normal(0, 0.02),
                                grad_norm=float(np.linalg.norm(g)), param_norm=100.0,
                                update_norm=0.1, step_time=0.1, tokens_per_second=1e4,
                                clip_threshold=1.0, layers=LayerTable.from_mapping(rows)))
    return [run], steps


def cost(n_layers: int, n_steps: int = 400) -> tuple[float, dict[str, float]]:
    """Mean microseconds per step record: whole suite, and per detector."""
    head, steps = synthetic_steps(n_layers, n_steps)
    suite = DetectorSuite()
    for rec in head + steps[:100]:  # warm: baselines filled
        suite.update(rec)
    per: dict[str, float] = {d.type: 0.0 for d in suite.detectors}
    t_all = time.perf_counter()
    for rec in steps[100:]:
        suite.ctx.observe(rec)
        for det in suite.detectors:
            t0 = time.perf_counter()
            det.update(rec)
            per[det.type] += time.perf_counter() - t0
        suite.ctx.after(rec)
    total = time.perf_counter() - t_all
    n = len(steps) - 100
    return total / n * 1e6, {k: v / n * 1e6 for k, v in per.items()}


def hist_cost(n_layers: int, n_readings: int = 200) -> float:
    """Mean microseconds of grad_distribution per record carrying grad_hist quantiles
    (those arrive every hist_every steps; records without them cost it nothing)."""
    rng = np.random.default_rng(0)
    names = tuple(f"blocks.{k // 6}.p{k % 6}.weight" for k in range(n_layers))
    z = np.array([-3.2, -2.33, -0.674, 0.0, 0.674, 1.645, 2.33, 3.2])  # normal quantiles
    suite = DetectorSuite()
    det = next(d for d in suite.detectors if d.type == "grad_distribution")
    recs = []
    for i in range(1, n_readings + 1):
        scale = rng.lognormal(-4, 0.3, (n_layers, 1))
        q = scale * (z + rng.normal(0, 0.05, (n_layers, 8)))
        recs.append(StepRecord(run_id="b", step=100 + 50 * i, time=i * 5.0, loss=2.0,
                               grad_quantiles=QuantileTable(names, np.sort(q, axis=1))))
    for rec in recs[:50]:  # warm: every parameter has its readings
        det.update(rec)
    t0 = time.perf_counter()
    for rec in recs[50:]:
        det.update(rec)
    return (time.perf_counter() - t0) / (len(recs) - 50) * 1e6


def activation_cost(n_modules: int, n_readings: int = 200) -> float:
    """Mean microseconds of dead_units + activation_blowup per record carrying activation
    statistics (those arrive every activation_every steps)."""
    rng = np.random.default_rng(0)
    suite = DetectorSuite()
    dets = [d for d in suite.detectors if d.type in ("dead_units", "activation_blowup")]
    recs = []
    for i in range(1, n_readings + 1):
        acts = {f"blocks.{k}.act": {"mean": 0.1, "std": float(rng.lognormal(0, 0.1)),
                                    "max_abs": float(rng.lognormal(1, 0.1)),
                                    "zero_frac": 0.5, "dead_frac": 0.02, "nonfinite": 0}
                for k in range(n_modules)}
        recs.append(schemas.parse_record({"kind": "step", "run_id": "b", "step": 25 * i,
                                          "time": i * 2.5, "loss": 2.0, "activations": acts}))
    for rec in recs[:50]:
        for det in dets:
            det.update(rec)
    t0 = time.perf_counter()
    for rec in recs[50:]:
        for det in dets:
            det.update(rec)
    return (time.perf_counter() - t0) / (len(recs) - 50) * 1e6


# -- report -------------------------------------------------------------------------------


def load(path: Path) -> list[Record]:
    return [schemas.parse_record(obj) for obj in wire.iter_trace(path)]


def scorecard(traces: Path) -> dict[str, Score]:
    labels = json.loads((traces / "labels.json").read_text())
    totals = {m: Score() for m in METHODS}
    cols = "".join(f"{m:>16}" for m in METHODS)
    print(f"{'trace':32}{cols}\n{'':32}" + "".join(f"{'rec fp lead':>16}" for _ in METHODS))
    for label in labels:
        records = load(traces / label["file"])
        cells = []
        for name, method in METHODS.items():
            s = score(label, records, method(records))
            totals[name].add(s)
            lead = str(s.leads[0]) if s.leads else "-"
            cells.append(f"{s.caught}/{s.expected} {s.false_positives:>2} {lead:>4}")
        print(f"{label['file'].split('.')[0]:32}" + "".join(f"{c:>16}" for c in cells))
    return totals


def print_totals(totals: dict[str, Score]) -> None:
    print(f"\n{'method':16}{'recall':>10}{'false pos':>11}{'mean lead':>11}{'leads':>16}")
    for name, s in totals.items():
        recall = s.caught / s.expected if s.expected else 0.0
        mean_lead = float(np.mean(s.leads)) if s.leads else 0.0
        print(f"{name:16}{recall:>10.1%}{s.false_positives:>11}{mean_lead:>11.2f}"
              f"{str(s.leads):>16}")


def print_cost() -> None:
    print("\ncost per step record (microseconds, CPU, this machine)")
    for n in (150, 1000):
        total, per = cost(n)
        top = sorted(per.items(), key=lambda kv: -kv[1])[:5]
        detail = ", ".join(f"{k} {v:.0f}" for k, v in top)
        print(f"  {n:>5} layers: suite {total:7.0f} us/record; slowest: {detail}")
    for n in (150, 1000):
        print(f"  {n:>5} layers: grad_distribution {hist_cost(n):7.0f} us per record with "
              f"grad_hist quantiles (every hist_every steps; 0 on the others)")
    for n in (12, 64):
        print(f"  {n:>5} modules: dead_units + activation_blowup {activation_cost(n):7.0f} us "
              f"per record with activations (every activation_every steps)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--classes", type=Path, default=CLASSES)
    ap.add_argument("--shapes", type=Path, default=SHAPES)
    ap.add_argument("--no-cost", action="store_true")
    ap.add_argument("--precision-only", action="store_true")
    ap.add_argument("--details", action="store_true", help="list every false alarm and miss")
    args = ap.parse_args()
    if not args.precision_only:
        print_totals(scorecard(args.traces))
    print_precision(f"precision, public ({args.traces.name})", precision(load_set(args.traces)),
                    args.details)
    if (args.corpus / "labels.json").exists():
        for half in ("tune", "heldout"):
            print_precision(f"precision, corpus {half} half",
                            precision(load_set(args.corpus, half)), args.details)
    if (args.classes / "labels.json").exists():
        for half in ("tune", "heldout"):
            print_class_scores(f"spike / divergence / explosion, class recordings {half} half",
                               class_scores(load_set(args.classes, half)), args.details)
    if (args.shapes / "labels.json").exists():
        for half in ("tune", "heldout"):
            traces = load_set(args.shapes, half)
            print_precision(f"precision, shapes {half} half", precision(traces), args.details)
            print_class_scores(f"spike / divergence / explosion, shapes {half} half",
                               class_scores(traces), args.details)
    if not args.no_cost:
        print_cost()


if __name__ == "__main__":
    main()
