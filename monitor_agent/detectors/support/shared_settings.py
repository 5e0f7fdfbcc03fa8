"""The knobs more than one detector reads, or the suite itself: every detector's settings
model extends ``SharedSettings``, and ``DetectorSettings`` (detectors/settings.py)
extends them all, flat. A detector's own model adds its knobs, and the shared ones come
along; code outside a detector reads one detector's knobs typed through ``knobs``::

    >>> from monitor_agent.detectors import DetectorSettings
    >>> from monitor_agent.detectors.loss_spike import LossSpikeSettings
    >>> knobs = LossSpikeSettings(spike_ratio=1.5)
    >>> knobs.spike_ratio, knobs.baseline_window, knobs.repeat_every_steps
    (1.5, 100, 100)
    >>> DetectorSettings(spike_z=8).knobs(LossSpikeSettings).spike_z
    8.0
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

M = TypeVar("M", bound="SharedSettings")


class SharedSettings(BaseModel):
    """Suite-wide knobs and those several detectors read (see each field's description)."""

    model_config = ConfigDict(extra="forbid")

    disabled: set[str] = Field(
        default_factory=set, description="Finding types not computed at all."
    )
    log_only: set[str] = Field(
        default_factory=set,
        description="Finding types recorded and exported but flagged log_only (never page).",
    )
    ema_alpha: float = Field(
        default=0.99, gt=0, lt=1,
        description="Decay of the bias-corrected loss EMA (training_loss_ema).",
    )
    repeat_every_steps: int = Field(
        default=100, ge=1, description="A persisting condition is re-reported at most this often."
    )
    min_history_steps: int = Field(
        default=20, ge=2, description="Steps of history a baseline needs before it judges anything."
    )
    default_warmup_steps: int = Field(
        default=50, ge=0, description="Warmup assumed when the run record gives no warmup_steps."
    )
    baseline_window: int = Field(
        default=100, ge=10,
        description="Steps in the rolling median/MAD baselines (loss, grad norm).",
    )
    max_layer_findings: int = Field(
        default=10, ge=1,
        description="Per-layer findings (dead, exploding) reported per record at most.",
    )
    update_ratio_max: float = Field(
        default=0.1, gt=0,
        description="Hard upper limit of update/param.",
    )
    min_activation_readings: int = Field(
        default=5, ge=2, description="Readings a module needs before its baseline judges anything."
    )
    stall_horizon_seconds: float = Field(
        default=3600.0, gt=0,
        description="Replay: a trace without an end record is judged this long after its last "
        "record (must exceed the stall limit).",
    )

    def knobs(self, model: type[M]) -> M:
        """This object, typed as ``model``, one detector's settings model: what a type
        checker needs to read that detector's knobs on the flat ``DetectorSettings``."""
        if not isinstance(self, model):
            raise TypeError(f"{type(self).__name__} does not extend {model.__name__}")
        return self
