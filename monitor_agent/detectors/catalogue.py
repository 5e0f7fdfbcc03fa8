"""The finding types of FORMAT.md's catalogue and the severity each usually carries.

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
    "gain_drift": Severity.WARNING,
    "clip_saturation": Severity.WARNING,
    "plateau": Severity.WARNING,
    "overfitting": Severity.WARNING,
    "throughput_drop": Severity.WARNING,
    "memory_pressure": Severity.WARNING,
    "loss_scale_collapse": Severity.ERROR,
    "straggler": Severity.WARNING,
    "stalled": Severity.ERROR,
}

FINDING_TYPES: tuple[str, ...] = tuple(USUAL_SEVERITY)
"""Every finding type, in FORMAT.md's order."""
