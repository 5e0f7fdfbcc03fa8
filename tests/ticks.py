"""Positive signs that a sidecar has done what a test's writes set off, for a "nothing
happened" check to wait on instead of a sleep that a slow machine outlasts:

- ``ticked``: its tick counter (``monitor_agent_ticks_total`` on /metrics, counted as each
  engine tick ends) moved on twice. A tick started after a write has seen it: its stall and
  hang checks, its alert resolves and group waits, its prune pass are done.
- ``settled``: that, and then its outbox holds nothing (``monitor_agent_outbox_pending``):
  every page made by then has been delivered or given up on (not for a test that leaves a
  summary of new runs' pages due a window later: wait on what it counts instead).

::

    _post(url, records)
    settled(url)         # what would have paged has paged
    assert slack.requests == []
"""

from __future__ import annotations

import httpx

from tests.eventually import eventually

TICKS = "monitor_agent_ticks_total"
PENDING = "monitor_agent_outbox_pending"


def sample(url: str, name: str, headers: dict[str, str] | None = None) -> float:
    """The value of the series ``name`` (with its labels, as exposed) on /metrics now."""
    text = httpx.get(url + "/metrics", headers=headers, timeout=30).text
    [line] = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[1])


def ticked(url: str, n: int = 2, headers: dict[str, str] | None = None,
           timeout: float = 30.0) -> None:
    """Wait for ``n`` ticks to end from now (2: one that started before now may have read
    the state from before; the next began after it)."""
    start = sample(url, TICKS, headers)
    eventually(lambda: sample(url, TICKS, headers) >= start + n, timeout=timeout,
               what=f"{n} sidecar ticks after {start:g}")


def settled(url: str, headers: dict[str, str] | None = None, timeout: float = 30.0) -> None:
    """Wait for two ticks, then for an empty outbox."""
    ticked(url, headers=headers, timeout=timeout)
    eventually(lambda: sample(url, PENDING, headers) == 0, timeout=timeout,
               what="an empty outbox")
