"""What every channel shares: the message it is given, the Notifier protocol, outcomes.

A notifier turns a ``Notification`` (the alerts of one run that changed together) into its
channel's payload, sends it with the httpx client it is handed, and classifies the answer:
``ok``, ``retry`` (with an optional Retry-After) or ``permanent``. It never retries or sleeps
itself; the outbox does that for every channel in one place.

A notification survives the outbox's JSON (NaN included), and a receiver that asks to
be called again later gets a ``retry`` with its Retry-After (here an ``httpx.MockTransport``
stands in for the receiver)::

    >>> event = AlertEvent("ab12", "gpt-7", "TrainingNanInf", "nan_inf", "critical", "firing",
    ...                    "loss is NaN", started_at=1000.0, step=300, value=float("nan"))
    >>> note = Notification("gpt-7", (event,), created_at=1001.0)
    >>> Notification.from_dict(wire.loads(wire.dumps(note.to_dict()))).events[0].value
    nan
    >>> busy = httpx.MockTransport(lambda req: httpx.Response(429, headers={"Retry-After": "7"}))
    >>> with httpx.Client(transport=busy) as client:
    ...     post_json(client, "https://hooks.example.com/t0k3n", note.to_dict(), timeout=5.0)
    Outcome(kind=<OutcomeKind.RETRY: 'retry'>, detail='HTTP 429: ', retry_after=7.0)
"""

from __future__ import annotations

import email.utils
import enum
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import httpx

from monitor_agent.records import wire


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """One alert as a channel shows it; ``status`` is firing, resolved or acknowledged.

    ``labels`` are the run's labels; ``identity`` the finding labels that are part of the
    fingerprint (layer, rank), the only ones a label-based receiver may key on.
    """

    fingerprint: str
    run_id: str
    alertname: str
    type: str
    severity: str
    status: str
    summary: str
    started_at: float
    reason: str = "first"
    project: str | None = None
    step: int | None = None
    layer: str | None = None
    rank: int | None = None
    value: float | None = None
    threshold: float | None = None
    suggestions: tuple[str, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    identity: dict[str, str] = field(default_factory=dict)
    count: int = 1
    ends_at: float | None = None
    dashboard_url: str | None = None
    acked_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["suggestions"] = list(self.suggestions)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AlertEvent:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["suggestions"] = tuple(known.get("suggestions") or ())
        # The outbox stores JSON with NaN spelled "NaN": turn the numbers back into floats.
        for key in ("value", "threshold"):
            known[key] = wire.nonfinite_to_float(known.get(key))
        return cls(**known)


@dataclass(frozen=True, slots=True)
class Notification:
    """The alerts of one run (``group``) that a channel should hear about together."""

    group: str
    events: tuple[AlertEvent, ...]
    created_at: float

    @property
    def status(self) -> str:
        """The events' common status: the service never mixes statuses in one message."""
        return self.events[0].status

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "created_at": self.created_at,
                "events": [e.to_dict() for e in self.events]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Notification:
        events = tuple(AlertEvent.from_dict(e) for e in d["events"])
        return cls(group=d["group"], events=events, created_at=d["created_at"])


class OutcomeKind(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    PERMANENT = "permanent"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a send went; ``detail`` is safe to log (it never holds a secret)."""

    kind: OutcomeKind
    detail: str = ""
    retry_after: float | None = None

    @classmethod
    def ok(cls, detail: str = "") -> Outcome:
        return cls(OutcomeKind.OK, detail)


class Notifier(Protocol):
    """One channel. ``grouped`` False means one message per alert (PagerDuty's dedup_key).

    The attributes are read-only here (properties), so a plain class attribute such as
    ``refresh_interval = None`` satisfies the protocol.
    """

    @property
    def name(self) -> str: ...
    @property
    def grouped(self) -> bool: ...
    @property
    def min_interval(self) -> float:
        """Seconds between two sends (Slack: about one message per second)."""
        ...
    @property
    def statuses(self) -> frozenset[str]:
        """Which event statuses the channel hears of (firing, resolved, acknowledged)."""
        ...
    @property
    def refresh_interval(self) -> float | None:
        """Re-send firing alerts this often (a channel that forgets them), or never."""
        ...

    def send(self, note: Notification, client: httpx.Client) -> Outcome: ...


def post_json(
    client: httpx.Client, url: str, payload: Any, timeout: float, headers: dict[str, str] | None = None
) -> Outcome:
    """POST JSON and classify; transport errors and timeouts are retryable."""
    # wire.dumps: NaN evidence must stay valid JSON ("NaN"), not a bare token receivers reject.
    all_headers = {"content-type": "application/json", **(headers or {})}
    try:
        response = client.post(url, content=wire.dumps(payload), timeout=timeout,
                               headers=all_headers)
    except httpx.TimeoutException as exc:
        return Outcome(OutcomeKind.RETRY, f"timeout ({type(exc).__name__})")
    except httpx.TransportError as exc:
        # The message may echo the URL, which can be a secret: keep only the type.
        return Outcome(OutcomeKind.RETRY, f"transport error ({type(exc).__name__})")
    return classify_http(response)


def classify_http(response: httpx.Response) -> Outcome:
    """2xx ok; 408, 429 and 5xx retryable (honouring Retry-After); other 4xx permanent."""
    code = response.status_code
    body = response.text[:200].replace("\n", " ")
    if 200 <= code < 300:
        return Outcome.ok(f"{code}")
    if code in (408, 429) or code >= 500:
        return Outcome(OutcomeKind.RETRY, f"HTTP {code}: {body}", retry_after_seconds(response))
    return Outcome(OutcomeKind.PERMANENT, f"HTTP {code}: {body}")


def retry_after_seconds(response: httpx.Response, now: float | None = None) -> float | None:
    """Retry-After as seconds: either delta-seconds or an HTTP date (RFC 9110)."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(when - (time.time() if now is None else now), 0.0)
