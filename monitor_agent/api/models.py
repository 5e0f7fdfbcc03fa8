"""Response models of the JSON API: what each route answers, as the OpenAPI page shows it.

An answer that is an internal view as it is (an alert, an action, a silence, a run's
listing line) is documented by a dataclass derived from that view: its fields and their
descriptions are written once, on the view, and FastAPI reads a dataclass as it reads a
model. ``_EVERY_KEY`` marks every field required, as the answer (``asdict``) always has
them; the derived classes have no docstring, which the page would show as a description.
A run's detail keeps a model of its own: it nests the view's findings, joins alerting's
alerts, leaves out the live-only keys of a run not in memory, and spells NaN as a string.

Routes whose answers may hold NaN/Inf answer with ``wire.dumps`` (docs/format.md spells
those values as strings) and declare the model only for the document: FastAPI does not
re-validate a returned ``Response``. ``Measured`` says so in the schema. Keys that a route
leaves out when unknown (a run not in memory has no ``ranks``) are optional here.

A route names its model in its decorator (``@router.get("/v1/silences",
response_model=SilencesOut)`` in api/alerts.py). What the page then shows of a derived
class: every key required, the view's descriptions, and a measured value that may be a
string::

    >>> from pydantic import TypeAdapter
    >>> schema = TypeAdapter(RunListingOut).json_schema(mode="serialization")
    >>> schema["required"]
    ['run_id', 'status', 'active', 'last_step', 'first_seen', 'last_seen', 'findings',
     'attempts', 'verdict', 'goodput']
    >>> schema["properties"]["active"]["description"]
    'In memory: records arrived within the run TTL.'
    >>> TypeAdapter(Measured).json_schema()["anyOf"]
    [{'type': 'number'}, {'enum': ['NaN', 'Infinity', '-Infinity'], 'type': 'string'},
     {'type': 'null'}]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    TypeAdapter,
    with_config,
)

from monitor_agent.alerting.alerts import AlertView
from monitor_agent.alerting.silences import Silence
from monitor_agent.reads.views import AttemptView, RunListing
from monitor_agent.records.actions import Action
from monitor_agent.runs.verdict import Verdict

NonFinite = Literal["NaN", "Infinity", "-Infinity"]
Measured = float | NonFinite | None
"""A measured value: a number, or a non-finite one spelled as docs/format.md says."""
Record = dict[str, Any]
"""A record as docs/format.md defines it (the ``RecordModel`` schemas of POST /v1/records)."""
_EVERY_KEY = ConfigDict(json_schema_serialization_defaults_required=True)


class HealthOut(BaseModel):
    status: Literal["ok"]


class ReadyOut(BaseModel):
    status: Literal["ready", "not ready"]
    reason: str | None = Field(default=None, description="Why not ready (only then).")


@with_config(_EVERY_KEY)
@dataclass(frozen=True, slots=True)
class RunListingOut(RunListing):
    pass


class RunsListOut(BaseModel):
    runs: list[RunListingOut] = Field(description="Oldest first.")
    next: str | None = Field(
        description="The following page's path and query; null once nothing follows.")


class FindingOut(BaseModel):
    """One finding of a detector (docs/format.md, "Findings")."""

    run_id: str
    type: str
    severity: str
    step: int
    rank: int
    layer: str | None
    value: Measured
    threshold: Measured
    message: str
    evidence: dict[str, Any]
    suggestions: list[str]
    time: float | None
    log_only: bool
    attempt: int = Field(default=1, description="The run's attempt whose record it judged.")


class FindingsOut(BaseModel):
    run_id: str
    findings: list[FindingOut] = Field(description="Newest first.")
    next: str | None = Field(
        description="The following page's path and query; null once nothing follows.")


class RecordsOut(BaseModel):
    run_id: str
    records: list[Record] = Field(description="Stored records, oldest step first.")
    next: str | None = Field(
        description="The following page's path and query; null once nothing follows.")


class RankOut(BaseModel):
    last_step: int
    steps_total: int
    tokens_total: float
    loss_ema: Measured
    latest: dict[str, Measured] = Field(description="The rank's last step's scalars.")
    val_loss: Measured
    eval_metrics: dict[str, Measured]
    progress_ratio: float | None = Field(default=None, description="When the run states its plan.")
    progress_basis: Literal["steps", "tokens"] | None = None
    eta_seconds: float | None = Field(default=None, description="While running, when known.")
    gpu: dict[str, Measured] | None = Field(
        default=None, description="The rank's GPU as its last step reported it (NVML: "
        "docs/format.md, gpu), when it sends one.")


class FindingTotals(BaseModel):
    by_type: dict[str, int] = Field(description="Every stored finding, counted by type.")
    recent: list[FindingOut] = Field(description="The 20 newest.")


class DeliveryOut(BaseModel):
    """How the latest notification of an alert on one channel went."""

    state: str = Field(description="pending, sent or failed.")
    attempts: int
    last_error: str | None
    done_at: float | None
    summarised: bool = Field(False, description=(
        "It went out in a summary of new runs' pages (notify/fairness.py), not alone; "
        "state, attempts and error are the summary's."))


@with_config(_EVERY_KEY)
@dataclass(frozen=True, slots=True)
class AlertOut(AlertView):
    pass


@with_config(_EVERY_KEY)
@dataclass(frozen=True, slots=True, kw_only=True)
class ListedAlertOut(AlertView):
    delivery: dict[str, DeliveryOut] = field(metadata={"description": "By channel."})


class AlertsOut(BaseModel):
    alerts: list[ListedAlertOut] = Field(description="Newest first.")
    next: str | None = Field(default=None, description=(
        "The following page (a link with `before=`); null once nothing follows."))


@with_config(_EVERY_KEY)
@dataclass(frozen=True, slots=True)
class AttemptOut(AttemptView):
    pass


class RunDetailOut(BaseModel):
    run_id: str
    status: str
    active: bool
    first_seen: float
    last_seen: float
    ended_at: float | None
    run: Record | None = Field(description="The run record, as sent.")
    findings: FindingTotals
    alerts: list[AlertOut]
    last_step: int | None = Field(default=None, description="The latest step (any rank).")
    ranks: dict[str, RankOut] | None = Field(default=None, description="By rank; live runs only.")
    attempts: list[AttemptOut] = Field(default_factory=list, description="Oldest first.")
    verdict: Verdict | None = Field(description=(
        "Healthy or unhealthy, with the cause and the step it began; null for a run stored "
        "before verdicts were."))
    phase: str = Field(default="running", description=(
        "Where the run is in its lifecycle (runs/lifecycle.py), as people read it: "
        "'running', 'awaiting resume from checkpoint step 300 (...), rollback 1 decided at "
        "step 345', 'waiting for relaunch from checkpoint step 300 (...)', 'stopping: ...', "
        "or how it ended."))
    leader: str | None = Field(default=None, description=(
        "In a multi-node run led by another sidecar: that sidecar's URL; null when this one "
        "judges the run."))


@with_config(_EVERY_KEY)
@dataclass(frozen=True, slots=True)
class ActionOut(Action):
    pass


class _DescribedAsActionOut:
    """The JSON Schema of ``ActionOut`` (its plan a nested model) for a field that holds
    an ``Action`` and writes it as ``Action.to_dict`` does."""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> Any:
        return handler(TypeAdapter(ActionOut).core_schema)


def _written(action: Action | dict[str, Any]) -> dict[str, Any]:
    # A route that hands FastAPI the model gets it dumped and validated again first: the
    # action is its JSON already by then.
    return action.to_dict() if isinstance(action, Action) else action


ActionWire = Annotated[Action, PlainValidator(lambda action: action),
                       PlainSerializer(_written), _DescribedAsActionOut()]
"""An action in an answer: the engine's own ``Action`` value, taken as it is (not validated
again), written as ``Action.to_dict`` writes it (the wire's shape, byte for byte: a plan's
absent keys stay absent), and described as ``ActionOut``."""


class CheckpointOut(BaseModel):
    step: int = Field(description="The optimizer step whose state the checkpoint holds.")
    path: str
    rank: int
    time: float | None
    attempt: str = Field(description="Which process saved it: a digest of its attempt token "
                         "('h-' and 16 hex digits; the token itself is a write capability "
                         "and no read shows it: records/tokens.py).")
    bytes: int | None
    tag: str | None
    data_position: int | None = Field(default=None, description=(
        "The data position its state resumes from (docs/format.md); null when not reported."))
    status: Literal["clean", "suspect"] = Field(description=(
        "suspect: a page-worthy fault began at or before its step and was in force there "
        "(runs/checkpoint_ledger.py)."))
    reason: str | None = Field(description="Why it is suspect; null when clean.")
    also: int | None = Field(default=None, description=(
        "Only in an answer thinned for a chart (`points=`): how many other checkpoints of "
        "its part of the range it stands for."))


class LastCleanOut(BaseModel):
    step: int
    path: str


class CheckpointsOut(BaseModel):
    run_id: str
    checkpoints: list[CheckpointOut] = Field(description="Oldest first, a page at a time.")
    last_clean: LastCleanOut | None = Field(description=(
        "The newest clean checkpoint (what a rollback goes back to); null when none."))
    next: str | None = Field(
        description="The following page's path and query; null once nothing follows.")


class IncidentOut(BaseModel):
    kind: str = Field(description="hang, restart or rollback.")
    step: int = Field(description="The last step before a hang; the step a restart or "
                      "rollback resumed at.")
    start: float = Field(description="Unix time it began.")
    seconds: float = Field(description="Wall-clock seconds it cost the run.")
    gpu_hours: float
    attempt: int
    open: bool = Field(description="Still going (a hang not recovered yet).")
    detail: dict[str, float] = Field(description="Its seconds by part (a hang's undetected "
                                     "and detected; a restart's gap, start-up, discarded).")
    words: str = Field(description='"this hang cost 14 min x 64 GPUs = 15 GPU-hours".')


class StragglerOut(BaseModel):
    seconds: float = Field(description="The tax: the other ranks' median summed all-reduce "
                           "wait less the straggler's (runs/straggler_tax.py).")
    rank: int = Field(description="The straggler: the rank that waited least.")
    node: str | None = Field(description="Its node (run record labels); null if unnamed.")
    who: str = Field(description='"rank 2 on gpu-1", or "node gpu-1 (ranks 2-3)" when the '
                     "whole node is slow.")
    parts: dict[str, float] = Field(description="The tax by what the straggler spends it "
                                    "on: data, compute, collective.")


class DeviceWordsOut(BaseModel):
    one: str = Field(description='"GPU", "CPU process", or "rank" when the run did not say.')
    many: str
    hours: str = Field(description='"GPU-hours", "process-hours" or "rank-hours".')


class GoodputAttemptOut(BaseModel):
    attempt: int
    start: float
    end: float
    wall_seconds: float
    productive_seconds: float
    badput_seconds: dict[str, float] = Field(description="Non-zero causes only.")
    straggler: StragglerOut | None = Field(
        default=None, description="This attempt's straggler tax and who caused it.")


class RecoveryOut(BaseModel):
    kind: str = Field(description="hang (a hang, and the relaunch that ended it) or restart "
                      "(a relaunch after a crash).")
    step: int = Field(description="The step before the failure.")
    start: float = Field(description="Unix time it began.")
    seconds: float = Field(description="Until the first step after it (the time to recover).")
    lost_seconds: float = Field(description="Work re-done after the relaunch.")
    open: bool = Field(description="Not recovered yet.")


class EttrOut(BaseModel):
    ettr: float | None = Field(description="Effective training time ratio: productive / wall "
                               "(the goodput ratio).")
    time_to_start_seconds: float | None = Field(
        description="The first attempt's start-up: its first record to its first step.")
    failures: int = Field(description="Hangs and relaunches after a crash (runs/ettr.py).")
    time_to_recover_seconds: list[RecoveryOut] = Field(description="Each failure, oldest first.")
    time_to_recover_p50_seconds: float | None
    time_to_recover_p99_seconds: float | None


class NodePriceOut(BaseModel):
    tax_seconds: float = Field(description="The straggler tax this node has cost the run so "
                               "far (the goodput ledger's, newest attempt).")
    tax_per_hour: float = Field(description="That tax over the run's wall time, per hour.")
    restart_seconds: float = Field(description="One restart of this job: the median of its "
                                   "measured recoveries (seconds to train again plus work "
                                   "re-done), else a stated default (300 s).")
    restart_measured: bool
    exclude_pays: bool = Field(description="Ski rental: the tax paid so far is at least one "
                               "restart's cost, so leaving the node out pays.")


class NodeVerdictOut(BaseModel):
    node: str = Field(description="The node (its ranks' run record node/hostname label).")
    ranks: list[int]
    state: Literal["healthy", "suspect", "sick"]
    cause: Literal["gone", "gpu-hardware", "sdc-suspect", "compute-slow", "network-slow",
                   "input-slow"] | None
    step: int | None = Field(description="The step of the evidence that set the state.")
    why: str
    words: str = Field(description='"node b: sick (compute-slow) at step 40: ...".')
    price: NodePriceOut | None = Field(description="Whether leaving it out pays; only for "
                                       "the node the straggler tax names.")


class NodesOut(BaseModel):
    run_id: str
    nodes: list[NodeVerdictOut] = Field(description="Each node of a run on two or more "
                                        "nodes (runs/node_verdict.py); empty on one node.")


class GoodputOut(BaseModel):
    run_id: str
    start: float | None
    end: float | None
    wall_seconds: float = Field(description="From the run's first record to its latest "
                                "(or now, while a hang is open); attempts whose clocks "
                                "overlap count each one's own time.")
    productive_seconds: float = Field(description="Steps kept in the current history.")
    goodput_ratio: float | None = Field(description="productive / wall; null before any time.")
    badput_seconds: dict[str, float] = Field(description=(
        "Seconds by cause (runs/goodput.py CAUSES); with productive they add up to wall."))
    badput_seconds_total: float
    gpus: int = Field(description="The ranks the run was seen stepping on (GPUs, or CPU "
                      "processes: device_words), not the world size it declares: GPU-hours "
                      "are seconds x gpus / 3600.")
    gpu_hours: float
    productive_gpu_hours: float
    badput_gpu_hours: dict[str, float]
    device: str | None = Field(default=None, description="The run records' hardware.device "
                               "(cuda or cpu); null when they did not say.")
    device_words: DeviceWordsOut = Field(description="What its ranks are called.")
    straggler: StragglerOut | None = Field(
        default=None, description="The newest attempt's straggler tax with a straggler, "
        "naming it (the straggler_* causes of badput_seconds hold every attempt's).")
    summary: str = Field(description='"goodput 93.1%: 4.2% restarts, 1.9% rollback, ...".')
    attempts: list[GoodputAttemptOut]
    incidents: list[IncidentOut] = Field(description="Oldest first (the newest 200).")
    ettr: EttrOut = Field(description="Meta's effective-training-time figures (runs/ettr.py).")


class NodeOut(BaseModel):
    sidecar: str = Field(description="This sidecar's id (what a run's leader names it by).")
    node_name: str = Field(description="This node's name as a drain names it (the "
                           "scheduler's; default the short hostname).")
    drained: bool = Field(description="A run's leader left this node out (cluster/drain.py).")
    mode: str = Field(description="cluster.drain.mode: none, slurm or command.")
    run_id: str | None = None
    action_id: int | None = None
    reason: str | None = Field(default=None, description="Why, as the scheduler records it.")
    at: float | None = Field(default=None, description="Unix time of the decision here.")
    outcome: str | None = Field(default=None, description="recorded (mode none), pending, "
                                "done, or failed: <why> (the drain command's result).")


class ActionsOut(BaseModel):
    run_id: str
    actions: list[ActionWire] = Field(description="Oldest first.")
    stop: bool = Field(description="Whether a stop was ever requested for the run.")
    last_id: int = Field(description="Poll again with after=last_id.")


@with_config(_EVERY_KEY)
@dataclass(frozen=True, slots=True)
class SilenceOut(Silence):
    pass


class SilencesOut(BaseModel):
    silences: list[SilenceOut] = Field(description="Newest first, a page at a time.")
    next: str | None = Field(description=(
        "The following page (a link with `before=`); null once nothing follows."))
