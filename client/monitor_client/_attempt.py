"""The one line a process prints when its run id already existed on the sidecar.

Every record carries this ``Monitor``'s attempt token (docs/format.md, ``attempt``), drawn
once per process. The sidecar answers each batch with the attempt of the run id that the
token's records went to (kind ``first``, ``resumed``, ``restarted``, or ``pending`` before
the first step). Reusing a run id is common and fine, so this is said once, as a warning on
the ``monitor_client`` logger, and only when the run id was not new: whether the sidecar
took this process for the same run continuing from a checkpoint or for a new run reusing
the id, and what it kept of the earlier attempts.

    >>> print(describe("gpt-exp-1", {"number": 2, "kind": "resumed", "start_step": 1200,
    ...                              "superseded_from": 1200, "superseded_to": 1500}))
    monitor_client: run gpt-exp-1 already exists on the sidecar; this is attempt 2 (resumed
    from step 1200; steps 1200-1500 of attempt 1 kept as abandoned)
    >>> print(describe("gpt-exp-1", {"number": 3, "kind": "restarted", "start_step": 1}))
    monitor_client: run gpt-exp-1 already exists on the sidecar; this is attempt 3 (a new run
    reusing the id; attempts 1-2 kept)
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from monitor_client._warn import LOGGER


def new_token() -> str:
    """A fresh attempt token: 64 random bits, as hex."""
    return secrets.token_hex(8)


def describe(run_id: str, attempt: dict[str, Any]) -> str:
    """The line for an attempt other than the first (see the module docstring)."""
    number = int(attempt["number"])
    earlier = "attempt 1" if number == 2 else f"attempts 1-{number - 1}"
    if attempt.get("kind") == "restarted":
        what = f"a new run reusing the id; {earlier} kept"
    else:
        start, lo, hi = (attempt.get(k) for k in ("start_step", "superseded_from",
                                                  "superseded_to"))
        replaced = (f"steps {lo}-{hi} of {earlier} kept as abandoned" if lo is not None
                    else f"no step of {earlier} replaced")
        what = f"resumed from step {start}; {replaced}"
    return (f"monitor_client: run {run_id} already exists on the sidecar; this is attempt "
            f"{number} ({what})")


class AttemptNotice:
    """Reads the ingest answers' ``attempts`` and says once what became of this process's
    records (sender thread)."""

    def __init__(self, run_id: str, token: str, logger: Any = LOGGER) -> None:
        self.run_id, self.token, self.logger = run_id, token, logger
        self.attempt: dict[str, Any] | None = None  # what the sidecar last said of ours
        self._said = False
        self._lock = threading.Lock()

    def receive(self, attempts: list[dict[str, Any]]) -> None:
        for attempt in attempts:
            if attempt.get("token") != self.token or attempt.get("run_id") != self.run_id:
                continue
            with self._lock:
                self.attempt = attempt
                if self._said or attempt.get("kind") in ("first", "pending"):
                    continue
                if not isinstance(attempt.get("number"), int):
                    continue
                self._said = True
            self.logger.warning(describe(self.run_id, attempt))
