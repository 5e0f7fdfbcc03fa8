"""``relaunched``: the job's launcher ran it again after a crash, with no person and no
action of the monitor's.

torchrun elastic restarts the worker group on its own when a rank's process dies (a
SIGKILL, the OOM killer, a segfault) while ``--max-restarts`` lasts, within seconds: long
before the ranks' silence could be judged a hang. The monitor then sees only the new
attempt of the run settle, resumed from a checkpoint, after an attempt that sent no end
record, or a failed one (pipeline/attempts.py; runs/lifecycle.py ``resume_kind`` "crash"),
of a job whose ranks said their launcher runs them again (the run record's ``launcher``:
a relaunch by hand is not this, and an older client says nothing). That is an
incident all the same, healed by the launcher: this finding says what happened and what
was done, once, so every incident has its page (its resolve says what it cost: the
relaunch's gap, start-up and the work re-done, runs/goodput.py).

A crash the ranks reported (a failed end record: the exception's ``crashed`` page) is
not paged again: that alert resolves with this message (alerting/episodes.py
``relaunched``), one incident, one page.

Not made when the relaunch carried out an action of the monitor's (a restart or a rollback
has its own page), nor for a relaunch that ended a hang (the hang's page is that
incident's): the engine asks the goodput ledger, whose recoveries pair a hang with the
relaunch that ended it (runs/ettr.py).

This detector judges nothing itself: like ``two_jobs``, it is listed in the catalogue so
that rules, settings and the format know its type, and ``finding`` builds what the engine
pages.

    >>> f = finding("gpt-7", attempt=2, start_step=401, last_step=437, gap=12.0)
    >>> print(f.message)
    the job's launcher relaunched it after a crash: attempt 1 stopped at step 437 with no end record (a rank's process died: killed, out of memory, or crashed), and attempt 2 resumed at step 401, 12 s later; no person acted
"""

from __future__ import annotations

from typing import Any

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.records.types import Finding, Record, Severity

RELAUNCHED = (
    "Find the rank that died: its node's kernel log (dmesg: the OOM killer, an XID), the "
    "scheduler's events, and the rank's own log's last lines.",
    "A crash that comes back on the same node is the node's: check its GPU (nvidia-smi -q, "
    "dcgmi diag) and memory.",
)


class RelaunchedDetector(DetectorBase[SharedSettings]):
    """Warning when the job's launcher relaunched it after a crash (module docstring)."""

    type = "relaunched"
    severity = Severity.WARNING
    settings_model = SharedSettings

    def update(self, record: Record) -> list[Finding]:
        return []  # the engine makes this finding: it alone sees attempts


def finding(run_id: str, attempt: int, start_step: int, last_step: int | None,
            gap: float | None, said_crash: bool = False, ended: str = "",
            evidence: dict[str, Any] | None = None) -> Finding:
    """The page: attempt ``attempt`` resumed at ``start_step`` after the attempt before it
    stopped at ``last_step`` with no end record (``said_crash``: with a failed one, its
    exception's, which the ``crashed`` page told), ``gap`` seconds before; ``ended``: how
    its ranks ended, which died without a word (runs/attempt_end.py), with its
    ``evidence`` (``gone_ranks``: the node verdict's, runs/node_verdict.py).

        >>> print(finding("gpt-7", 2, 401, 437, 12.0, said_crash=True).message)
        the job's launcher relaunched it after a crash: attempt 1 crashed at step 437, and attempt 2 resumed at step 401, 12 s later; no person acted
    """
    stopped = f" at step {last_step}" if last_step is not None else ""
    later = f", {gap:.0f} s later" if gap is not None else ""
    how = (f"crashed{stopped}" if said_crash else f"stopped{stopped} with no end record (a "
           "rank's process died: killed, out of memory, or crashed)")
    message = (f"the job's launcher relaunched it after a crash: attempt {attempt - 1} {how}, "
               f"and attempt {attempt} resumed at step {start_step}{later}; no person acted"
               + (f"; {ended}" if ended else ""))
    return Finding(type=RelaunchedDetector.type, severity=RelaunchedDetector.severity,
                   run_id=run_id, step=max(start_step, 0), message=message,
                   value=float(attempt), evidence={
                       "attempt": attempt, "start_step": start_step,
                       "stopped_at_step": last_step, "gap_seconds": gap,
                       **(evidence or {})},
                   suggestions=RELAUNCHED, attempt=attempt)
