"""Response models of the JSON API: what each route answers, as the OpenAPI page shows it.

Routes whose answers may hold NaN/Inf answer with ``wire.dumps`` (docs/format.md spells
those values as strings) and declare the model only for the document: FastAPI does not
re-validate a returned ``Response``. ``Measured`` says so in the schema. Keys that a route
leaves out when unknown (a run not in memory has no ``ranks``) are optional here.

Example::

    @router.get("/v1/silences", response_model=SilencesOut)
    def list_silences(alerting: AlertingDep) -> Response: ...
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

NonFinite = Literal["NaN", "Infinity", "-Infinity"]
Measured = float | NonFinite | None
"""A measured value: a number, or a non-finite one spelled as docs/format.md says."""
Record = dict[str, Any]
"""A record as docs/format.md defines it (the ``RecordModel`` schemas of POST /v1/records)."""


class HealthOut(BaseModel):
    status: Literal["ok"]


class ReadyOut(BaseModel):
    status: Literal["ready", "not ready"]
    reason: str | None = Field(default=None, description="Why not ready (only then).")


class RunListingOut(BaseModel):
    run_id: str
    status: str = Field(description="running, or how the run ended.")
    active: bool = Field(description="In memory: records arrived within the run TTL.")
    last_step: int | None = Field(description="Live runs only.")
    first_seen: float
    last_seen: float
    findings: int | None = Field(description="Findings since the run was loaded; live only.")


class RunsListOut(BaseModel):
    runs: list[RunListingOut]


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


class FindingsOut(BaseModel):
    run_id: str
    findings: list[FindingOut] = Field(description="Newest first.")


class RecordsOut(BaseModel):
    run_id: str
    records: list[Record] = Field(description="Stored records, oldest step first.")


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


class FindingTotals(BaseModel):
    by_type: dict[str, int] = Field(description="Every stored finding, counted by type.")
    recent: list[FindingOut] = Field(description="The 20 newest.")


class DeliveryOut(BaseModel):
    """How the latest notification of an alert on one channel went."""

    state: str = Field(description="pending, sent or failed.")
    attempts: int
    last_error: str | None
    done_at: float | None


class AlertOut(BaseModel):
    fingerprint: str
    run_id: str
    project: str | None
    rank: int | None
    alertname: str
    type: str
    severity: str
    layer: str | None
    summary: str
    suggestion: str | None
    state: Literal["pending", "firing", "resolved"]
    silenced: bool
    started_at: float
    last_seen: float
    last_step: int | None
    count: int
    resolved_at: float | None
    acked_by: str | None
    acked_at: float | None
    dashboard_url: str | None
    action: str | None = Field(description="What a rule asked of the run, if anything.")


class ListedAlertOut(AlertOut):
    delivery: dict[str, DeliveryOut] = Field(description="By channel.")


class AlertsOut(BaseModel):
    alerts: list[ListedAlertOut] = Field(description="Newest first.")


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
    last_step: int | None = Field(default=None, description="Live runs only.")
    ranks: dict[str, RankOut] | None = Field(default=None, description="By rank; live runs only.")


class ActionOut(BaseModel):
    id: int
    run_id: str
    action: str = Field(description="stop or checkpoint.")
    rule: str
    type: str
    step: int = Field(description="Step of the finding that triggered it.")
    message: str
    created_at: float
    honoured_step: int | None = Field(description="stop: the step the trainer stopped at.")


class ActionsOut(BaseModel):
    run_id: str
    actions: list[ActionOut] = Field(description="Oldest first.")
    stop: bool = Field(description="Whether a stop was ever requested for the run.")
    last_id: int = Field(description="Poll again with after=last_id.")


class SilenceOut(BaseModel):
    id: str
    comment: str
    created_by: str
    created_at: float
    ends_at: float
    run_id: str | None
    type: str | None
    alertname: str | None
    layer: str | None


class SilencesOut(BaseModel):
    silences: list[SilenceOut]
