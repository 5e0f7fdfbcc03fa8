"""What the incident a resolving alert was about cost its run, in its goodput ledger's
words (runs/goodput.py): the engine hands it to alerting (``AlertSink.cost_with``)."""

from __future__ import annotations

from monitor_agent.pipeline.registry import RunRegistry
from monitor_agent.runs.ettr import ettr_of, recovery_words
from monitor_agent.runs.goodput import STRAGGLER_CAUSES, cost_words


def incident_cost(registry: RunRegistry, run_id: str, kind: str, step: int,
                  rolled_back: bool) -> str | None:
    """What the incident a resolving alert was about cost its run (runs/goodput.py):
    a hang (``hang``, ``stalled``), the straggler tax so far, or the rollback or
    restart that closed an alert about the steps it abandoned. None for the rest."""
    live = registry.get(run_id)
    if live is None:
        return None
    book = live.state.goodput
    if rolled_back:
        inc = book.last_incident("rollback", "restart")
        if inc is None:
            return None
        if inc.kind == "restart":  # a relaunch: the failure it ended, start to end
            report = book.report()
            found = ettr_of({"incidents": report.incidents}, None).recoveries
            if found and found[-1].start <= inc.start:
                return recovery_words(found[-1], book.gpus, book.device)
        return inc.words(book.gpus, book.device) + " so far"
    if kind in ("hang", "stalled"):
        inc = book.last_incident("hang")
        if inc is None or inc.step < step - 1:
            return None
        return inc.words(book.gpus, book.device)
    if kind == "straggler":
        bad = book.report().badput
        tax = sum(bad[cause] for cause in STRAGGLER_CAUSES)
        return (f"the straggler tax so far: {cost_words(tax, book.gpus, book.device)}"
                if tax > 0 else None)
    return None
