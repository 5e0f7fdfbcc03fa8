"""A finding as a node sidecar forwards it to its run's leader (``POST /v1/peer/digests``):
checked at the edge like a record, field by field.

A forwarded finding is paged, stored (a SQLite row: its type, layer, step and rank are
columns), counted on ``/metrics`` (its type is a label value) and acted on by the leader's
rules. So it obeys the records' rules (records/limits.py): every integer a 64-bit one
within its field's own range (a step as a record's step, a rank as a record's rank), every
string of bounded length and valid characters (its type a lower-case identifier, as every
detector's is; its layer a name; its message and suggestions free text), its evidence a
free-form map within the ``config`` budgets. One that breaks a rule is refused alone, with
a reason naming the field; it never reaches the store.

    >>> f = parse_finding({"type": "nan_inf", "severity": "critical", "run_id": "r",
    ...                    "step": 7, "rank": 2, "message": "loss is nan", "value": "NaN"})
    >>> f.type, f.severity.label, f.step, f.rank, f.value
    ('nan_inf', 'critical', 7, 2, nan)
    >>> parse_finding({"type": "nan_inf", "severity": "error", "run_id": "r", "step": 2**70,
    ...                "message": "m"})
    Traceback (most recent call last):
    monitor_agent.records.RecordError: step: Input should be less than or equal to 9007199254740992
    >>> parse_finding({"type": "nan\\ninf", "severity": "error", "run_id": "r", "step": 1,
    ...                "message": "m", "layer": ["a"]})
    Traceback (most recent call last):
    monitor_agent.records.RecordError: type: String should match pattern '^[a-z][a-z0-9_]*$'; layer: Input should be a valid string
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StringConstraints, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from monitor_agent.records import RecordError, limits
from monitor_agent.records.schemas import FreeForm, Num, Rank, RunId, Time, explain
from monitor_agent.records.types import Finding, Severity

MAX_SUGGESTIONS = 16
"""Suggestions one finding may carry (a detector gives a few; a page shows the first)."""

FindingType = Annotated[str, StringConstraints(min_length=1, max_length=64,
                                               pattern=r"^[a-z][a-z0-9_]*$")]
"""A detector's type (``nan_inf``, ``hang``): a label value and a rule's match key."""


def _name(value: str) -> str:
    return limits.check_text(value, limits.MAX_NAME_LEN, "layer")


def _text(value: str) -> str:
    return limits.check_text(value, limits.MAX_TEXT_LEN, "text", name=False)


def _evidence(value: dict[str, Any]) -> dict[str, Any]:
    return limits.check_freeform(value, "evidence")


Text = Annotated[str, AfterValidator(_text)]


class FindingModel(TypedDict, total=False):
    """The fields of ``Finding.to_dict``, each with its type and range."""

    type: FindingType
    severity: Literal["info", "warning", "error", "critical"]
    run_id: RunId
    # A finding about a run record has its step, -1; else a record's step.
    step: Annotated[int, Field(ge=-1, le=2**53, strict=True)]
    rank: Rank | None
    layer: Annotated[str, AfterValidator(_name)] | None
    value: Num
    threshold: Num
    message: Text
    evidence: Annotated[FreeForm, AfterValidator(_evidence)]
    suggestions: Annotated[list[Text], Field(max_length=MAX_SUGGESTIONS)]
    time: Time | None
    log_only: Annotated[bool, Field(strict=True)]
    attempt: Annotated[int, Field(ge=1, le=2**31, strict=True)]


_REQUIRED = ("type", "severity", "run_id", "step", "message")
_FINDING: TypeAdapter[FindingModel] = TypeAdapter(FindingModel)


def parse_finding(obj: Any) -> Finding:
    """Validate one forwarded finding; RecordError with a field-naming reason."""
    if not isinstance(obj, dict):
        raise RecordError(f"a finding must be a JSON object, got {type(obj).__name__}")
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise RecordError(f"{', '.join(missing)}: missing")
    try:
        d = _FINDING.validate_python(obj)
    except ValidationError as exc:
        raise RecordError(_explain(exc)) from None
    return Finding(
        type=d["type"], severity=Severity.parse(d["severity"]), run_id=d["run_id"],
        step=d["step"], message=d["message"], rank=d.get("rank") or 0,
        layer=d.get("layer"), value=d.get("value"), threshold=d.get("threshold"),
        evidence=d.get("evidence") or {}, suggestions=tuple(d.get("suggestions") or ()),
        time=d.get("time"), log_only=d.get("log_only", False), attempt=d.get("attempt", 1))


def _explain(exc: ValidationError) -> str:
    # A TypedDict's errors name the field first (a model's, after the model): shift.
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        loc = ".".join(limits.safe(str(p)) for p in err["loc"]
                       if p not in ("function-after", "constrained-str", "str"))
        parts.append(f"{loc or 'finding'}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts + ([f"(+{more} more)"] if more > 0 else []))


__all__ = ["FindingModel", "explain", "parse_finding"]
