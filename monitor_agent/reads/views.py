"""What the API shows of a run: plain, immutable copies made on the engine thread.

Live run state is written by the engine thread only (pipeline/runner.py); an HTTP handler
that read it on the event loop could see a rank half-updated. So the read side
(``reads/queries.py``'s ``RunQueries``) builds these views on that thread, from the
store's row and the run in memory, and hands back copies that nothing mutates afterwards.
The API's and the UI's answers derive from these views (``api/models.py``,
``api/runs_page.py``): ``metadata={"description": ...}`` is what /openapi.json says of a field.
``reads/queries.py`` shows them built from a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from monitor_agent.records import tokens, wire
from monitor_agent.records.types import Severity
from monitor_agent.runs.progress import run_progress
from monitor_agent.runs.run_state import RankState, RunState
from monitor_agent.runs.verdict import Rollback, Verdict
from monitor_agent.storage.store import StoredAttempt, StoredRun

GOODPUT = ("Productive training time / wall-clock time since the run started "
           "(GET /v1/runs/{id}/goodput, runs/goodput.py); null before any time is measured.")

# The scalars of a rank's latest step that GET /v1/runs/{id} shows, in this order.
LATEST = (
    "loss", "lr", "grad_norm", "clip_threshold", "param_norm", "update_norm", "update_ratio",
    "tokens_per_second", "mfu", "loss_scale", "step_time", "data_time",
)


@dataclass(frozen=True, slots=True)
class RunListing:
    """One line of ``GET /v1/runs``: the same fields whether the run is in memory or not
    (a stored run's from the store: its current history's latest step, its findings)."""

    run_id: str
    status: str = field(metadata={"description": "running, or how the run ended."})
    active: bool = field(
        metadata={"description": "In memory: records arrived within the run TTL."})
    last_step: int | None = field(
        metadata={"description": "The latest step of the run's current history; null "
                                 "before its first step."})
    first_seen: float
    last_seen: float
    findings: int | None = field(metadata={"description": "Stored findings of the run."})
    attempts: int = field(default=1, metadata={
        "description": "Attempts of the run id (pipeline/attempts.py): 1 unless a process "
                       "reused it."})
    verdict: Verdict | None = field(default=None, metadata={"description": (
        "Healthy or unhealthy, with the cause and the step it began (runs/verdict.py); "
        "null for a run stored before verdicts were.")})
    goodput: float | None = field(default=None, metadata={"description": GOODPUT})


@dataclass(frozen=True, slots=True)
class AttemptView:
    """One attempt of a run id (``GET /v1/runs/{id}``; pipeline/attempts.py)."""

    number: int
    kind: str = field(metadata={"description": "first, resumed, restarted, or pending."})
    start_step: int | None
    started_at: float
    superseded_from: int | None = field(metadata={
        "description": "First step of the earlier history it replaced (kept, abandoned)."})
    superseded_to: int | None
    first_step: int | None = field(metadata={"description": "Of its own step records."})
    last_step: int | None
    steps: int = field(metadata={"description": "Its step records, replaced ones included."})
    current: bool = field(metadata={"description": "The latest attempt."})
    why: str | None = field(default=None, metadata={"description": (
        "For a resumed attempt of a run in memory: 'rollback' (it applied a rollback plan), "
        "'crash' (the process before it died or failed) or 'resume' (after a clean end); "
        "runs/lifecycle.py resume_kind.")})


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One line of the runs page: a live run's progress, the stored worst finding."""

    run_id: str
    project: str | None
    status: str
    active: bool
    last_step: int | None
    progress: float | None
    eta_seconds: float | None
    findings: int
    worst_finding: str | None
    last_seen: float
    verdict: Verdict | None
    goodput: float | None = field(metadata={"description": GOODPUT})


@dataclass(frozen=True, slots=True)
class RunDetail:
    """``GET /v1/runs/{id}`` but its alerts (alerting answers those, off the engine thread).

    ``last_step`` and ``ranks`` are None when the run is not in memory; ``ranks`` maps the
    rank (as a string, as JSON keys are) to ``rank_view``'s dict.
    """

    run_id: str
    status: str
    active: bool
    first_seen: float
    last_seen: float
    ended_at: float | None
    run: dict[str, Any] | None
    finding_counts: dict[str, int]
    recent_findings: list[dict[str, Any]]
    last_step: int | None
    ranks: dict[str, dict[str, Any]] | None
    verdict: Verdict | None
    attempts: list[AttemptView] = field(default_factory=list)
    phase: str = field(default="running", metadata={"description": (
        "Where the run is in its lifecycle (runs/lifecycle.py), as people read it: "
        "'running', 'awaiting resume from checkpoint step 300 (...), rollback 1 decided at "
        "step 345', 'stopping: ...', or how it ended.")})
    leader: str | None = field(default=None, metadata={"description": (
        "In a multi-node run whose leader is another sidecar (this one forwards its ranks' "
        "digests there): that sidecar's URL, where the run's pages and actions are decided. "
        "Null when this sidecar judges the run (alone or as its leader).")})


