"""eventually(): how a test waits for what another thread or process does.

A check is called until it passes: it returns without raising ``AssertionError`` (or one
of ``retry_on``), with a truthy value. A lambda is a predicate (``lambda: receiver.count()
>= 2``; ``lambda: d.get(k)``'s ``None`` is "not yet", never a pass); a named function may
also be an assertion block, which passes by returning nothing. Anything else a check
raises ends the wait at once (a process that exited is no reason to keep polling).

Every timeout is multiplied by ``MONITOR_TEST_TIME_SCALE`` (default 1): a slow or shared
CI box sets 3 rather than each test growing its own margin. Timeouts are there to stop a
hung test, never to assert speed; a number users care about belongs in ``bench/``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TIME_SCALE = float(os.environ.get("MONITOR_TEST_TIME_SCALE", "1") or 1)


def scaled(seconds: float) -> float:
    """``seconds`` on this box: what a wait that is not a check (a process's own exit
    timeout, a socket's) should be given."""
    return seconds * TIME_SCALE


def eventually(check: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
               what: str = "", retry_on: tuple[type[BaseException], ...] = (),
               context: Callable[[], str] | None = None) -> T:
    """Call ``check`` until it passes and return its value; after ``timeout`` (scaled)
    seconds raise ``AssertionError`` naming ``what`` and the last failure, followed by
    ``context()`` (the logs of the processes involved, say)."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    retried: tuple[type[BaseException], ...] = (AssertionError, *retry_on)
    last: object = None
    while True:
        try:
            value = check()
        except retried as exc:
            last = exc
        else:
            if value or (value is None and getattr(check, "__name__", "") != "<lambda>"):
                return value
            last = f"the check returned {value!r}"
        if time.monotonic() >= deadline:
            message = (f"{what or getattr(check, '__name__', 'condition')}: not so after "
                       f"{limit:g} s; last: {last}")
            if context is not None:
                message += "\n" + context()
            raise AssertionError(message) from (last if isinstance(last, BaseException) else None)
        time.sleep(interval)
