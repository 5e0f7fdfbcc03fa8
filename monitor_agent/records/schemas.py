"""Wire models of docs/format.md, used only at the edges (the ingest API and the trace judge).

They validate one record at a time so a batch can accept the good records and say exactly
why each bad one was rejected; ``to_record`` hands the rest of the sidecar the plain
dataclass from ``types.py`` (``types.from_wire``: same-named fields, no hand-written copy),
and ``stored_json`` the bytes the store keeps when the client's own line is not kept.

A step whose NaN loss travels as a string, one whose step is a JSON ``true``, and an end
record with the JSON the store keeps for it (defaults filled in)::

    >>> rec = parse_record({"kind": "step", "run_id": "r", "step": 1, "time": 0.0, "loss": "NaN"})
    >>> type(rec).__name__, rec.step, rec.loss
    ('StepRecord', 1, nan)
    >>> parse_record({"kind": "step", "run_id": "r", "step": True, "time": 0.0})
    Traceback (most recent call last):
    monitor_agent.records.RecordError: step: Input should be a valid integer
    >>> record, body = parse_for_store({"kind": "end", "run_id": "r", "time": 9.0})
    >>> body
    b'{"kind":"end","run_id":"r","step":0,"time":9.0,"rank":0,"status":"completed"}'
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from typing_extensions import TypedDict

from monitor_agent.records import RecordError, limits
from monitor_agent.records import types as t
from monitor_agent.records.limits import MAX_NAME_LEN

# Bounds that keep one record from exhausting memory or label space; generous for real runs
# (the budgets of free-form parts, strings and histograms are in records/limits.py).
MAX_LAYERS = 20_000
MAX_HIST_BINS = 1024
MAX_METRICS = 512
MAX_LABELS = 32

def _name(value: str) -> str:
    return limits.check_text(value, MAX_NAME_LEN, "name")


# No '/', and not '.' or '..': a run id is one path segment of /v1/runs/{id} (and of the
# client's action poll).
RunId = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:@+=-]+$"),
    AfterValidator(lambda v: limits.check_path_segment(v, "run_id")),
]
# Map keys; their characters are checked per map in one pass (limits.check_names).
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_LEN)]
LabelName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")]
LabelValue = Annotated[str, AfterValidator(_name)]
# Strict: a JSON true or "12" is not a step, and a record's time must be a real instant
# (Unix seconds: not before 1970; how far ahead of the sidecar's clock it may be is checked
# against its arrival, ``limits.check_time``).
Step = Annotated[int, Field(ge=0, le=2**53, strict=True)]
Time = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)]
Rank = Annotated[int, Field(ge=0, le=1_000_000, strict=True)]
# Which process sent the record (docs/format.md, "attempt"): a token the client draws once
# per Monitor; a run id's records under a new token are a new attempt of that run.
AttemptToken = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:-]+$"),
]
Num = float | None
# A duration the client measured (an eval's, a checkpoint save's, a hang's): a JSON number
# (not "5", not true), finite, >= 0 and at most ``limits.MAX_DURATION_SECONDS``.
Duration = Annotated[float, Field(strict=True, ge=0, le=limits.MAX_DURATION_SECONDS,
                                  allow_inf_nan=False)]
Seconds = Duration | None


def _timing(value: Any) -> Any:
    """A step's timing (``step_time``, ``data_time``, ...): a JSON number, or the wire's
    NaN/Infinity (data: detectors skip it); a finite one is a duration (>= 0, at most
    ``limits.MAX_DURATION_SECONDS``). Not ``"5"`` or ``true``."""
    if value is None or value in ("NaN", "Infinity", "-Infinity"):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a JSON number (seconds)")
    if value == value and abs(value) != float("inf") and \
            not 0 <= value <= limits.MAX_DURATION_SECONDS:
        raise ValueError(f"must be a duration in seconds, 0..{limits.MAX_DURATION_SECONDS:g}")
    return value


Timing = Annotated[Num, BeforeValidator(_timing)]


def _plain_scalar(name: Any, value: Any) -> bool:
    """A top-level field a step may carry as one of the script's own scalars."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LEN or not name.isprintable():
        return False
    if isinstance(value, float):
        return True
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) <= 2**53
    return value in ("NaN", "Infinity", "-Infinity")


