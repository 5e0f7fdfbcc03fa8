"""The finding types of docs/format.md's catalogue and the severity each usually carries.

Example::

    assert "nan_inf" in FINDING_TYPES
    USUAL_SEVERITY["stalled"]  # Severity.ERROR
"""

from __future__ import annotations

from monitor_agent.types import Severity

USUAL_SEVERITY: dict[str, Severity] = {
    "nan_inf": Severity.CRITICAL,
    "loss_spike": Severity.WARNING,
    "divergence": Severity.ERROR,
    "grad_explosion": Severity.ERROR,
    "grad_vanishing": Severity.WARNING,
    "dead_layer": Severity.WARNING,
    "update_ratio_high": Severity.WARNING,
    "update_ratio_low": Severity.WARNING,
    "gain_drift": Severity.INFO,  # context for grad_explosion; see gain_drift.py
    "clip_saturation": Severity.WARNING,
    "plateau": Severity.WARNING,
    "overfitting": Severity.WARNING,
    "throughput_drop": Severity.WARNING,
    "memory_pressure": Severity.WARNING,
    "loss_scale_collapse": Severity.ERROR,
    "straggler": Severity.WARNING,
    "stalled": Severity.ERROR,
    # Beyond docs/format.md's catalogue: signals from per-category eval losses, distributions and
    # activations (issue 8).
    "category_divergence": Severity.WARNING,
    "dead_units": Severity.WARNING,
    "activation_blowup": Severity.ERROR,
    "grad_distribution": Severity.WARNING,
    # Issue 17: the optimizer's step per unit of gradient left its own band.
    "effective_lr_shift": Severity.WARNING,
}

FINDING_TYPES: tuple[str, ...] = tuple(USUAL_SEVERITY)
"""Every finding type: docs/format.md's catalogue in its order, then the ones added here."""

FORMAT_TYPES: tuple[str, ...] = FINDING_TYPES[:17]
"""docs/format.md's catalogue (the types the labelled traces in tests/traces/public use)."""
