"""The detector registry: every detector class in docs/format.md's order, and the finding
types and usual severities read from them.

A detector declares its type, severity, knobs and suggestions in its own file; listing its
class here is what makes the suite run it and the rules/format validation know its type;
``DetectorSettings`` (detector_settings.py) lists its settings model and typed view, and a
test fails until it does. The order is the catalogue's: docs/format.md's 17 types first,
then the ones added since (it is also the order findings of one record come out in).

Example::

    assert "nan_inf" in FINDING_TYPES
    USUAL_SEVERITY["stalled"]  # Severity.ERROR
"""

from __future__ import annotations

from typing import Any

from monitor_agent.detectors.activation_blowup import ActivationBlowupDetector
from monitor_agent.detectors.category_divergence import CategoryDivergenceDetector
from monitor_agent.detectors.clip_saturation import ClipSaturationDetector
from monitor_agent.detectors.dead_layer import DeadLayerDetector
from monitor_agent.detectors.dead_units import DeadUnitsDetector
from monitor_agent.detectors.divergence import DivergenceDetector
from monitor_agent.detectors.effective_lr import EffectiveLrDetector
from monitor_agent.detectors.gain_drift import GainDriftDetector
from monitor_agent.detectors.grad_distribution import GradDistributionDetector
from monitor_agent.detectors.grad_explosion import GradExplosionDetector
from monitor_agent.detectors.grad_vanishing import GradVanishingDetector
from monitor_agent.detectors.loss_scale_collapse import LossScaleCollapseDetector
from monitor_agent.detectors.loss_spike import LossSpikeDetector
from monitor_agent.detectors.memory_pressure import MemoryPressureDetector
from monitor_agent.detectors.nan_inf import NanInfDetector
from monitor_agent.detectors.overfitting import OverfittingDetector
from monitor_agent.detectors.plateau import PlateauDetector
from monitor_agent.detectors.stalled import StalledDetector
from monitor_agent.detectors.straggler import StragglerDetector
from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.throughput_drop import ThroughputDropDetector
from monitor_agent.detectors.update_ratio import UpdateRatioHighDetector, UpdateRatioLowDetector
from monitor_agent.records.types import Severity

DETECTOR_CLASSES: tuple[type[DetectorBase[Any]], ...] = (
    # docs/format.md's catalogue
    NanInfDetector, LossSpikeDetector, DivergenceDetector, GradExplosionDetector,
    GradVanishingDetector, DeadLayerDetector, UpdateRatioHighDetector, UpdateRatioLowDetector,
    GainDriftDetector, ClipSaturationDetector, PlateauDetector, OverfittingDetector,
    ThroughputDropDetector, MemoryPressureDetector, LossScaleCollapseDetector,
    StragglerDetector, StalledDetector,
    # signals from per-category eval losses, distributions and activations (issue 8)
    CategoryDivergenceDetector, DeadUnitsDetector, ActivationBlowupDetector,
    GradDistributionDetector,
    # issue 17: the optimizer's step per unit of gradient left its own band
    EffectiveLrDetector,
)
"""One class per finding type, in docs/format.md's order."""

USUAL_SEVERITY: dict[str, Severity] = {cls.type: cls.severity for cls in DETECTOR_CLASSES}

FINDING_TYPES: tuple[str, ...] = tuple(USUAL_SEVERITY)
"""Every finding type: docs/format.md's catalogue in its order, then the ones added here."""

FORMAT_TYPES: tuple[str, ...] = FINDING_TYPES[:17]
"""docs/format.md's catalogue (the types the labelled traces in tests/traces/public use)."""
