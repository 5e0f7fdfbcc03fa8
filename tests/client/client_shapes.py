"""Helpers shared by the adapter tests (a plain module: pytest puts this folder on sys.path)."""


def step_shape(records: list[dict]) -> tuple[frozenset, frozenset, frozenset]:
    """What a run's step records carry: fields of a monitored step (the first), fields of
    an ordinary step (the second), and the per-layer fields of a parameter with a grad."""
    steps = sorted((r for r in records if r["kind"] == "step"), key=lambda r: r["step"])
    first, second = steps[0], steps[1]
    layer = next(v for v in first["layers"].values() if "grad_norm" in v)
    return (frozenset(k for k, v in first.items() if v is not None),
            frozenset(k for k, v in second.items() if v is not None), frozenset(layer))
