"""``/v1/alerts`` and ``/v1/silences``: what fires, what is muted, who owns it.

``GET /v1/alerts?state=firing`` lists the firing alerts, newest first, each with how its
latest notification went per channel, a page at a time (``next`` links the following one);
``GET /v1/silences`` the silences in force (``include_expired=true``: all), newest first, a
page at a time as well. ``POST /v1/silences`` mutes the alerts matching its
body for ``duration_seconds`` (``DELETE /v1/silences/{id}`` ends it early), and
``POST /v1/alerts/{fingerprint}/ack`` with ``{"by": "ana"}`` stops an alert's reminders.
Writes need the bearer token when one is set (``Authorization: Bearer <token>``);
tests/alerting/test_alerts_api.py calls each route over real HTTP.

A silence names at least one matcher; a body without one is answered 422 with this reason::

    >>> silence = SilenceIn.model_validate_json(
    ...     '{"run_id": "gpt-7", "type": "loss_spike", "duration_seconds": 3600}')
    >>> silence.run_id, silence.type, silence.duration_seconds
    ('gpt-7', 'loss_spike', 3600.0)
    >>> try:
    ...     SilenceIn(duration_seconds=3600)
    ... except ValueError as exc:
    ...     print(exc.errors()[0]["msg"])
    Value error, a silence needs at least one of: run_id, type, alertname, layer
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, model_validator

from monitor_agent.alerting.silences import MATCHERS
from monitor_agent.api.deps import (
    AlertingDep,
    ReadSlotsDep,
    ServicesDep,
    require_read,
    require_write,
)
from monitor_agent.api.models import AlertOut, AlertsOut, SilenceOut, SilencesOut
from monitor_agent.api.streamed_page import Page, built_in_slot, streamed
from monitor_agent.records import wire

router = APIRouter(tags=["alerts"])
BEFORE = r"^[0-9.e+-]{1,40}:[0-9a-f]{1,64}$"  # STARTED_AT:FINGERPRINT, from a page's `next`
Text = Field(default="", max_length=1000)
Matcher = Field(default=None, min_length=1, max_length=256)


class SilenceIn(BaseModel):
    """Mute alerts matching every given field, for ``duration_seconds``."""

    model_config = ConfigDict(extra="forbid")

    run_id: str | None = Matcher
    type: str | None = Matcher
    alertname: str | None = Matcher
    layer: str | None = Matcher
    duration_seconds: float = Field(gt=0, le=90 * 86400, allow_inf_nan=False)
    comment: str = Text
    created_by: str = Field(default="", max_length=200)

    @model_validator(mode="after")
    def _some_matcher(self) -> SilenceIn:
        if not any(getattr(self, m) for m in MATCHERS):
            raise ValueError(f"a silence needs at least one of: {', '.join(MATCHERS)}")
        return self


class AckIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    by: str = Field(default="", max_length=200)


def _json(obj: Any, status: int = 200) -> Response:
    # wire.dumps: alert values may be NaN, which must stay valid JSON.
    return Response(wire.dumps(obj), status_code=status, media_type="application/json")


# Plain ``def`` handlers: alerting's calls are SQLite work, run in a worker thread.


@router.get("/v1/alerts", response_model=AlertsOut,
            summary="Alerts, newest first, a page at a time",
            dependencies=[Depends(require_read)])
async def list_alerts(
    alerting: AlertingDep,
    services: ServicesDep,
    slots: ReadSlotsDep,
    state: Literal["pending", "firing", "resolved", "silenced"] | None = Query(
        None, description="Only alerts in this state (silenced: firing under a silence)."),
    run_id: str | None = Query(None, max_length=256),
    limit: int = Query(1000, ge=1, le=10_000),
    before: str | None = Query(None, max_length=100, pattern=BEFORE, description=(
        "Continue after this alert (STARTED_AT:FINGERPRINT), as the previous page's `next` "
        "says.")),
) -> Response:
    start = None
    if before is not None:
        started, _, fingerprint = before.partition(":")
        try:
            start = (float(started), fingerprint)
        except ValueError:
            raise HTTPException(
                422, f"before: {started!r} is not a time; use the `next` link") from None

    def chunk(key: tuple[float, str] | None, max_rows: int,
              max_bytes: int) -> list[tuple[tuple[float, str], bytes]]:
        alerts = alerting.list_alerts(state=state, run_id=run_id, limit=max_rows, before=key)
        # Per channel, how the latest notification of each alert went: an undelivered page
        # is visible here (state "failed" with the receiver's answer), not only in a log.
        delivery = alerting.delivery_states() if alerts else {}
        out: list[tuple[tuple[float, str], bytes]] = []
        size = 0
        for a in alerts:
            body = wire.dumps({**a.to_dict(), "delivery": delivery.get(a.fingerprint, {})})
            if out and size + len(body) > max_bytes:
                break
            out.append(((a.started_at, a.fingerprint), body))
            size += len(body)
        return out

    async def fetch(key: Any, max_rows: int, max_bytes: int) -> Any:
        # The alert database has its own lock: read it in a worker, not on the event loop.
        return await run_in_threadpool(chunk, key, max_rows, max_bytes)

    def link(key: tuple[float, str]) -> str:
        params = [("limit", limit), *((("state", state),) if state else ()),
                  *((("run_id", run_id),) if run_id is not None else ()),
                  ("before", f"{key[0]!r}:{key[1]}")]
        return f"/v1/alerts?{urlencode(params)}"

    # A page at a time, written as it is read (api/streamed_page.py): up to 10 000 alerts,
    # each with its delivery, must not be built whole.
    page = Page(b'{"alerts":[', fetch, limit, services.settings.read_page_bytes, link)
    return await streamed(slots, page, start, "")


@router.post("/v1/alerts/{fingerprint}/ack", response_model=AlertOut,
             summary="Acknowledge an alert (no more reminders)",
             dependencies=[Depends(require_write)])
def acknowledge(fingerprint: str, alerting: AlertingDep, body: AckIn | None = None) -> Response:
    body = body or AckIn()
    view = alerting.acknowledge(fingerprint, by=body.by)
    if view is None:
        raise HTTPException(404, f"no alert with fingerprint {fingerprint!r}; see GET /v1/alerts")
    return _json(view.to_dict())


@router.post("/v1/silences", status_code=201, response_model=SilenceOut,
             summary="Silence alerts for a while", dependencies=[Depends(require_write)])
def add_silence(body: SilenceIn, alerting: AlertingDep) -> Response:
    matchers = {m: getattr(body, m) for m in MATCHERS}
    silence = alerting.add_silence(
        duration=body.duration_seconds, comment=body.comment, created_by=body.created_by,
        **matchers,
    )
    return _json(silence.to_dict(), status=201)


@router.get("/v1/silences", response_model=SilencesOut,
            summary="Silences (active only unless asked), newest first, a page at a time",
            dependencies=[Depends(require_read)])
def list_silences(
    alerting: AlertingDep, slots: ReadSlotsDep, include_expired: bool = False,
    limit: int = Query(1000, ge=1, le=10_000),
    before: str | None = Query(None, max_length=100, pattern=BEFORE, description=(
        "Continue after this silence (CREATED_AT:ID), as the previous page's `next` says.")),
) -> Response:
    start = None
    if before is not None:
        created, _, silence_id = before.partition(":")
        try:
            start = (float(created), silence_id)
        except ValueError:
            raise HTTPException(
                422, f"before: {created!r} is not a time; use the `next` link") from None

    def build() -> bytes:
        # Expired silences are kept: years of them must not be one answer (~1 KB each).
        found = alerting.silences_page(include_expired, start, limit)
        follows = None
        if len(found) == limit:
            last = found[-1]
            params = [("limit", limit), *((("include_expired", "true"),) if include_expired
                                          else ()), ("before", f"{last.created_at!r}:{last.id}")]
            follows = f"/v1/silences?{urlencode(params)}"
        return wire.dumps({"silences": [s.to_dict() for s in found], "next": follows})
    return built_in_slot(slots, build)


@router.delete("/v1/silences/{id}", status_code=204, summary="End a silence now",
               dependencies=[Depends(require_write)])
def expire_silence(id: str, alerting: AlertingDep) -> Response:
    if not alerting.expire_silence(id):
        raise HTTPException(404, f"no active silence {id!r}; see GET /v1/silences")
    return Response(status_code=204)
