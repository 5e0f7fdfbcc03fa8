"""What the sidecar asks the trainer to do: ``stop`` or ``checkpoint`` (alert rule actions).

Actions arrive on the sender thread (in ingest answers, or from the poll endpoint) and are
read on the training thread, so this small inbox is the only place both touch: a lock,
a set of ids already seen (the same action may come both ways), a sticky stop and a
one-shot checkpoint request. Callbacks run on the sender thread: keep them short.

A rule's stop that arrives both ways (an ingest answer, then a poll) counts once, and stays::

    >>> inbox = ActionInbox()
    >>> stop = {"id": 1, "action": "stop", "step": 40, "rule": "StopOnNaN",
    ...         "message": "stop requested at step 40 by rule StopOnNaN"}
    >>> inbox.receive([stop])
    >>> inbox.receive([stop])
    >>> inbox.should_stop(), inbox.stop_reason, len(inbox.received())
    (True, 'stop requested at step 40 by rule StopOnNaN', 1)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

Callback = Callable[[dict[str, Any]], None]


class ActionInbox:
    """Thread-safe record of the actions received for one run.

    A callback sees each new action once (here on the calling thread; in a Monitor, on the
    sender thread); a checkpoint request is taken once::

        >>> inbox = ActionInbox()
        >>> inbox.add_callback(lambda a: print("monitor asks:", a["action"], "at", a["step"]))
        >>> inbox.receive([{"id": 7, "action": "checkpoint", "step": 120}])
        monitor asks: checkpoint at 120
        >>> inbox.take_checkpoint(), inbox.take_checkpoint(), inbox.last_id
        (True, False, 7)
    """

    def __init__(self, warn: Callable[[str, Exception], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._seen: set[int] = set()
        self._received: list[dict[str, Any]] = []
        self._stop: dict[str, Any] | None = None
        self._checkpoint = False
        self._callbacks: list[Callback] = []
        self._warn = warn or (lambda where, exc: None)

    @property
    def last_id(self) -> int:
        with self._lock:
            return max(self._seen, default=0)

    def add_callback(self, callback: Callback) -> None:
        with self._lock:
            self._callbacks.append(callback)

    def receive(self, actions: list[dict[str, Any]]) -> None:
        """Take actions from an ingest answer or a poll; duplicates are ignored."""
        fresh = [a for a in actions if self._admit(a)]
        for action in fresh:
            for callback in list(self._callbacks):
                try:
                    callback(dict(action))
                except Exception as exc:  # noqa: BLE001 - a user callback must not kill us
                    self._warn("action_callback", exc)

    def _admit(self, action: dict[str, Any]) -> bool:
        with self._lock:
            key = action.get("id")
            if not isinstance(key, int) or key in self._seen:
                return False
            self._seen.add(key)
            self._received.append(dict(action))
            if action.get("action") == "stop" and self._stop is None:
                self._stop = dict(action)
            elif action.get("action") == "checkpoint":
                self._checkpoint = True
            return True

    def should_stop(self) -> bool:
        """Sticky: once a rule asked the run to stop, this stays true."""
        with self._lock:
            return self._stop is not None

    def stop_action(self) -> dict[str, Any] | None:
        """The first stop a rule asked for, or None."""
        with self._lock:
            return dict(self._stop) if self._stop else None

    @property
    def stop_reason(self) -> str | None:
        with self._lock:
            return str(self._stop.get("message") or "stopped by monitor") if self._stop else None

    def take_checkpoint(self) -> bool:
        """True once per checkpoint request (the request is consumed)."""
        with self._lock:
            wanted, self._checkpoint = self._checkpoint, False
            return wanted

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._received)
