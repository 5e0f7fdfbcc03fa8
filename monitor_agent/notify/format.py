"""Plain-text wording of alerts, shared by every channel so they all say the same thing.

An alert gathers many findings; its headline, value and evidence all come from one of them
(the first until it is paged, the latest after), and the evidence says which, so a reader
never matches the numbers of one finding against the sentence of another. Two alerts of
one run, in one message::

    >>> nan = AlertEvent("ab12", "gpt-7", "TrainingNanInf", "nan_inf", "critical", "firing",
    ...                  "loss is NaN", 0.0, step=300, count=3, evidence={"loss": float("nan")})
    >>> boom = AlertEvent("cd34", "gpt-7", "TrainingGradExplosion", "grad_explosion", "error",
    ...                   "firing", "grad norm blew up", 0.0, step=300, value=4.2e6, threshold=2.31)
    >>> title(Notification("gpt-7", (nan, boom), created_at=1.0))
    '[FIRING:2] run gpt-7: TrainingNanInf, TrainingGradExplosion'
    >>> headline(nan)
    'CRITICAL TrainingNanInf (run gpt-7, step 300): loss is NaN'
    >>> evidence_line(nan)
    'evidence of the nan_inf finding at step 300 (3 findings in this alert): loss=NaN'
    >>> value_line(boom)
    'value 4.2e+06 (judged against 2.31)'
"""

from __future__ import annotations

import math
from typing import Any

from monitor_agent.notify.base import AlertEvent, Notification

_STATUS = {"firing": "FIRING", "resolved": "RESOLVED", "acknowledged": "ACKNOWLEDGED"}


def num(value: float | None) -> str:
    """A number as a person reads it: NaN and inf spelled out, 4 significant digits.

    Total on anything numeric a record carries, an int past float's range included (a
    message that cannot be worded is a page that is never sent)::

        >>> num(-0.0), num(1e308), num(10**400)
        ('-0', '1e+308', '>1.798e+308')
    """
    if value is None:
        return "-"
    try:
        value = float(value)
    except OverflowError:
        return f"{'<-' if value < 0 else '>'}1.798e+308"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def title(note: Notification) -> str:
    names = ", ".join(dict.fromkeys(e.alertname for e in note.events))
    return f"[{_STATUS.get(note.status, note.status.upper())}:{len(note.events)}] run {note.group}: {names}"


def where(event: AlertEvent) -> str:
    parts = [f"run {event.run_id}"]
    if event.step is not None:
        parts.append(f"step {event.step}")
    if event.layer:
        parts.append(f"layer {event.layer}")
    if event.rank:
        parts.append(f"rank {event.rank}")
    return ", ".join(parts)


def headline(event: AlertEvent) -> str:
    status = "" if event.status == "firing" else f"{_STATUS[event.status]} "
    return f"{status}{event.severity.upper()} {event.alertname} ({where(event)}): {event.summary}"


def value_line(event: AlertEvent) -> str | None:
    """``value 4.2e+06 (judged against 2.31)`` when the finding measured something.

    The reference is a limit for some detectors and a baseline for others, so it is not
    called either; the two numbers get enough digits to differ when they do.
    """
    if event.value is None and event.threshold is None:
        return None
    if event.threshold is None:
        return f"value {num(event.value)}"
    value, against = _distinct(event.value, event.threshold)
    return f"value {value} (judged against {against})"


def _distinct(a: float | None, b: float) -> tuple[str, str]:
    """Both numbers at 4 significant digits, or more when 4 would show them equal."""
    if a is None or not (math.isfinite(a) and math.isfinite(b)) or a == b:
        return num(a), num(b)
    for digits in (4, 6, 8, 12):
        left, right = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if left != right:
            return left, right
    return num(a), num(b)


def finding_ref(event: AlertEvent) -> str:
    """Which finding the numbers belong to: type, step, layer, and how many the alert has."""
    where_ = f" at step {event.step}" if event.step is not None else ""
    if event.layer:
        where_ += f", layer {event.layer}"
    count = f" ({event.count} findings in this alert)" if event.count > 1 else ""
    return f"the {event.type} finding{where_}{count}"


def evidence(event: AlertEvent) -> dict[str, Any]:
    """The evidence as a mapping that starts by naming its finding (NaN/inf spelled out)."""
    out: dict[str, Any] = {"finding": finding_ref(event)}
    out.update((k, num(v) if isinstance(v, float) else v) for k, v in event.evidence.items())
    return out


def evidence_line(event: AlertEvent) -> str | None:
    """``evidence of the <type> finding at step N: k=v, ...`` (None when there is none)."""
    items = [(k, v) for k, v in event.evidence.items() if k not in ("action", "checkpoint")]
    if not items:
        return None
    shown = ", ".join(f"{k}={num(v) if isinstance(v, float) else v}" for k, v in items[:12])
    return f"evidence of {finding_ref(event)}: {shown}"


def plain(note: Notification) -> str:
    """A multi-line text rendering (console, Slack's notification fallback)."""
    lines = [title(note)]
    for e in note.events:
        lines.append(f"- {headline(e)}")
        if (v := value_line(e)) is not None:
            lines.append(f"  {v}")
        if e.status == "firing" and (ev := evidence_line(e)) is not None:
            lines.append(f"  {ev}")
        if e.status == "firing" and e.suggestions:
            lines.append(f"  try: {e.suggestions[0]}")
        if e.dashboard_url:
            lines.append(f"  dashboard: {e.dashboard_url}")
    return "\n".join(lines)
