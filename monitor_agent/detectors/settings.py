"""``DetectorSettings``: every detector's knobs in one flat model, written out here with one
typed view per detector in catalogue.py's ``DETECTOR_CLASSES``.

Embedded in the sidecar's Settings as ``detectors:`` (YAML) or
``MONITOR_AGENT_DETECTORS__<FIELD>`` (env). Flat on purpose: a knob's name is the same in
YAML, env and code, whichever detector owns it, and a misspelt one is rejected by name
(``extra="forbid"``). The model subclasses every detector's settings model, so a detector
handed a ``DetectorSettings`` reads its own knobs through its own type, and each model's
cross-field checks (e.g. ``memory_critical >= memory_high``) come along. Thresholds are
ratios to the run's own robust baselines wherever possible, so the defaults hold across
models, optimizers and scales.

Each detector type is also a read-only attribute typed as that detector's settings model
(``settings.loss_spike.spike_z``), so code and editors see which knobs a detector has. It is
a view, not a section: the same object, as the detector itself is handed it; YAML and env
stay flat. tests/detectors/test_registry.py fails when the views, the bases or the fields
drift from the registry (``compose_settings(DETECTOR_CLASSES)`` is the reference).

Knobs set by their flat names and read through a detector's view (the same object, shared
knobs included); a misspelt knob is refused by name::

    >>> from pydantic import ValidationError
    >>> s = DetectorSettings(spike_ratio=1.5, log_only={"gain_drift"}, disabled={"plateau"})
    >>> s.loss_spike.spike_ratio, s.loss_spike is s, s.loss_spike.baseline_window
    (1.5, True, 100)
    >>> try:
    ...     DetectorSettings(spike_ratoi=1.5)
    ... except ValidationError as exc:
    ...     print(exc.errors()[0]["type"], exc.errors()[0]["loc"])
    extra_forbidden ('spike_ratoi',)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar, overload

from pydantic import ConfigDict, create_model, field_validator

from monitor_agent.detectors.activation_blowup import ActivationBlowupSettings
from monitor_agent.detectors.catalogue import FINDING_TYPES
from monitor_agent.detectors.category_divergence import CategoryDivergenceSettings
from monitor_agent.detectors.clip_saturation import ClipSaturationSettings
from monitor_agent.detectors.dead_layer import DeadLayerSettings
from monitor_agent.detectors.dead_units import DeadUnitsSettings
from monitor_agent.detectors.divergence import DivergenceSettings
from monitor_agent.detectors.gain_drift import GainDriftSettings
from monitor_agent.detectors.gpu_health import GpuHealthSettings
from monitor_agent.detectors.grad_distribution import GradDistributionSettings
from monitor_agent.detectors.grad_explosion import GradExplosionSettings
from monitor_agent.detectors.grad_vanishing import GradVanishingSettings
from monitor_agent.detectors.hang import HangSettings
from monitor_agent.detectors.input_bound import InputBoundSettings
from monitor_agent.detectors.loss_scale_collapse import LossScaleCollapseSettings
from monitor_agent.detectors.loss_spike import LossSpikeSettings
from monitor_agent.detectors.memory_pressure import MemoryPressureSettings
from monitor_agent.detectors.nan_inf import NanInfSettings
from monitor_agent.detectors.overfitting import OverfittingSettings
from monitor_agent.detectors.plateau import PlateauSettings
from monitor_agent.detectors.rank_outlier import RankOutlierSettings
from monitor_agent.detectors.skip_budget import SkipBudgetSettings
from monitor_agent.detectors.stalled import StalledSettings
from monitor_agent.detectors.straggler import StragglerSettings
from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.throughput_drop import ThroughputDropSettings
from monitor_agent.detectors.update_ratio import UpdateRatioSettings

M = TypeVar("M", bound=SharedSettings)


def known_types(value: set[str]) -> set[str]:
    """``disabled`` and ``log_only`` name only types the catalogue has."""
    unknown = sorted(value - set(FINDING_TYPES))
    if unknown:
        raise ValueError(f"unknown finding type(s) {unknown}; known: {', '.join(FINDING_TYPES)}")
    return value


class KnobsOf(Generic[M]):
    """One detector's knobs on ``DetectorSettings``: the settings object itself, typed as
    that detector's settings model ``model`` (which ``DetectorSettings`` subclasses).
    Read-only and not a field, so it is neither accepted from YAML/env nor dumped."""

    def __init__(self, model: type[M]) -> None:
        self.model = model

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> KnobsOf[M]: ...

    @overload
    def __get__(self, obj: SharedSettings, owner: type[Any]) -> M: ...

    def __get__(self, obj: SharedSettings | None, owner: type[Any]) -> KnobsOf[M] | M:
        if obj is None:
            return self
        if not isinstance(obj, self.model):
            raise TypeError(f"{type(obj).__name__} does not extend {self.model.__name__}")
        return obj


# The bases are the catalogue's settings models in reverse (each once, SharedSettings, every
# model's base, left implicit), because pydantic orders fields by the reversed MRO: shared
# knobs first, then each detector's in catalogue order, as YAML dumps and the schema list them.
class DetectorSettings(
    GpuHealthSettings, HangSettings, SkipBudgetSettings, RankOutlierSettings, InputBoundSettings,
    GradDistributionSettings, ActivationBlowupSettings, DeadUnitsSettings,
    CategoryDivergenceSettings, StalledSettings, StragglerSettings, LossScaleCollapseSettings,
    MemoryPressureSettings, ThroughputDropSettings, OverfittingSettings, PlateauSettings,
    ClipSaturationSettings, GainDriftSettings, UpdateRatioSettings, DeadLayerSettings,
    GradVanishingSettings, GradExplosionSettings, DivergenceSettings, LossSpikeSettings,
    NanInfSettings,
):
    """Every knob of the detectors; see each field's description."""

    model_config = ConfigDict(ignored_types=(KnobsOf,))

    # One view per finding type, in the catalogue's order, typed as its detector's
    # ``settings_model``: ``settings.loss_spike.spike_z``.
    nan_inf = KnobsOf(NanInfSettings)
    loss_spike = KnobsOf(LossSpikeSettings)
    divergence = KnobsOf(DivergenceSettings)
    grad_explosion = KnobsOf(GradExplosionSettings)
    grad_vanishing = KnobsOf(GradVanishingSettings)
    dead_layer = KnobsOf(DeadLayerSettings)
    update_ratio_high = KnobsOf(UpdateRatioSettings)
    update_ratio_low = KnobsOf(UpdateRatioSettings)
    gain_drift = KnobsOf(GainDriftSettings)
    clip_saturation = KnobsOf(ClipSaturationSettings)
    plateau = KnobsOf(PlateauSettings)
    overfitting = KnobsOf(OverfittingSettings)
    throughput_drop = KnobsOf(ThroughputDropSettings)
    memory_pressure = KnobsOf(MemoryPressureSettings)
    loss_scale_collapse = KnobsOf(LossScaleCollapseSettings)
    straggler = KnobsOf(StragglerSettings)
    stalled = KnobsOf(StalledSettings)
    category_divergence = KnobsOf(CategoryDivergenceSettings)
    dead_units = KnobsOf(DeadUnitsSettings)
    activation_blowup = KnobsOf(ActivationBlowupSettings)
    grad_distribution = KnobsOf(GradDistributionSettings)
    effective_lr_shift = KnobsOf(SharedSettings)
    lr_jump = KnobsOf(SharedSettings)
    input_bound = KnobsOf(InputBoundSettings)
    rank_outlier = KnobsOf(RankOutlierSettings)
    skip_budget = KnobsOf(SkipBudgetSettings)
    hang = KnobsOf(HangSettings)
    action_held = KnobsOf(SharedSettings)
    gpu_health = KnobsOf(GpuHealthSettings)
    window_trained = KnobsOf(SharedSettings)
    two_jobs = KnobsOf(SharedSettings)

    @field_validator("disabled", "log_only")
    @classmethod
    def _known_types(cls, value: set[str]) -> set[str]:
        return known_types(value)


def compose_settings(classes: Iterable[type[DetectorBase[Any]]]) -> type[SharedSettings]:
    """One flat model subclassing the ``settings_model`` of each of ``classes``: what
    ``DetectorSettings`` is for ``DETECTOR_CLASSES`` (the registry test compares the two),
    and a settings model for any other set of detectors."""
    # Reversed, because pydantic orders fields by the reversed MRO: shared knobs first, then
    # each detector's in catalogue order. SharedSettings itself is every model's base.
    models = dict.fromkeys(
        cls.settings_model for cls in reversed(tuple(classes))
        if cls.settings_model is not SharedSettings
    ) or {SharedSettings: None}
    return create_model(
        "DetectorSettings",
        __base__=tuple(models),
        __module__=__name__,
        __doc__="Every knob of the detectors; see each field's description.",
        __validators__={
            "_known_types": field_validator("disabled", "log_only")(known_types),
        },
    )
