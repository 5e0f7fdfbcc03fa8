"""The class recordings (``tests/traces/classes/``): spike vs divergence vs explosion.

Real CPU training runs through ``corpus_runs.run`` (the corpus's loop, monitor and models),
per-layer statistics every 20 steps to keep the files small. Three shapes, each on an MLP,
a CNN and a small GPT (character LM), several seeds:

* ``burst``: ``burst`` batches in a row (1 to 20) with random labels from ``fault_step``,
  then clean data again: a loss burst that returns to its level (the longer ones knock the
  model to chance and it re-learns by itself). Class: ``loss_spike``; never ``divergence``.
* ``kept``: every param group's LR x ``factor`` from ``fault_step`` on, kept (SGD/momentum
  runs): the loss level rises and stays. Class: ``divergence``.
* ``jump``: AdamW's LR x 30 from ``fault_step`` on, kept: the loss level rises and stays,
  and the gradient norm spikes now and then with collapsed norms between (Adam's
  normalised steps), rarely on consecutive steps. Classes: ``divergence`` and, where the
  recording shows repeated spikes, ``grad_explosion``.

Labels come from what each recording measurably did (``classes_labels.py``); the
``half`` (``tune`` / ``heldout``) is fixed by the run's seed before any tuning: seed 1
tunes, seeds 2 and 3 are held out.

    python -m scripts.traces.record_traces --classes [--only NAME ...] [--shard I/N]
"""

from __future__ import annotations

from scripts.traces.corpus_runs import Spec

S = Spec
FAULT = 200
STEPS = 360
LAYER_EVERY = 20

BASE = {  # arch: optimizer, lr, batch, clip of its healthy recipe (the corpus's)
    "mlp": ("adamw", 1e-3, 64, None),
    "cnn": ("adamw", 2e-3, 32, None),
    "gpt": ("adamw", 3e-3, 16, 1.0),
}
KEPT = {  # arch: SGD-family recipe and the LR factor that sends it off for good
    "mlp": ("sgd", 0.05, 64, None, 20.0),
    "cnn": ("sgdm", 0.01, 32, None, 30.0),
    "gpt": ("nesterov", 0.2, 16, 1.0, 15.0),
}
BURSTS = (1, 3, 5, 10, 20)
SEEDS = (1, 2, 3)


def _specs() -> list[Spec]:
    out = []
    for seed in SEEDS:
        for arch, (opt, lr, batch, clip) in BASE.items():
            for n in BURSTS:
                out.append(S(f"burst{n}_{arch}_s{seed}", arch, opt, lr, STEPS, batch=batch,
                             clip=clip, seed=seed, fault="bad_batch", fault_step=FAULT,
                             burst=n, layer_every=LAYER_EVERY))
            out.append(S(f"jump30_{arch}_s{seed}", arch, opt, lr, STEPS, batch=batch, clip=clip,
                         seed=seed, fault="lr_spike", fault_step=FAULT, factor=30.0,
                         layer_every=LAYER_EVERY))
        for arch, (opt, lr, batch, clip, factor) in KEPT.items():
            out.append(S(f"kept_{arch}_s{seed}", arch, opt, lr, STEPS, batch=batch, clip=clip,
                         seed=seed, fault="lr_spike", fault_step=FAULT, factor=factor,
                         layer_every=LAYER_EVERY))
    return out


SPECS = _specs()


def half_of(name: str) -> str:
    return "tune" if name.endswith("_s1") else "heldout"