class _Wire(BaseModel):
    # Producers may add fields; we ignore what we do not know (docs/format.md).
    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="strings", frozen=True)


class MemoryModel(_Wire):
    device: Annotated[str, StringConstraints(max_length=64), AfterValidator(_name)] | None = None
    allocated_bytes: Num = None
    reserved_bytes: Num = None
    peak_allocated_bytes: Num = None
    total_bytes: Num = None


class LayerModel(TypedDict, total=False):
    # A TypedDict, not a model: a GPT-sized record has hundreds of these, and building a
    # model instance for each made validation 7x slower.
    grad_norm: Num
    grad_mean: Num
    grad_std: Num
    grad_max_abs: Num
    grad_zero_frac: Num
    param_norm: Num
    update_norm: Num
    grad_none: bool


# The models of a run that watches several (a GAN's generator and discriminator, an
# actor and a critic), each named by the client (``Monitor.watch(name=)``).
MAX_MODELS = 64


class ModelStepModel(TypedDict, total=False):
    # One watched model's own values of the step (docs/format.md, ``models``); the step's
    # global norms are over every model's parameters.
    grad_norm: Num
    param_norm: Num
    update_norm: Num
    lr: Num
    clip_threshold: Num
    skipped: bool  # its optimizer did not step (or the step guard skipped it)
    skip_reason: Literal["nonfinite_grad", "grad_norm_outlier", "loss_scale"]


MAX_ACTIVATION_MODULES = 4096
MAX_NAMED_MODULES = 64


class ActivationModel(TypedDict, total=False):
    # Per module: statistics of its output on the step's first micro-batch (client docs).
    mean: Num
    std: Num
    max_abs: Num
    zero_frac: Num
    dead_frac: Num  # ReLU-family only: units zero for every sample; else null
    nonfinite: Num


class HistModel(TypedDict):
    edges: Annotated[list[float], Field(max_length=MAX_HIST_BINS + 1)]
    counts: Annotated[list[float], Field(max_length=MAX_HIST_BINS)]
    # Optional: values at types.QUANTILE_LEVELS (min, p1, p25, p50, p75, p95, p99, max).
    quantiles: NotRequired[
        Annotated[list[float], Field(min_length=len(t.QUANTILE_LEVELS),
                                     max_length=len(t.QUANTILE_LEVELS))]
    ]


FreeForm = dict[str, Any]


class WatchdogModel(_Wire):
    # The client's hang watchdog (docs/format.md, "hang"): declared on the run record so
    # the sidecar can tell a rank that went silent without a hang report (its process is
    # gone) from one that is merely slow.
    floor_seconds: Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)]
    factor: Annotated[float, Field(gt=1, le=1000, allow_inf_nan=False)]
    warmup_steps: Annotated[int, Field(ge=0, le=1_000_000, strict=True)] = 5


class ClusterModel(_Wire):
    # Where the sending rank's node sits in a multi-node job (docs/format.md, "cluster"):
    # node 0's sidecar leads the run; the others forward digests to ``leader_url``.
    node_rank: Annotated[int, Field(ge=0, le=1_000_000, strict=True)]
    nodes: Annotated[int, Field(ge=1, le=1_000_000, strict=True)]
    local_world_size: Annotated[int, Field(ge=1, le=1_000_000, strict=True)] | None = None
    leader_url: Annotated[str, StringConstraints(max_length=2048),
                          AfterValidator(_name)] | None = None


