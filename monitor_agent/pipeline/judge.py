"""The judge stage: what a record's findings mean for its run before anyone is paged. The
checkpoint ledger judges its saves by them (a page names the checkpoint judged with it),
which may revise the pending rollback; an agreement record may refuse that plan; the
run's verdict folds them in (and its row keeps it)."""

from __future__ import annotations

from monitor_agent.pipeline.batch import IngestResult
from monitor_agent.pipeline.consequences import Consequences
from monitor_agent.pipeline.registry import LiveRun
from monitor_agent.records.types import AgreementRecord, Finding, Record


class Judge:
    """Folds a record's findings into the run's ledger, plan and verdict."""

    def __init__(self, consequences: Consequences) -> None:
        self.consequences = consequences

    def judge(self, live: LiveRun, record: Record, findings: list[Finding], now: float,
              result: IngestResult, decides: bool) -> None:
        """``decides``: the record is judged anew, so its findings may revise or refuse
        the run's plan (False while a rebuilt run's records are fed again: they did,
        when they first came)."""
        run = live.state
        judged = False
        for f in findings:
            if run.ledger.observe(f):
                run.changed()
                judged = True
        if judged and decides:
            self.consequences.revise_pending(live, now, result)
        if isinstance(record, AgreementRecord) and decides and run.leader is None:
            self.consequences.plan_refused(live, record, now, result)
        if run.verdict.observe(record, findings):
            self.consequences.store_verdict(run)
