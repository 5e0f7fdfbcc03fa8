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
from collections.abc import Collection
from typing import Any

from monitor_agent.notify.base import AlertEvent, Notification
from monitor_agent.records import wire

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


# -- what fits a channel ------------------------------------------------------------------
#
# Each channel has documented limits (PagerDuty: 512 KB an event, a 1024-character summary;
# Slack: 3000 characters a section, 150 a header; see each notifier), and an alert's text and
# evidence have none of their own: a hang of 256 ranks stuck in distinct frames names every
# rank (~200 KB of message, ~1 MB of per-rank table). A payload over its channel's limit is
# refused, and a refused page is a lost page. So what does not fit is cut, by one rule that
# keeps the culprit: every message here names the rank or layer it is about first, and the
# evidence keeps, in order, what is small (which finding, the action, the checkpoint), the
# entries about the alert's own rank and layer, then the others in their order while they
# fit; what was cut is said (``cut``), and the whole finding stays in
# ``GET /v1/runs/{id}/findings``.

SMALL_BYTES = 512
"""An evidence item of at most this much JSON is kept whole before any large one is cut."""


def cut_text(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its start and how much was cut
    (the start: each message names its culprit first)::

        >>> cut_text("rank 3 stuck in train.py:load; rank 7 stuck in ...", 40)
        'rank 3 stuck in train.py:lo… [+23 chars]'
        >>> len(cut_text("x" * 10_000, 3000)) <= 3000
        True
    """
    if len(text) <= limit:
        return text
    room = limit - len(f"… [+{len(text)} chars]")
    if room <= 0:
        return text[:limit]
    return f"{text[:room]}… [+{len(text) - room} chars]"


def culprit(event: AlertEvent) -> tuple[str, ...]:
    """The evidence keys that are about the alert's own rank and layer (a per-rank or
    per-layer table's entry for them)."""
    return tuple(k for k in (None if event.rank is None else str(event.rank), event.layer)
                 if k)


def fit_evidence(evidence: dict[str, Any], budget: int, about: Collection[str] = (),
                 whole: str = "") -> dict[str, Any]:
    """``evidence`` in at most ``budget`` bytes of JSON (``wire.dumps``), cut by the rule
    above: whole when it fits; else the small items, then each large one in an equal share
    of what is left: a table (a mapping) keeps its entries named in ``about`` first, then
    the others in order while they fit; a list its first items; a text its start. ``cut``
    says what was left out and, with ``whole``, where the whole of it is.

    A hang of 256 ranks, fitted into 4 KB, keeps rank 7's row (the odd one out)::

        >>> rows = {str(r): {"state": "hung", "stuck_in": f"f{r}.py:wait", "nccl_trace": "x" * 400}
        ...         for r in range(256)}
        >>> ev = {"hung_ranks": list(range(256)), "stuck_in": "f7.py:wait", "ranks": rows}
        >>> fitted = fit_evidence(ev, 4096, about=("7",), whole="GET /v1/runs/g/findings")
        >>> len(wire.dumps(fitted)) <= 4096, list(fitted["ranks"]), len(fitted["hung_ranks"])
        (True, ['7', '0', '1', '2', '3', '4'], 256)
        >>> fitted["cut"]
        'to fit the channel: ranks: 6 of 256 entries; the whole evidence: GET /v1/runs/g/findings'
    """
    if _size(evidence) <= budget:
        return evidence
    cuts: list[str] = []
    tail = f"; the whole evidence: {whole}" if whole else ""
    # The braces, and the note with its key: at most 200 characters name what was cut.
    room = budget - 2 - _size("cut") - 2 - _size("to fit the channel: " + "x" * 220 + tail)
    kept: dict[str, Any] = {}
    large = []
    for key, value in evidence.items():
        size = _size(key) + _size(value) + 2
        if _size(value) > SMALL_BYTES:
            large.append((key, value))
        elif size <= room:
            kept[key], room = value, room - size
        else:
            cuts.append(f"{key}: left out")
    for i, (key, value) in enumerate(large):
        share = room // (len(large) - i) - _size(key) - 2
        part, said = _cut(value, share, about)
        if part is None:
            cuts.append(f"{key}: left out")
            continue
        kept[key], room = part, room - _size(key) - _size(part) - 2
        if said:
            cuts.append(f"{key}: {said}")
    out = {k: kept[k] for k in evidence if k in kept}
    out["cut"] = cut_text("to fit the channel: " + "; ".join(cuts), 220) + tail
    return out


def _cut(value: Any, room: int, about: Collection[str]) -> tuple[Any, str]:
    """``value`` in at most ``room`` bytes of JSON and what was cut ("" nothing); None
    when not even a start of it fits."""
    if _size(value) <= room:
        return value, ""
    if isinstance(value, str):
        text = value
        while text and _size(text) > room:  # characters may take several bytes each
            text = cut_text(value, max(min(len(text) - 1, room * len(text) // _size(text)), 0))
        return (text, f"{len(value) - len(text)} characters cut") if text else (None, "")
    if isinstance(value, dict):
        first = [k for k in value if str(k) in about]
        out: dict[Any, Any] = {}
        room -= 2
        for key in first + [k for k in value if str(k) not in about]:
            size = _size(str(key)) + _size(value[key]) + 2
            if size <= room:
                out[key], room = value[key], room - size
            elif key in first:  # the culprit's own entry: its start, rather than nothing
                part, _ = _cut(value[key], room - _size(str(key)) - 2, ())
                if part is not None:
                    out[key], room = part, room - _size(str(key)) - _size(part) - 2
            else:
                break
        return (out, f"{len(out)} of {len(value)} entries") if out else (None, "")
    if isinstance(value, list | tuple):
        items: list[Any] = []
        room -= 2
        for item in value:
            size = _size(item) + 1
            if size > room:
                break
            items.append(item)
            room -= size
        return (items, f"first {len(items)} of {len(value)} items") if items else (None, "")
    return None, ""


def _size(value: Any) -> int:
    return len(wire.dumps(value))
