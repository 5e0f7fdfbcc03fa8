"""``AlertSink``: the one seam between the engine and alerting.

The engine hands findings to a sink and knows nothing else of rules, silences or channels.
``Alerting`` is the real one; ``NullSink`` stands in where nothing should page (a bare
the trace judge, tests of the pipeline alone), so the engine never checks for ``None``.

The engine is given one (``Engine(settings, store, metrics, alerts=alerting)``; without
``alerts`` it uses a ``NullSink``) and calls it with each record's findings::

    >>> from monitor_agent.records.types import Severity
    >>> sink: AlertSink = NullSink()
    >>> nan = Finding("nan_inf", Severity.CRITICAL, "gpt-7", step=300, message="loss is NaN")
    >>> sink.handle(RunContext("gpt-7"), [nan], now=1000.0)   # no actions taken
    []
    >>> sink.preview(RunContext("gpt-7"), [nan], now=1000.0)  # no alert begun
    0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from monitor_agent.alerting.alerts import RunContext
from monitor_agent.records.actions import Action
from monitor_agent.records.types import Finding

if TYPE_CHECKING:
    from monitor_agent.alerting.episodes import Costs


class AlertSink(Protocol):
    """What the engine calls, on its own thread, as records and ticks go by."""

    def handle(self, run: RunContext, findings: list[Finding], now: float,
               told: bool = False, closed: bool = False) -> list[Action]:
        """One record's findings; returns the actions rules took (for the ingest answer).
        ``told``: people were paged about them already (a node sidecar did, while this one,
        the run's leader, was away): recorded as firing, not paged again, no action;
        ``closed``: that sidecar told their resolve too (its run ended meanwhile)."""
        ...

    def preview(self, run: RunContext, findings: list[Finding], now: float) -> int:
        """Findings of a record sent ahead of its turn; returns how many alerts began."""
        ...

    def run_ended(self, run_id: str, status: str, now: float, step: int | None = None,
                  verdict: str | None = None) -> None:
        """The run's end record arrived (``step``: where a stopped run stopped; ``verdict``:
        how it ended, e.g. "unhealthy: NaN since step 300", runs/verdict.py)."""
        ...

    def tick(self, now: float) -> None:
        """Clock-driven work: resolves, repeats, re-sends."""
        ...

    def attempt_settled(self, run_id: str, start_step: int, now: float,
                        started: float | None = None) -> None:
        """A new attempt of the run resumed (or restarted) at ``start_step``: a pending
        rollback whose window begins at or after it was applied, and a pending restart
        decided before the attempt began (``started``) carried out."""
        ...

    def relaunched(self, run_id: str, said: str, start_step: int, now: float) -> bool:
        """The job's launcher ran it again after a crash its ranks reported (``said``:
        what was done, detectors/relaunched.py): the run's open ``crashed`` alerts resolve
        saying so (one incident, one page); whether there was one."""
        ...

    def open_actions(self, run_id: str) -> list[Action]:
        """The run's actions not yet honoured (a pending rollback, an open stop) and its
        applied rollbacks (``honoured_step`` set), oldest first: what its lifecycle resumes
        from when the run loads (runs/lifecycle.py)."""
        ...

    def took_action(self, run_id: str, action_id: int, action: str) -> bool:
        """Whether this sidecar decided the run's action ``action_id`` as ``action`` (an
        ``agreement`` record is about one: records/types.py ``AgreementRecord``)."""
        ...

    def cost_with(self, costs: Costs) -> None:
        """Say what each resolving incident cost the run (alerting/episodes.py ``Costs``)."""
        ...

    def waiting(self, run_id: str) -> bool:
        """Whether a rollback of the run waits for a rank that reports checkpoints to reach
        the fault's onset (alerting/rollback.py ``behind``)."""
        ...

    def retry(self, run: RunContext, now: float) -> list[Action]:
        """Decide such a rollback once the ranks caught up or the wait is over; the actions
        taken."""
        ...

    def revise(self, run: RunContext, now: float) -> list[Action]:
        """Withdraw a pending rollback whose checkpoint is no longer among ``run``'s clean
        ones and decide it again (alerting/episodes.py ``revise``); the actions taken."""
        ...

    def refused(self, run: RunContext, action_id: int, now: float) -> list[Action]:
        """Withdraw pending rollback ``action_id``, which the job refused to load, for a
        stop (alerting/episodes.py ``refused``); the actions taken."""
        ...


class NullSink:
    """A sink that pages nobody: findings are still stored and counted by the engine."""

    def handle(self, run: RunContext, findings: list[Finding], now: float,
               told: bool = False, closed: bool = False) -> list[Action]:
        return []

    def preview(self, run: RunContext, findings: list[Finding], now: float) -> int:
        return 0

    def run_ended(self, run_id: str, status: str, now: float, step: int | None = None,
                  verdict: str | None = None) -> None:
        return None

    def tick(self, now: float) -> None:
        return None

    def attempt_settled(self, run_id: str, start_step: int, now: float,
                        started: float | None = None) -> None:
        return None

    def cost_with(self, costs: Costs) -> None:
        pass

    def relaunched(self, run_id: str, said: str, start_step: int, now: float) -> bool:
        return False

    def waiting(self, run_id: str) -> bool:
        return False

    def retry(self, run: RunContext, now: float) -> list[Action]:
        return []

    def revise(self, run: RunContext, now: float) -> list[Action]:
        return []

    def refused(self, run: RunContext, action_id: int, now: float) -> list[Action]:
        return []

    def open_actions(self, run_id: str) -> list[Action]:
        return []

    def took_action(self, run_id: str, action_id: int, action: str) -> bool:
        return True  # it decides nothing, so it cannot tell (a trace judged offline)
