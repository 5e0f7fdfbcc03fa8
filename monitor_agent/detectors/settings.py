"""Detector thresholds and windows: one documented field each, with field-naming errors.

Embedded in the sidecar's Settings as ``detectors:`` (YAML) or
``MONITOR_AGENT_DETECTORS__<FIELD>`` (env). Thresholds are ratios to the run's own robust
baselines wherever possible, so the defaults hold across models, optimizers and scales.

Example::

    s = DetectorSettings(spike_ratio=1.5, log_only={"gain_drift"}, disabled={"plateau"})
    DetectorSuite(s)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from monitor_agent.detectors.catalogue import FINDING_TYPES


class DetectorSettings(BaseModel):
    """Every knob of the detectors; see each field's description."""

    model_config = ConfigDict(extra="forbid")

    # -- suite-wide ---------------------------------------------------------------------
    disabled: set[str] = Field(
        default_factory=set, description="Finding types not computed at all."
    )
    log_only: set[str] = Field(
        default_factory=set,
        description="Finding types recorded and exported but flagged log_only (never page).",
    )
    ema_alpha: float = Field(
        0.99, gt=0, lt=1, description="Decay of the bias-corrected loss EMA (training_loss_ema)."
    )
    repeat_every_steps: int = Field(
        100, ge=1, description="A persisting condition is re-reported at most this often."
    )
    nan_persist_steps: int = Field(
        3, ge=2, description="nan_inf reports again when non-finite this many steps in a row "
        "(what a rule's action_after: 2 acts on)."
    )
    min_history_steps: int = Field(
        20, ge=2, description="Steps of history a baseline needs before it judges anything."
    )
    default_warmup_steps: int = Field(
        50, ge=0, description="Warmup assumed when the run record gives no warmup_steps."
    )
    baseline_window: int = Field(
        100, ge=10, description="Steps in the rolling median/MAD baselines (loss, grad norm)."
    )

    # -- loss_spike / divergence --------------------------------------------------------
    spike_z: float = Field(
        6.0, gt=0, description="Robust z (MAD) of log(loss/EMA) that makes a spike."
    )
    spike_ratio: float = Field(1.3, gt=1, description="loss / EMA that makes a spike.")
    spike_decade: float = Field(
        10.0, gt=1, description="loss / EMA that is a spike whatever the noise (an order of "
        "magnitude; the z-score alone misses it where single batches are heavy-tailed)."
    )
    divergence_steps: int = Field(
        3, ge=2, description="Consecutive steps a runaway (loss and grad norm rising far above "
        "baseline) must last to be a divergence.",
    )
    divergence_ratio: float = Field(
        1.2, gt=1, description="loss / EMA from which a rising step counts toward divergence."
    )
    divergence_grad_ratio: float = Field(
        2.0, gt=1, description="grad norm / its median from which a rising step counts."
    )
    divergence_jump: float = Field(
        10.0, gt=1, description="Jump rule: update/param above update_ratio_max and this many "
        "times its rolling median.",
    )
    divergence_lr_jump: float = Field(
        2.0, gt=1, description="Jump rule: an update jump on a step whose lr is this many times "
        "its rolling median is judged at once (the LR, not one batch, made it)."
    )
    divergence_window: int = Field(
        10, ge=3, description="Steps in the recent loss level (median) compared with the "
        "median of the baseline_window steps before them."
    )
    divergence_rise: float = Field(
        0.3, gt=0, description="Level rule: the recent median loss at least this fraction "
        "above the earlier median..."
    )
    divergence_z: float = Field(
        6.0, gt=0, description="...and this many standard errors of the difference of the "
        "two medians above it (noise from the MAD of step-to-step log-loss changes)..."
    )
    divergence_progress: float = Field(
        0.25, gt=0, description="...and this fraction of the run's progress (start loss minus "
        "the earlier median) given back: the absolute floor for near-zero losses."
    )
    divergence_hold: int = Field(
        5, ge=1, description="Consecutive steps the level rule and the update jump rule must "
        "hold (not recover)."
    )

    # -- gradients ------------------------------------------------------------------------
    explosion_ratio: float = Field(
        3.0, gt=1, description="grad norm / its rolling median each step of an explosion "
        "must reach (a floor under explosion_z)..."
    )
    explosion_z: float = Field(
        6.0, gt=0, description="...and this many robust sigmas (MAD of log grad norm) above "
        "the median..."
    )
    explosion_steps: int = Field(
        3, ge=1, description="...on this many steps in a row (one bad batch is a loss_spike)."
    )
    explosion_warmup_factor: float = Field(
        5.0, ge=1, description="During warmup the explosion ratio is multiplied by this."
    )
    layer_explosion_ratio: float = Field(
        100.0, gt=1, description="A parameter's grad norm / its own EMA that is an "
        "explosion (explosion_steps readings in a row)."
    )
    max_layer_findings: int = Field(
        10, ge=1, description="Per-layer findings (dead, exploding) reported per record at most."
    )
    vanishing_ratio: float = Field(
        0.01, gt=0, lt=1, description="Early-layer / late-layer grad norm below this vanishes."
    )
    vanishing_window: int = Field(
        10, ge=1, description="Steps whose median ratio is judged (vanishing, dominance)."
    )
    dominance_ratio: float = Field(
        100.0, gt=1, description="One parameter's relative gradient (grad/param norm) over "
        "the median of the others' that dominates.",
    )
    dead_steps: int = Field(
        20, ge=1, description="Consecutive steps of zero gradient or zero update: dead layer."
    )
    gain_drift_coef: float = Field(
        0.05, gt=0, description="Per-layer gain drift limit is 1 + coef * sqrt(n_layers)."
    )
    gain_drift_min_total: float = Field(
        4.0, gt=1, description="End-to-end (input vs output) gain change it must also reach..."
    )
    gain_drift_norm_growth: float = Field(
        3.0, gt=1, description="...and the whole gradient (norm over all layers) must have "
        "grown this much from the baseline to the recent median."
    )
    gain_window: int = Field(
        50, ge=5, description="Steps in the baseline and current gain medians."
    )

    # -- grad_distribution (grad_hist quantiles, every hist_every steps) -------------------
    dist_window: int = Field(
        16, ge=4, description="Distribution readings in each parameter's own baseline."
    )
    dist_min_readings: int = Field(
        8, ge=2, description="Readings a parameter needs before its distribution is judged."
    )
    dist_z: float = Field(
        6.0, gt=0, description="Robust z (MAD) above its baseline that makes the tail ratio "
        "log((p99-p1)/(p75-p25)) or the centre |p50|/(p75-p25) abnormal.",
    )
    dist_tail_jump: float = Field(
        2.0, gt=1, description="...and the tail ratio must be this many times its baseline."
    )
    dist_shift: float = Field(
        1.0, gt=0, description="...and the centre |p50| must be this many IQRs from zero."
    )
    dist_collapse_ratio: float = Field(
        0.01, gt=0, lt=1, description="p1..p99 spread below this fraction of its baseline "
        "median: a collapsed distribution.",
    )

    # -- activations (readings = steps that carry ``activations``) ---------------------------
    dead_unit_ratio: float = Field(
        0.5, gt=0, le=1, description="A ReLU module's dead-unit fraction at or above this..."
    )
    dead_unit_rise: float = Field(
        0.3, gt=0, le=1, description="...or this much above its own early level (mean of its "
        "first min_activation_readings readings) is dead_units."
    )
    dead_unit_readings: int = Field(
        3, ge=1, description="Consecutive readings a module must stay dead to be reported."
    )
    activation_blowup_ratio: float = Field(
        10.0, gt=1, description="A module's max-abs or std this many times the median of its "
        "own recent readings (log space) is growing..."
    )
    activation_blowup_z: float = Field(
        6.0, gt=0, description="...and at least this many robust (MAD) deviations above it."
    )
    activation_blowup_readings: int = Field(
        2, ge=1, description="Consecutive growing readings that make activation_blowup."
    )
    activation_window: int = Field(
        20, ge=3, description="Readings in each module's rolling median/MAD baseline."
    )
    min_activation_readings: int = Field(
        5, ge=2, description="Readings a module needs before its baseline judges anything."
    )

    # -- update ratio -----------------------------------------------------------------------
    update_ratio_max: float = Field(0.1, gt=0, description="Hard upper limit of update/param.")
    update_ratio_min: float = Field(1e-7, gt=0, description="Hard lower limit of update/param.")
    update_ratio_window: int = Field(
        5, ge=1, description="Steps whose median update/param ratio is judged."
    )

    # -- clipping, plateau, overfitting -----------------------------------------------------
    clip_window: int = Field(50, ge=5, description="Steps judged for clip saturation.")
    clip_fraction: float = Field(
        0.8, gt=0, le=1, description="Fraction of clipped steps that saturates."
    )
    plateau_window: int = Field(
        200, ge=20, description="Steps over which the loss must improve (plateau)."
    )
    plateau_min_improvement: float = Field(
        0.01, ge=0, description="Relative loss improvement over the window below which it is flat."
    )
    plateau_evals: int = Field(
        5, ge=2, description="Evals without a new best val loss that make a plateau."
    )
    overfit_val_rise: float = Field(
        0.1, gt=0, description="Val loss this fraction above its best, train still falling."
    )
    overfit_evals: int = Field(
        2, ge=1, description="Evals in a row a rising val loss / stalled val must hold."
    )
    overfit_gap_mild: float = Field(
        0.1, gt=0, description="(val - train) / train from which the gap is reported mild."
    )
    overfit_gap_high: float = Field(
        0.3, gt=0, description="(val - train) / train that is overfitting once val stalls."
    )

    category_rise: float = Field(
        0.1, gt=0, description="category_divergence: the category's eval loss at least this "
        "fraction above its own best..."
    )
    category_drift: float = Field(
        0.5, gt=0, description="...and its standing against the other categories at least "
        "this ratio worse than its recent median standing..."
    )
    category_noise_k: float = Field(
        4.0, gt=0, description="...and more than this many robust sigmas of its own "
        "eval-to-eval noise."
    )
    category_evals: int = Field(
        2, ge=1, description="Evals in a row a category must diverge before it is reported."
    )
    category_min_evals: int = Field(
        4, ge=2, description="Evals of a category seen before it is judged at all."
    )

    # -- systems ----------------------------------------------------------------------------
    throughput_window: int = Field(
        20, ge=3, description="Recent steps whose median speed is compared to the baseline; "
        "the slow median must also hold this many steps in a row."
    )
    throughput_baseline_window: int = Field(
        200, ge=10, description="Earlier steps forming the speed baseline (median)."
    )
    throughput_ratio: float = Field(
        0.6, gt=0, lt=1, description="Recent / baseline speed below this is a drop."
    )
    memory_high: float = Field(
        0.9, gt=0, le=1, description="allocated / total from which memory pressure is a warning."
    )
    memory_critical: float = Field(
        0.97, gt=0, le=1, description="allocated / total from which it is an error."
    )
    memory_leak_window: int = Field(
        50, ge=5, description="Steps over which steady memory growth is judged."
    )
    memory_leak_fraction: float = Field(
        0.05, gt=0, description="Growth over the window (fraction of total) that is a leak."
    )
    loss_scale_halvings: int = Field(
        6, ge=1, description="Loss scale this many halvings below its recent max: collapse."
    )
    loss_scale_floor: float = Field(1.0, gt=0, description="Loss scale below this: collapse.")
    loss_scale_max_skipped: int = Field(
        10, ge=1, description="Consecutive skipped (overflow) steps that are a collapse."
    )
    loss_scale_settle_steps: int = Field(
        20, ge=1, description="Non-skipped steps before the scaler's own warmup is over."
    )
    straggler_ratio: float = Field(
        1.5, gt=1, description="A rank's median compute time over the others' median."
    )
    straggler_window: int = Field(20, ge=3, description="Steps per rank in the comparison.")
    stall_factor: float = Field(
        20.0, gt=1, description="Silence of this many median step intervals: stalled."
    )
    stall_min_seconds: float = Field(
        300.0, ge=0, description="Silence shorter than this is never a stall (checkpoints)."
    )
    stall_horizon_seconds: float = Field(
        3600.0, gt=0, description="Replay: a trace without an end record is judged this long "
        "after its last record (must exceed the stall limit).",
    )
    stall_repeat_seconds: float = Field(
        600.0, gt=0, description="A stall that persists is re-reported this often."
    )

    @field_validator("disabled", "log_only")
    @classmethod
    def _known_types(cls, value: set[str]) -> set[str]:
        unknown = sorted(value - set(FINDING_TYPES))
        if unknown:
            raise ValueError(f"unknown finding type(s) {unknown}; known: {', '.join(FINDING_TYPES)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DetectorSettings:
        if self.memory_critical < self.memory_high:
            raise ValueError("memory_critical must be >= memory_high")
        if self.overfit_gap_high < self.overfit_gap_mild:
            raise ValueError("overfit_gap_high must be >= overfit_gap_mild")
        if self.update_ratio_min >= self.update_ratio_max:
            raise ValueError("update_ratio_min must be < update_ratio_max")
        return self