class LauncherModel(_Wire):
    # What starts the sending process (docs/format.md, "launcher"): whether a ``restart``
    # action can be carried out (its launcher runs it again on exit status 75).
    name: Annotated[str, StringConstraints(min_length=1, max_length=32,
                                           pattern=r"^[a-z0-9_.-]+$")] = "none"
    restarts: Annotated[bool, Field(strict=True)] = False
    restart_count: Annotated[int, Field(ge=0, le=1_000_000, strict=True)] | None = None
    max_restarts: Annotated[int, Field(ge=0, le=1_000_000, strict=True)] | None = None
    min_nodes: Annotated[int, Field(ge=1, le=1_000_000, strict=True)] | None = None
    max_nodes: Annotated[int, Field(ge=1, le=1_000_000, strict=True)] | None = None


class ProcessModel(_Wire):
    # Which process sent it (docs/format.md, "process"): its node's sidecar ends it when a
    # restart finds it stopped, only if /proc still says this start time on this boot
    # (cluster/stopped_rank.py).
    pid: Annotated[int, Field(ge=1, le=2**22, strict=True)]
    start: Annotated[int, Field(ge=0, le=2**63 - 1, strict=True)]
    boot: Annotated[str, StringConstraints(pattern=r"^[0-9a-f-]{36}$")]


class DataModel(_Wire):
    # How the run leaves a rollback plan's windows out (docs/format.md, "run"): in a
    # map-style dataset's batch sampler, or by reading past them in a stream.
    skips_by: Literal["sampler", "reading"]


class RunModel(_Wire):
    kind: Literal["run"]
    run_id: RunId
    time: Time | None = None
    rank: Rank = 0
    attempt: AttemptToken | None = None
    config: FreeForm = Field(default_factory=dict)
    model: FreeForm = Field(default_factory=dict)
    hardware: FreeForm = Field(default_factory=dict)
    labels: Annotated[dict[LabelName, LabelValue], Field(max_length=MAX_LABELS)] = Field(
        default_factory=dict
    )
    watchdog: WatchdogModel | None = None
    cluster: ClusterModel | None = None
    launcher: LauncherModel | None = None
    process: ProcessModel | None = None
    data: DataModel | None = None

    @field_validator("config", "model", "hardware")
    @classmethod
    def _budget(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        limits.check_freeform(value, str(info.field_name))
        project = value.get("project") if info.field_name == "config" else None
        if project is not None:
            # It becomes the project label of every series of the run: the labels' rule.
            if not isinstance(project, str):
                raise ValueError("config.project: must be a string (it is a label value)")
            limits.check_text(project, MAX_NAME_LEN, "config.project")
        if info.field_name == "hardware":
            _check_sizes(value)
        return value


# The counts of ``hardware`` that bound which ranks may speak for the run (a ``hang`` from a
# rank at or past ``world_size`` is refused): checked here like ``rank`` itself, a JSON
# integer 1..1,000,000, so ``4.0``, ``"4"`` or ``true`` cannot switch that check off.
_SIZE_KEYS = ("world_size", "reporting_ranks")
_MAX_RANKS = 1_000_000


def _check_sizes(hardware: dict[str, Any]) -> None:
    for key in _SIZE_KEYS:
        value = hardware.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) \
                or not 1 <= value <= _MAX_RANKS:
            raise ValueError(f"hardware.{key}: must be a JSON integer 1..{_MAX_RANKS} "
                             f"(got {limits.safe(repr(value))[:40]})")



DataPosition = Annotated[int, Field(
    ge=0, le=2**62, strict=True,
    description="Batches (or samples) of the run's data stream consumed so far: the position "
    "of the last one trained. Counted over the whole run, across epochs; a rollback plan "
    "names the positions to resume from and to skip (docs/format.md).")]


