"""eventually(): how a test waits for what another thread or process does.

A check is called until it passes: it returns without raising ``AssertionError`` (or one
of ``retry_on``) and its value is not a falsy one other than ``None``, so both a predicate
(``lambda: receiver.count() >= 2``) and an assertion block (a function that asserts and
returns nothing) work. A predicate whose "not yet" is ``None`` must say ``is not None``.
Anything else it raises ends the wait at once (a process that exited is no reason to
keep polling).

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
               what: str = "", retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``check`` until it passes and return its value; after ``timeout`` (scaled)
    seconds raise ``AssertionError`` naming ``what`` and the last failure."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    last: object = None
    while True:
        try:
            value = check()
        except (AssertionError, *retry_on) as exc:
            last = exc
        else:
            if value is None or value:
                return value
            last = f"the check returned {value!r}"
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{what or getattr(check, '__name__', 'condition')}: not so after {limit:g} s;"
                f" last: {last}") from (last if isinstance(last, BaseException) else None)
        time.sleep(interval)
