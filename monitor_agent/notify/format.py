"""Plain-text wording of alerts, shared by every channel so they all say the same thing.

Example::

    print(title(note))            # "[FIRING:2] run gpt-7: TrainingNanInf, TrainingGradExplosion"
    print(headline(note.events[0]))  # "CRITICAL TrainingNanInf in run gpt-7 at step 300: ..."
"""

from __future__ import annotations

import math

from monitor_agent.notify.base import AlertEvent, Notification

_STATUS = {"firing": "FIRING", "resolved": "RESOLVED", "acknowledged": "ACKNOWLEDGED"}


def num(value: float | None) -> str:
    """A number as a person reads it: NaN and inf spelled out, 4 significant digits."""
    if value is None:
        return "-"
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
    """``value 4.2e+06 vs baseline 2.31`` when the finding measured something."""
    if event.value is None and event.threshold is None:
        return None
    return f"value {num(event.value)} vs baseline {num(event.threshold)}"


def plain(note: Notification) -> str:
    """A multi-line text rendering (console, Slack's notification fallback)."""
    lines = [title(note)]
    for e in note.events:
        lines.append(f"- {headline(e)}")
        if (v := value_line(e)) is not None:
            lines.append(f"  {v}")
        if e.status == "firing" and e.suggestions:
            lines.append(f"  try: {e.suggestions[0]}")
        if e.dashboard_url:
            lines.append(f"  dashboard: {e.dashboard_url}")
    return "\n".join(lines)