def verdict_of(row: StoredRun, live: RunState | None) -> Verdict | None:
    """The live run's verdict as of now, else the one stored on its row."""
    if live is not None:
        return live.judged()
    return Verdict.from_json(row.verdict)


def listing(row: StoredRun, live: RunState | None, stored_last_step: int | None,
            findings: int, attempts: int, goodput: float | None = None) -> RunListing:
    """``stored_last_step``: the store's, used when the run is not in memory; ``goodput``:
    the run's goodput ratio (``RunQueries.goodput_ratio``)."""
    return RunListing(
        run_id=row.run_id,
        status=live.status if live else row.status,
        active=live is not None,
        last_step=_last_step(live, stored_last_step),
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        findings=findings,
        attempts=attempts,
        verdict=verdict_of(row, live),
        goodput=goodput,
    )


def attempt_views(attempts: list[StoredAttempt],
                  rollbacks: Sequence[Rollback] = ()) -> list[AttemptView]:
    """The run's attempts; ``rollbacks``: the verdict's account of its resumes (what each
    resumed attempt was), for a run in memory."""
    latest = attempts[-1].number if attempts else 0
    why = {r.to_step + 1: r.kind for r in rollbacks}
    return [AttemptView(
        number=a.number, kind=a.kind, start_step=a.start_step, started_at=a.started_at,
        superseded_from=a.superseded_from, superseded_to=a.superseded_to,
        first_step=a.first_step, last_step=a.last_step, steps=a.steps,
        current=a.number == latest,
        why=why.get(a.start_step) if a.kind == "resumed" and a.start_step is not None
        else None) for a in attempts]


def _last_step(live: RunState | None, stored: int | None) -> int | None:
    if live is not None and live.last_step >= 0:
        return live.last_step
    return stored


def summary(row: StoredRun, live: RunState | None, severities: dict[str, int],
            stored_last_step: int | None, goodput: float | None = None) -> RunSummary:
    """``severities``: stored finding counts by severity; ``stored_last_step``: rank 0's
    last stored step, shown when the run is not in memory; ``goodput``: the run's goodput
    ratio (``RunQueries.goodput_ratio``)."""
    progress = None
    if live is not None and live.ranks:
        progress = run_progress(live, live.ranks[min(live.ranks)])
    return RunSummary(
        run_id=row.run_id, project=_project(live, row),
        status=live.status if live else row.status, active=live is not None,
        last_step=live.last_step if live is not None else stored_last_step,
        progress=progress.ratio if progress else None,
        eta_seconds=progress.eta_seconds if progress else None,
        findings=sum(severities.values()),
        worst_finding=max(severities, key=Severity.parse, default=None),
        last_seen=row.last_seen,
        verdict=verdict_of(row, live),
        goodput=goodput,
    )


def detail(row: StoredRun, live: RunState | None, finding_counts: dict[str, int],
           recent: list[bytes], stored_last_step: int | None = None,
           attempts: list[AttemptView] | None = None) -> RunDetail:
    ranks = None
    if live is not None:
        ranks = {str(r): rank_view(live, s) for r, s in sorted(live.ranks.items())}
    return RunDetail(
        run_id=row.run_id,
        status=live.status if live else row.status,
        active=live is not None,
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        ended_at=row.ended_at,
        # A run record's attempt token is a write capability: shown as its digest.
        run=tokens.redact_obj(wire.loads(row.run_record)) if row.run_record else None,
        finding_counts=finding_counts,
        recent_findings=[wire.loads(b) for b in recent],
        last_step=_last_step(live, stored_last_step),
        ranks=ranks,
        verdict=verdict_of(row, live),
        attempts=attempts or [],
        phase=live.phase if live is not None else row.status,
        leader=live.leader if live is not None else None,
    )


def rank_view(run: RunState, state: RankState) -> dict[str, Any]:
    """A rank's counters, latest values and eval, and progress (keys only when known)."""
    rec, ev = state.last, state.last_eval
    latest = {k: getattr(rec, k) for k in LATEST} if rec is not None else {}
    if rec is not None:  # of the latest step with an update norm, not only the last step
        latest["effective_lr"] = state.last_effective_lr
    view: dict[str, Any] = {
        "last_step": state.last_step,
        "steps_total": state.steps_total,
        "tokens_total": state.tokens_total,
        "loss_ema": state.loss_ema,
        "latest": latest,
        "val_loss": ev.val_loss if ev else None,
        "eval_metrics": dict(ev.metrics) if ev else {},
    }
    if rec is not None and rec.gpu:  # the run page's GPU table (NVML, docs/format.md)
        view["gpu"] = dict(rec.gpu)
    found = run_progress(run, state)
    if found is not None:
        view["progress_ratio"], view["progress_basis"] = found.ratio, found.basis
        if found.eta_seconds is not None:
            view["eta_seconds"] = found.eta_seconds
    return view


def _project(live: RunState | None, row: StoredRun) -> str | None:
    if live is not None:
        return live.project or None
    if row.run_record:
        rec = wire.loads(row.run_record)
        return (rec.get("labels") or {}).get("project") or (rec.get("config") or {}).get(
            "project")
    return None
