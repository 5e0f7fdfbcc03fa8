"""``POST /v1/peer/digests``: a node sidecar's exchange with the leader of its runs.

One run, one brain (monitor_agent/cluster): the sidecar of each node of a multi-node run
forwards the digests of its ranks' records and its detectors' findings here, to the
sidecar of node 0, which judges the run across ranks, pages for the whole run and decides
its actions. The body (JSON, usually gzip)::

    {"sidecar": "<the node sidecar's id>",
     "runs": [{"run_id": "gpt-7", "node": 1, "host": "gpu-node-1", "ranks": [2, 3],
               "known_action": 0}],
     "records": [<digests: records less their per-layer payload, docs/format.md>],
     "findings": [{"flags": 0, "finding": {<a finding as GET /v1/runs/{id}/findings>}}],
     "links": [{"address": "10.0.0.3", "rtt_ms": 0.4, "rttvar_ms": 0.2, "connections": 2,
                "retransmits": 0, "bytes": 180000, "sending_ms": 12.5}]}

``links`` (optional: a new sample of the node's host, cluster/tcp_probe.py) is what its
own connections measure to each remote address, at most ``MAX_PEERS`` of them; a node's
figures only ever describe its own connections (the leader takes it as the node at the
address the exchange comes from) and name others only by address. A malformed one is
refused with the whole exchange (400, saying which field): a node sidecar of this version
never sends one.

The door takes the leader link's own credential (``cluster.peer_token``), not the write
token, and checks what it takes as ``POST /v1/records`` does (docs/hostile-input.md,
"Every door checks the same things"): each digest is validated and admitted as any record
(schema, arrival time, rank, step, the writer of a checkpoint, a hang's rank, an
agreement's action), each finding field by field (records/finding_schema.py); one bad item
costs only itself (``rejected``, ``rejected_findings``), and a body whose every item is bad
is a 422. Only runs this sidecar leads, from a node of the run's placement, are taken
(pipeline/engine.py ``Engine.ingest_peer``): the items of any other run are left with the
node sidecar (``deferred``, with why), which sends them again and pages them itself if
this never changes. The answer says, per run led here, the actions this leader took after
``known_action`` (the node sidecar keeps them for its ranks), and this sidecar's id (a
node sidecar that reaches itself stops forwarding).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import time
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from monitor_agent.api.body import (
    BODY_ERRORS,
    RETRY_AFTER_S,
    BadRequest,
    check_values,
    count_values,
    gunzip,
    parse_json,
    read_limited,
)
from monitor_agent.api.deps import require_peer, services
from monitor_agent.api.record_batch import (
    Rejection,
    reason_label,
    sorted_rejections,
    validate_records,
)
from monitor_agent.cluster.tcp_probe import MAX_PEERS, PeerLink
from monitor_agent.pipeline.engine import Incoming, PeerBatch, PeerRun
from monitor_agent.pipeline.runner import FIRST
from monitor_agent.records import RecordError, limits
from monitor_agent.records.finding_schema import parse_finding
from monitor_agent.records.schemas import RunId
from monitor_agent.records.types import Finding
from monitor_agent.storage.database import StorageError

router = APIRouter(tags=["peer"])

MAX_RUNS = 10_000
MAX_RANKS_LISTED = 100_000
_RUN_ID: TypeAdapter[str] = TypeAdapter(RunId)


class LinkIn(BaseModel):
    """What a node's connections to one remote address measure (cluster/tcp_probe.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    address: str = Field(max_length=64)
    rtt_ms: float = Field(ge=0, le=600_000, allow_inf_nan=False)
    rttvar_ms: float = Field(ge=0, le=600_000, allow_inf_nan=False)
    connections: int = Field(ge=1, le=1_000_000)
    retransmits: int = Field(ge=0, le=2**53)
    bytes: int = Field(default=0, ge=0, le=2**62)
    sending_ms: float = Field(default=0.0, ge=0, le=600_000, allow_inf_nan=False)

    @field_validator("address")
    @classmethod
    def _ip(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError("not an IP address") from None


_LINKS: TypeAdapter[list[LinkIn]] = TypeAdapter(list[LinkIn])


class PeerRunOut(BaseModel):
    actions: list[dict[str, Any]] = Field(
        default_factory=list, description="Actions this leader took for the run after the "
        "node sidecar's known_action, oldest first (GET /v1/runs/{id}/actions' items).")


class PeerResponse(BaseModel):
    sidecar: str = Field(description="This sidecar's id (cluster/identity.py).")
    accepted: int = Field(description="Digests stored now.")
    duplicates: int = Field(description="Digests already stored (a retry).")
    findings: int = Field(description="Findings taken (paged here for the whole run).")
    rejected: list[Rejection] = Field(
        default_factory=list, description="Digests refused for good (index into records).")
    rejected_findings: list[Rejection] = Field(
        default_factory=list, description="Findings refused for good (index into findings).")
    deferred: dict[str, str] = Field(
        default_factory=dict, description="Runs whose items were not taken, and why: this "
        "sidecar does not lead the run (yet), or the node is not one of its placement. The "
        "node sidecar keeps them and sends them again.")
    runs: dict[str, PeerRunOut] = Field(default_factory=dict)


@router.post(
    "/v1/peer/digests", response_model=PeerResponse, dependencies=[Depends(require_peer)],
    summary="A node sidecar forwards its ranks' digests and findings to the run's leader",
    responses={**BODY_ERRORS, 503: {"description": "Cannot store right now; retry later"}},
)
async def post_digests(request: Request) -> Response:
    state = services(request)
    try:
        answer = await _exchange(request)
        # Serialised here, the model's own JSON (the answer the route documents): handed
        # the model, FastAPI validates it against response_model again first, on the event
        # loop, for each of a hundred exchanges a second at a leader of 128 nodes.
        return Response(answer.model_dump_json(), media_type="application/json")
    except BadRequest as exc:
        status, reason = exc.status, exc.reason
    state.metrics.rejections.labels(reason=reason_label(status)).inc()
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    raise HTTPException(status, reason, headers=headers)


async def _exchange(request: Request) -> PeerResponse:
    state = services(request)
    settings = state.settings
    if not state.readiness.ready:
        raise BadRequest(503, f"not ready: {state.readiness.why_not}; retry later")
    body = await read_limited(request, settings.max_body_bytes)
    envelope, valid, rejected = await run_in_threadpool(
        _decode_and_validate, body, request.headers.get("content-encoding", "identity"),
        settings)
    del body
    runs, sidecar = _runs(envelope), _text(envelope.get("sidecar"), "sidecar", 64)
    nodes = {r.run_id: r.node for r in runs}
    items: list[Incoming] = []  # each marked with its node by the engine (peer_exchange.py)
    for item in valid:
        if item.record.run_id not in nodes:
            rejected.append({"index": item.index, "reason": "run_id: not one of the runs "
                             "this exchange names (runs[].run_id)"})
            continue
        items.append(item)
    findings, bad = _findings(envelope.get("findings"), set(nodes))
    batch = PeerBatch(sidecar, items, findings, runs,
                      address=request.client.host if request.client else None,
                      links=_links(envelope.get("links")))
    m = state.metrics.peer_items
    m.labels(kind="digest").inc(len(items))
    m.labels(kind="finding").inc(len(findings))
    m.labels(kind="heartbeat").inc()
    sent = len(envelope.get("records") or []) + len(envelope.get("findings") or [])
    if sent and len(rejected) + len(bad) == sent:  # every item refused for good: 422
        what, first = ("record", rejected[0]) if rejected else ("finding", bad[0])
        more = f" (and {sent - 1} more)" if sent > 1 else ""
        raise BadRequest(422, f"nothing taken: {what} {first['index']}: {first['reason']}"
                              f"{more}")
    try:
        # First (pipeline/runner.py): a node that waits past its peer timeout for this
        # answer pages on its own, as a partial view, and its ranks' steps reach the
        # run's judgement late; the leader's own ranks' batches can wait a call.
        result = await state.runner.call(state.engine.ingest_peer, batch, time.time(),
                                         lane=FIRST)
    except StorageError as exc:
        state.readiness.failed(exc)
        raise BadRequest(503, f"cannot store right now ({exc}); retry later") from None
    rejected.extend(result.rejected)
    bad.extend(result.rejected_findings)
    answer = {}
    for run in runs:
        if run.run_id in result.deferred:
            continue
        # Usually nothing new: known without a query (and a worker thread) per exchange.
        found = [] if state.alerting.no_actions_after(run.run_id, run.known) else \
            await run_in_threadpool(state.alerting.actions_for_run, run.run_id, run.known, 100)
        answer[run.run_id] = PeerRunOut(actions=[a.to_dict() for a in found])
    return PeerResponse(sidecar=state.sidecar, accepted=result.accepted,
                        duplicates=result.duplicates, findings=result.taken,
                        rejected=sorted_rejections(rejected),
                        rejected_findings=sorted_rejections(bad),
                        deferred=result.deferred, runs=answer)


@dataclasses.dataclass(frozen=True, slots=True)
class _Run(PeerRun):
    known: int = 0


def _decode_and_validate(body: bytes, encoding: str, settings: Any
                         ) -> tuple[dict[str, Any], list[Incoming], list[dict[str, Any]]]:
    """The envelope, its valid records and the rejections of the others: one worker
    thread hop per exchange. The same validation as ``POST /v1/records``."""
    envelope = _decode(body, encoding, settings)
    del body
    records = envelope.get("records") or []
    if not isinstance(records, list):
        raise BadRequest(400, "records: must be a list of records")
    valid, rejected = validate_records(records, settings.max_record_bytes,
                                       arrival=time.time())
    return envelope, valid, rejected


def _decode(body: bytes, encoding: str, settings: Any) -> dict[str, Any]:
    encoding = encoding.strip().lower()
    if encoding == "gzip":
        body = b"".join(gunzip(body, settings.max_decompressed_bytes))
    elif encoding not in ("", "identity"):
        raise BadRequest(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
    check_values(count_values(body), settings.max_values_per_request)
    obj = parse_json(body, "body")
    if not isinstance(obj, dict):
        raise BadRequest(400, 'body must be {"sidecar": ..., "runs": [...], "records": [...], '
                              '"findings": [...]}')
    return obj


def _text(value: Any, what: str, size: int) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= size:
        raise BadRequest(400, f"{what}: must be a string of 1-{size} characters")
    try:
        return limits.check_text(value, size, what)
    except ValueError as exc:
        raise BadRequest(400, str(exc)) from None


def _int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(400, f"{what}: must be an integer in {low}..{high}")
    return value


def _runs(envelope: dict[str, Any]) -> list[_Run]:
    """The runs the node sidecar follows (its heartbeat), each with its node and ranks."""
    raw = envelope.get("runs")
    if not isinstance(raw, list) or len(raw) > MAX_RUNS:
        raise BadRequest(400, f"runs: must be a list of at most {MAX_RUNS} runs")
    out, listed = [], 0
    for i, r in enumerate(raw):
        if not isinstance(r, dict):
            raise BadRequest(400, f"runs[{i}]: must be an object")
        ranks = r.get("ranks") or []
        if not isinstance(ranks, list):
            raise BadRequest(400, f"runs[{i}].ranks: must be a list")
        listed += len(ranks)
        if listed > MAX_RANKS_LISTED:
            raise BadRequest(413, f"runs: more than {MAX_RANKS_LISTED} ranks listed")
        host = r.get("host")
        run_id = r.get("run_id")
        try:
            run_id = _RUN_ID.validate_python(run_id)
        except ValidationError:
            raise BadRequest(400, f"runs[{i}].run_id: not a run id (docs/format.md)") from None
        out.append(_Run(
            run_id=run_id,
            node=_int(r.get("node"), f"runs[{i}].node", -1, 1_000_000),
            host=None if host is None else _text(host, f"runs[{i}].host", limits.MAX_NAME_LEN),
            ranks=tuple(_int(x, f"runs[{i}].ranks", 0, 1_000_000) for x in ranks),
            known=_int(r.get("known_action", 0), f"runs[{i}].known_action", 0, 2**62)))
    return out


def _links(raw: Any) -> tuple[PeerLink, ...] | None:
    """The node's TCP figures (module docstring), each field bounded; 400 saying which is
    not."""
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) > MAX_PEERS:
        raise BadRequest(400, f"links: must be a list of at most {MAX_PEERS} addresses")
    try:
        links = _LINKS.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequest(400, f"links[{where}]: {first['msg']}") from None
    if len({link.address for link in links}) != len(links):
        raise BadRequest(400, "links: an address listed twice")
    return tuple(PeerLink(link.address, link.rtt_ms, link.rttvar_ms, link.connections,
                          link.retransmits, link.bytes, link.sending_ms) for link in links)


def _findings(raw: Any, runs: set[str]
              ) -> tuple[list[tuple[Finding, int]], list[dict[str, Any]]]:
    """The node sidecar's findings, each validated field by field
    (records/finding_schema.py) and of a run the exchange names; and the rejections of
    the others (one bad finding costs only itself, as a bad record does)."""
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        raise BadRequest(400, "findings: must be a list")
    out, bad = [], []
    for i, item in enumerate(raw):
        try:
            if not isinstance(item, dict):
                raise RecordError("must be {\"flags\": N, \"finding\": {...}}")
            flags = item.get("flags", 0)
            if isinstance(flags, bool) or not isinstance(flags, int) or not 0 <= flags <= 255:
                raise RecordError("flags: must be an integer in 0..255")
            finding = parse_finding(item.get("finding"))
            if finding.run_id not in runs:
                raise RecordError("run_id: not one of the runs this exchange names")
        except RecordError as exc:
            bad.append({"index": i, "reason": str(exc)})
            continue
        out.append((finding, flags))
    return out, bad
