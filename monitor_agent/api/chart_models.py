"""Response models of the chart endpoints (api/charts.py): a run's downsampled series and a
per-layer matrix (the OpenAPI page documents them)."""

from __future__ import annotations

from pydantic import BaseModel, Field

Values = list[float | None]


class SeriesValues(BaseModel):
    """One scalar per bucket: ``mean`` always; ``min``/``max`` when steps were bucketed."""

    mean: Values
    min: Values | None = None
    max: Values | None = None


class UserSeries(SeriesValues):
    """A scalar the training script logged itself, on its own steps."""

    steps: list[int]


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


class BranchOut(BaseModel):
    """Steps a resumed attempt abandoned (a rollback to a checkpoint): drawn apart from
    the run's current history, ending where they were given up."""

    attempt: int = Field(description="The resumed attempt that abandoned these steps.")
    rolled_back_to: int = Field(description="The step the run went back to (it went on at "
                                "the next one).")
    steps: list[int] = Field(description="Abandoned steps, evenly thinned, the last kept.")
    loss: list[float | None]
    grad_norm: list[float | None]


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
    update_limits: list[float] = Field(
        default_factory=list, description="The update-ratio detector's hard limits [min, max]: "
        "it fires when the median ratio leaves them.")
    nonfinite_steps: list[int] = Field(description="Steps whose loss or grad norm was NaN/Inf.")
    skipped_steps: list[int] = Field(
        default_factory=list, description="Steps the client's step guard skipped "
        "(skip_reason nonfinite_grad or grad_norm_outlier).")
    evals: Evals
    rank_step_time: RankStepTimes
    latest: dict[str, float | None] = Field(description="The last stored step's values.")
    repeat_every_steps: int = Field(
        default=100, description="Detectors report a lasting condition again after this many "
        "steps: findings of one kind closer than that are one episode.")
    recent_tokens_per_second: float | None = Field(
        default=None, description="Median tokens/s of the last 64 steps that report one.")
    user_names: list[str] = Field(default_factory=list, description="Every scalar the script "
                                  "logged itself (extra step fields, eval metrics as eval/...).")
    user_scalars: dict[str, UserSeries] = Field(
        default_factory=dict, description="The first 12 of user_names, downsampled.")
    warmup: int
    total_steps: int | None
    layers: list[str] = Field(description="Parameter names in model order.")
    modules: list[str] = Field(description="Module names with activation stats.")
    branches: list[BranchOut] = Field(
        default_factory=list, description="What rollbacks abandoned, oldest first: each the "
        "replaced steps of this rank in the range (pipeline/attempts.py).")


class MatrixOut(BaseModel):
    """A per-layer statistic, names x buckets, row-major (entry ``i * len(steps) + j``)."""

    stat: str
    names: list[str]
    steps: list[int]
    values_f32: str = Field(description="Base64 of little-endian float32 values, row-major; "
                            "NaN where a layer has no value in a bucket.")
    layer: str | None = Field(default=None, description="grad_quantiles: the parameter shown; its 8 "
                              "quantile rows replace the names.")
