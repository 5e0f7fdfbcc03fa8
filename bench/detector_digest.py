"""One digest of everything the detector suite says about a GPT-shaped run: compare it
across revisions when a detector's hot path changes and its findings must not.

The run is bench/ingest.py's payload (148 parameter tensors x 7 statistics, the scalars),
with per-step noise from a fixed seed and faults of known shape: single parameters flaring
400x and 300x, three at once 150x, a slow gradient climb on the first 30 parameters with a
diverging loss, an LR jump, a NaN gradient and loss, a parameter whose gradient goes dead.
Every step goes through ``DetectorSuite.update``; the digest covers each finding (type,
step, layer, message, severity), the first layers out of their band after every step
(``LayerBands.first_out``, ``count_out``) and the suite's whole snapshot every 100 steps.

    python -m bench.detector_digest            # the findings, then "digest <sha256>"
    git stash; python -m bench.detector_digest; git stash pop   # the same digest: unchanged
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random

from bench.ingest import LAYER_STATS, NAMES
from monitor_agent.detectors import DetectorSettings, DetectorSuite
from monitor_agent.records import schemas


def layer_rows(step: int, rng: random.Random) -> dict[str, dict[str, float]]:
    layers = {}
    for i, name in enumerate(NAMES):
        g = 0.001 * (i + 1) * math.exp(rng.gauss(0, 0.3))
        if 600 <= step < 612 and i == 5:
            g *= 400
        if 700 <= step < 702 and i == 9:
            g *= 300
        if 750 <= step < 760 and i in (20, 21, 22):
            g *= 150 + i
        if 900 <= step < 960 and i < 30:
            g *= 3 + (step - 900) * 0.5
        if step == 1200 and i == 7:
            g = math.nan
        if step % 97 == 0 and i == 3:
            g *= 6
        row = {s: g * (1 + j * 0.01) for j, s in enumerate(LAYER_STATS)}
        if i == 11:
            row["grad_zero_frac"] = 0.0 if step < 1300 else 1.0
        layers[name] = row
    return layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    suite = DetectorSuite(DetectorSettings())
    digest = hashlib.sha256()
    suite.update(schemas.parse_record({"kind": "run", "run_id": "digest", "time": 1.0,
                                       "step": 0, "layer_order": NAMES,
                                       "config": {"warmup_steps": 20}}))
    loss = 3.0
    for step in range(1, args.steps):
        layers = layer_rows(step, rng)
        grad_norm = math.sqrt(sum(r["grad_norm"] ** 2 for r in layers.values()
                                  if math.isfinite(r["grad_norm"])))
        loss = loss * (0.999 if step < 900 else 1.02) + rng.gauss(0, 0.01)
        record = {"kind": "step", "run_id": "digest", "step": step, "time": 1000.0 + step,
                  "layers": layers, "loss": loss if step != 1200 else "NaN",
                  "lr": 1e-4 * (1 if step < 1100 else 10), "grad_norm": grad_norm,
                  "step_time": 0.1 + rng.random() * 0.01, "data_time": 0.01,
                  "tokens": 1000.0, "param_norm": 10.0, "update_norm": 1e-3}
        for f in suite.update(schemas.parse_record(record)):
            line = json.dumps([f.type, f.step, f.layer, f.message, f.severity.label])
            digest.update(line.encode())
            print(line)
        bands = suite.ctx.rank(0).bands
        digest.update(repr((bands.first_out(suite.ctx, step), bands.count_out(step))).encode())
        if step % 100 == 0:
            digest.update(json.dumps(suite.snapshot(), default=str, sort_keys=True).encode())
    print("digest", digest.hexdigest())


if __name__ == "__main__":
    main()