class StepModel(_Wire):
    kind: Literal["step"]
    run_id: RunId
    step: Step
    time: Time
    rank: Rank = 0
    attempt: AttemptToken | None = None
    loss: Num = None
    lr: Num = None
    grad_norm: Num = None
    clip_threshold: Num = None
    param_norm: Num = None
    update_norm: Num = None
    tokens: Num = None
    samples: Num = None
    step_time: Timing = None
    data_time: Timing = None
    data_idle_time: Timing = None
    compute_time: Timing = None
    sync_wait_time: Timing = None
    tokens_per_second: Num = None
    mfu: Num = None
    loss_scale: Num = None
    skipped: bool | None = None
    # How far the run's data stream has been consumed once this step trained: a count of
    # batches (or samples), the position of the last one the step trained (docs/format.md).
    data_position: DataPosition | None = None
    # Why the optimizer skipped the step: the client's step guard, or the GradScaler.
    skip_reason: Literal["nonfinite_grad", "grad_norm_outlier", "loss_scale"] | None = None
    memory: MemoryModel | None = None
    # The rank's GPU as NVML last saw it: docs/format.md lists the keys the client sends.
    gpu: Annotated[dict[Name, Num], Field(
        max_length=64, description="The rank's GPU from NVML, name -> number (docs/format.md "
        "lists the keys: utilization, temperature_c, power_w, sm_clock_mhz, throttle_*, "
        "ecc_*, remapped_rows_*, pcie_link_*, xid_count, gpu_lost, ...).")] | None = None
    layers: Annotated[dict[Name, LayerModel], Field(max_length=MAX_LAYERS)] | None = None
    grad_hist: Annotated[dict[Name, HistModel], Field(max_length=MAX_LAYERS)] | None = None
    param_hist: Annotated[dict[Name, HistModel], Field(max_length=MAX_LAYERS)] | None = None
    activations: Annotated[
        dict[Name, ActivationModel], Field(max_length=MAX_ACTIVATION_MODULES)
    ] | None = None
    # Where a fault started, so a finding can name the parameter or module it began in:
    # per-parameter pre-clip grad norms on the steps the client's gate keeps (non-finite
    # or far above its median), and the modules whose forward output was non-finite, in
    # forward order (first = where it appeared).
    grad_norms: Annotated[dict[Name, Num], Field(max_length=MAX_LAYERS)] | None = None
    nonfinite_modules: Annotated[list[Name], Field(max_length=MAX_NAMED_MODULES)] | None = None
    nonfinite_module_count: Annotated[int, Field(ge=0, le=2**31)] | None = None
    # What the client read of each output: every element, or each row's first features.
    nonfinite_check: Literal["full", "sampled"] | None = None
    # The script's own numbers (accuracy, perplexity, ...), as an eval's: charted by the UI.
    metrics: Annotated[dict[Name, Num], Field(max_length=MAX_METRICS)] | None = None
    # A run that watches several models: each one's own norms, LR and clipping, by name.
    models: Annotated[dict[Name, ModelStepModel], Field(max_length=MAX_MODELS)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _own_scalars(cls, data: Any) -> Any:
        """A number at the top level that this format does not define is one of the
        script's own scalars (``mon.log_step(step, loss, accuracy=acc)``): it joins
        ``metrics`` as if sent there, while that map has room (``MAX_METRICS``); a name
        ``metrics`` already has keeps the value sent there. Anything else undefined is
        dropped, as it always was: a name that is not printable or too long, a value that
        is not a number (bools, strings, maps), an integer past float precision."""
        if not isinstance(data, dict):
            return data
        metrics = data.get("metrics")
        if metrics is not None and not isinstance(metrics, dict):
            return data  # the field's own validation says what is wrong with it
        moved = {k: v for k, v in data.items() if k not in TOP_FIELDS["step"]
                 and _plain_scalar(k, v)}
        if not moved:
            return data
        merged = dict(metrics or {})
        for name, value in moved.items():
            if len(merged) >= MAX_METRICS:
                break
            merged.setdefault(name, value)
        return {**{k: v for k, v in data.items() if k not in moved}, "metrics": merged}

    @model_validator(mode="after")
    def _budgets(self) -> StepModel:
        for where in ("gpu", "layers", "grad_hist", "param_hist", "activations", "metrics",
                      "models"):
            limits.check_names(getattr(self, where), where)
        count = limits.hist_values(self.grad_hist, self.param_hist)
        if count > limits.MAX_HIST_VALUES:
            raise ValueError(f"grad_hist/param_hist: {count} numbers exceed the budget of "
                             f"{limits.MAX_HIST_VALUES} per record")
        return self



class EvalModel(_Wire):
    kind: Literal["eval"]
    run_id: RunId
    step: Step
    time: Time
    rank: Rank = 0
    attempt: AttemptToken | None = None
    val_loss: Num = None
    train_loss: Num = None
    epoch: Num = None
    metrics: Annotated[dict[Name, Num], Field(max_length=MAX_METRICS)] = Field(
        default_factory=dict
    )
    seconds: Seconds = None  # how long the evaluation took (the goodput ledger's)

    @model_validator(mode="after")
    def _names(self) -> EvalModel:
        limits.check_names(self.metrics, "metrics")
        return self



def _error_text(value: str) -> str:
    return limits.check_text(value, limits.MAX_TEXT_LEN, "error", name=False)


class EndModel(_Wire):
    kind: Literal["end"]
    run_id: RunId
    step: Step = 0
    time: Time
    rank: Rank = 0
    attempt: AttemptToken | None = None
    status: Literal["completed", "failed", "stopped"] = "completed"
    error: Annotated[str, AfterValidator(_error_text)] | None = None



def _checkpoint_path(value: str) -> str:
    if "\x00" in value:
        raise ValueError("path: contains a NUL character")
    return limits.check_text(value, limits.MAX_CHECKPOINT_PATH_LEN, "path", name=False)


def _checkpoint_tag(value: str) -> str:
    return limits.check_text(value, limits.MAX_CHECKPOINT_TAG_LEN, "tag")


class CheckpointModel(_Wire):
    kind: Literal["checkpoint"]
    run_id: RunId
    step: Step
    time: Time
    rank: Rank = 0
    attempt: AttemptToken | None = None
    # The budget is checked before the characters, so a 1 MB path is refused by its length.
    path: Annotated[str, StringConstraints(min_length=1), AfterValidator(_checkpoint_path)]
    bytes: Annotated[int, Field(ge=0, le=2**62, strict=True)] | None = None
    tag: Annotated[str, AfterValidator(_checkpoint_tag)] | None = None
    # The data position the checkpoint's state resumes from (the step's ``data_position``).
    data_position: DataPosition | None = None
    seconds: Seconds = None  # how long the save took (the goodput ledger's)


def _frame_text(value: str) -> str:
    return limits.check_text(value, MAX_NAME_LEN, "frame", name=True)


FrameText = Annotated[str, AfterValidator(_frame_text)]


class FrameModel(TypedDict):
    # One Python frame; ``user`` marks the script's own code (not the standard library
    # or an installed package): the page quotes the innermost one as "called from".
    file: FrameText
    line: Annotated[int, Field(ge=0, le=2**31, strict=True)]
    function: FrameText
    user: NotRequired[bool]


class ThreadModel(TypedDict):
    name: FrameText
    training: NotRequired[bool]  # the thread that calls log_step (first in the list)
    frames: Annotated[list[FrameModel], Field(max_length=limits.MAX_HANG_FRAMES)]


class HangModel(_Wire):
    kind: Literal["hang"]
    run_id: RunId
    step: Step  # the last step the rank completed
    time: Time
    rank: Rank = 0
    attempt: AttemptToken | None = None
    stuck_seconds: Duration
    limit_seconds: Annotated[Duration, Field(gt=0)] | None = None
    phase: Literal["data", "forward", "backward", "optimizer", "eval", "checkpoint",
                   "unknown"] = "unknown"
    phase_seconds: Seconds = None
    threads: Annotated[list[ThreadModel], Field(max_length=limits.MAX_HANG_THREADS)] = Field(
        default_factory=list)
    threads_omitted: Annotated[int, Field(ge=0, le=2**31, strict=True)] = 0
    nccl_trace: Annotated[str, AfterValidator(_error_text)] | None = None

    @model_validator(mode="after")
    def _stack_budget(self) -> HangModel:
        size = limits.stack_bytes(self.threads)
        if size > limits.MAX_HANG_STACK_BYTES:
            raise ValueError(f"threads: {size} bytes of stacks exceed the budget of "
                             f"{limits.MAX_HANG_STACK_BYTES} per hang record")
        return self


class AgreementModel(_Wire):
    # A rank held the job's action back (docs/format.md, "agreement"): at an agreed call it
    # lacked the action, or held another content under its id, so no rank acted.
    kind: Literal["agreement"]
    run_id: RunId
    step: Step  # the rank's last step
    time: Time
    rank: Rank = 0
    attempt: AttemptToken | None = None
    action_id: Annotated[int, Field(ge=1, le=2**62, strict=True)]
    action: Literal["rollback", "stop"]
    # ``unreported``: no rank of the job reported the checkpoint a rollback plan names.
    outcome: Literal["missing", "mismatch", "unreported"]
    rounds: Annotated[int, Field(ge=1, le=2**31, strict=True)] = 1
    check_every: Annotated[int, Field(ge=1, le=1_000_000, strict=True)] | None = None
    detail: Annotated[str, AfterValidator(_error_text)] | None = None


RecordModel = Annotated[
    RunModel | StepModel | EvalModel | EndModel | CheckpointModel | HangModel | AgreementModel,
    Field(discriminator="kind"),
]
WireRecord = (RunModel | StepModel | EvalModel | EndModel | CheckpointModel | HangModel
              | AgreementModel)
TOP_FIELDS: dict[str, frozenset[str]] = {
    kind: frozenset(model.model_fields) for kind, model in (
        ("run", RunModel), ("step", StepModel), ("eval", EvalModel), ("end", EndModel),
        ("checkpoint", CheckpointModel), ("hang", HangModel),
        ("agreement", AgreementModel))}
"""Each kind's top-level fields. Read once: pydantic builds ``model_fields`` on each
access (microseconds), and ingest asks for every record (``verbatim``, ``_own_scalars``)."""
_RECORD: TypeAdapter[WireRecord] = TypeAdapter(RecordModel)


def explain(exc: ValidationError) -> str:
    """One line per problem, naming the field: what a client needs to fix its record."""
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        # Keys are client data: short and printable in our answer, whatever they hold.
        loc = ".".join(limits.safe(str(p)) for p in err["loc"][1:]
                       if p not in ("function-after",))
        loc = loc or str(err["loc"][0]) if err["loc"] else "record"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    if more > 0:
        parts.append(f"(+{more} more)")
    return "; ".join(parts)


def validate(obj: Any) -> WireRecord:
    """Validate one wire object; raise RecordError with a field-naming reason."""
    if not isinstance(obj, dict):
        raise RecordError(f"a record must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("kind")
    if kind not in t.RECORD_TYPES:
        raise RecordError(f"kind: must be one of {', '.join(t.RECORD_TYPES)} (got {kind!r})")
    try:
        return _RECORD.validate_python(obj)
    except ValidationError as exc:
        raise RecordError(explain(exc)) from None


def check_arrival(model: WireRecord, arrival: float) -> None:
    """RecordError when the record's ``time`` is further ahead of ``arrival`` (the
    sidecar's clock) than clocks can be apart (``limits.check_time``)."""
    try:
        limits.check_time(model.time, arrival)
    except ValueError as exc:
        raise RecordError(str(exc)) from None


def to_record(model: WireRecord) -> t.Record:
    """The internal dataclass of a validated record."""
    return t.from_wire(model)


def stored_json(model: WireRecord) -> bytes:
    """The JSON the store keeps for a record: only the fields docs/format.md defines (unknown
    ones are never stored), nulls left out, NaN/Inf as strings."""
    return model.model_dump_json(exclude_none=True).encode()


def parse_record(obj: Any) -> t.Record:
    """Validate one wire object and convert it to the internal dataclass."""
    return to_record(validate(obj))


def parse_for_store(obj: Any) -> tuple[t.Record, bytes]:
    """Validate one wire object; return its internal record and the JSON to store for it."""
    model = validate(obj)
    return to_record(model), stored_json(model)
