"""Response models of the chart endpoints (the OpenAPI page documents them)."""

from __future__ import annotations

from pydantic import BaseModel, Field

Values = list[float | None]


class SeriesValues(BaseModel):
    """One scalar per bucket: ``mean`` always; ``min``/``max`` when steps were bucketed."""

    mean: Values
    min: Values | None = None
    max: Values | None = None


class Band(BaseModel):
    low: Values
    high: Values


class Evals(BaseModel):
    steps: list[int]
    val_loss: Values
    categories: dict[str, Values] = Field(description="Eval loss per category (loss/<name>).")


class RankStepTimes(BaseModel):
    steps: list[int]
    ranks: dict[str, Values] = Field(description="Max step time per bucket, by rank.")


class SeriesOut(BaseModel):
    """A run's per-step scalars downsampled to at most ``points`` buckets."""

    run_id: str
    rank: int
    ranks: list[int]
    range: list[int] = Field(description="First and last step covered.")
    count: int = Field(description="Steps stored in the range.")
    bucketed: bool
    steps: list[int] = Field(description="The x of each bucket (its mean step).")
    series: dict[str, SeriesValues]
    update_band: Band = Field(description="The update-ratio detector's healthy phase band.")
    nonfinite_steps: list[int] = Field(description="Steps whose loss or grad norm was NaN/Inf.")
    evals: Evals
    rank_step_time: RankStepTimes
    latest: dict[str, float | None] = Field(description="The last stored step's values.")
    warmup: int
    total_steps: int | None
    layers: list[str] = Field(description="Parameter names in model order.")
    modules: list[str] = Field(description="Module names with activation stats.")


class MatrixOut(BaseModel):
    """A per-layer statistic, names x buckets, row-major (entry ``i * len(steps) + j``)."""

    stat: str
    names: list[str]
    steps: list[int]
    values_f32: str = Field(description="Base64 of little-endian float32 values, row-major; "
                            "NaN where a layer has no value in a bucket.")
    layer: str | None = Field(default=None, description="grad_quantiles: the parameter shown; its 8 "
                              "quantile rows replace the names.")


class RunSummary(BaseModel):
    run_id: str
    project: str | None
    status: str
    active: bool
    last_step: int | None
    progress: float | None
    eta_seconds: float | None
    findings: int
    worst_finding: str | None
    firing_alerts: int
    last_seen: float


class RunsOut(BaseModel):
    runs: list[RunSummary]
