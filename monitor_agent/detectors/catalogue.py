"""The detector registry: every detector class in catalogue order, and the finding types and
usual severities read from them.

A detector declares its type, severity, knobs and suggestions in its own file; listing its
class here (one line, and its import) is all that registers it: the suite runs it, the
rules/format validation know its type, and ``DetectorSettings`` (settings.py) is composed
from the settings models of the classes listed here. The order is the catalogue's, the one docs/format.md lists the
types in: the 17 types of the original format first (``FORMAT_TYPES``), then the ones added
since (it is also the order findings of one record come out in)::

    >>> FINDING_TYPES[:3], "effective_lr_shift" in FINDING_TYPES
    (('nan_inf', 'loss_spike', 'divergence'), True)
    >>> USUAL_SEVERITY["stalled"].label, USUAL_SEVERITY["gain_drift"].label
    ('error', 'info')
    >>> FORMAT_TYPES[-1], FINDING_TYPES[len(FORMAT_TYPES)]
    ('stalled', 'category_divergence')
"""

from __future__ import annotations

from typing import Any

from monitor_agent.detectors.action_held import ActionHeldDetector
from monitor_agent.detectors.activation_blowup import ActivationBlowupDetector
from monitor_agent.detectors.category_divergence import CategoryDivergenceDetector
from monitor_agent.detectors.clip_saturation import ClipSaturationDetector
from monitor_agent.detectors.crashed import CrashedDetector
from monitor_agent.detectors.dead_layer import DeadLayerDetector
from monitor_agent.detectors.dead_units import DeadUnitsDetector
from monitor_agent.detectors.divergence import DivergenceDetector
from monitor_agent.detectors.effective_lr import EffectiveLrDetector
from monitor_agent.detectors.gain_drift import GainDriftDetector
from monitor_agent.detectors.gpu_health import GpuHealthDetector
from monitor_agent.detectors.grad_distribution import GradDistributionDetector
from monitor_agent.detectors.grad_explosion import GradExplosionDetector
from monitor_agent.detectors.grad_vanishing import GradVanishingDetector
from monitor_agent.detectors.hang import HangDetector
from monitor_agent.detectors.input_bound import InputBoundDetector
from monitor_agent.detectors.loss_scale_collapse import LossScaleCollapseDetector
from monitor_agent.detectors.loss_spike import LossSpikeDetector
from monitor_agent.detectors.lr_jump import LrJumpDetector
from monitor_agent.detectors.memory_pressure import MemoryPressureDetector
from monitor_agent.detectors.nan_inf import NanInfDetector
from monitor_agent.detectors.not_learning import NotLearningDetector
from monitor_agent.detectors.overfitting import OverfittingDetector
from monitor_agent.detectors.plateau import PlateauDetector
from monitor_agent.detectors.rank_outlier import RankOutlierDetector
from monitor_agent.detectors.relaunched import RelaunchedDetector
from monitor_agent.detectors.skip_budget import SkipBudgetDetector
from monitor_agent.detectors.stalled import StalledDetector
from monitor_agent.detectors.straggler import StragglerDetector
from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.throughput_drop import ThroughputDropDetector
from monitor_agent.detectors.two_jobs import TwoJobsDetector
from monitor_agent.detectors.update_ratio import UpdateRatioHighDetector, UpdateRatioLowDetector
from monitor_agent.detectors.window_trained import WindowTrainedDetector
from monitor_agent.records.types import Severity

DETECTOR_CLASSES: tuple[type[DetectorBase[Any]], ...] = (
    # the original format's 17 types. Spike, explosion, divergence (docs/format.md, "Finding
    # types"): a burst of bad batches the run recovers from (up to 20 steps, the lr where it
    # was) is a loss_spike; a gradient out of its band (6 robust sigmas, 3x) that persists -
    # its raised lr still applied, past 20 steps, not back after it - or recurs (5 episodes,
    # or 3 of them 10x out, within 1000 steps) is a grad_explosion; a loss level 6 standard
    # errors of its own noise above its best, holding (past any level swing the run came
    # back from on its own), is a divergence. A loss of either sign is judged in its own
    # units, never as a percentage; one with no stable level (declared nonstationary, or
    # below zero undeclared) gets no spike or level judgement (support/context.py's
    # LOSS_KINDS and level_units).
    NanInfDetector, LossSpikeDetector, DivergenceDetector, GradExplosionDetector,
    GradVanishingDetector, DeadLayerDetector, UpdateRatioHighDetector, UpdateRatioLowDetector,
    GainDriftDetector, ClipSaturationDetector, PlateauDetector, OverfittingDetector,
    ThroughputDropDetector, MemoryPressureDetector, LossScaleCollapseDetector,
    StragglerDetector, StalledDetector,
    # deeper signals: per-category eval losses, gradient distributions and activations
    CategoryDivergenceDetector, DeadUnitsDetector, ActivationBlowupDetector,
    GradDistributionDetector,
    # the optimizer's step per unit of gradient left its own band
    EffectiveLrDetector,
    # the LR rose far outside the run's own schedule (the likely cause of what follows)
    LrJumpDetector,
    # every rank waits on its data loader (the input pipeline sets the pace)
    InputBoundDetector,
    # one rank's local loss far outside its peers' spread (a sick GPU, a corrupt shard)
    RankOutlierDetector,
    # the client's step guard keeps skipping steps: a broken run it would otherwise hide
    SkipBudgetDetector,
    # where a stuck run is stuck, per rank (the client's hang reports), and gone processes
    HangDetector,
    # the job's action (a rollback, a stop) held back: not every rank could take it
    ActionHeldDetector,
    # a rank's GPU failing (ECC, row remaps, XIDs, lost) or slowing it (throttle, PCIe)
    GpuHealthDetector,
    # after a rollback, the resumed run trained data its plan said to skip
    WindowTrainedDetector,
    # a replaced attempt of the run id still sending: two live jobs on one run id
    TwoJobsDetector,
    # the job's launcher relaunched it after a crash (no person, no action of ours)
    RelaunchedDetector,
    # the run stopped learning: exact zeros or exact repeats where a learning run moves
    NotLearningDetector,
    # the training process died of an exception (its end record says which)
    CrashedDetector,
)
"""One class per finding type, in the catalogue's order (docs/format.md lists them so)."""

USUAL_SEVERITY: dict[str, Severity] = {cls.type: cls.severity for cls in DETECTOR_CLASSES}

FINDING_TYPES: tuple[str, ...] = tuple(USUAL_SEVERITY)
"""Every finding type, in the catalogue's order: ``FORMAT_TYPES``, then the ones added since."""

RUN_SCOPED_TYPES: frozenset[str] = frozenset(
    cls.type for cls in DETECTOR_CLASSES if cls.scope == "run")
"""The types that judge ranks against each other (``DetectorBase.scope``): in a multi-node
run only its leader makes them (monitor_agent/cluster)."""

FORMAT_TYPES: tuple[str, ...] = FINDING_TYPES[:17]
"""The original format's 17 types (the ones the labelled traces in tests/traces/public use)."""
