"""A positive sign that a sidecar's clock-driven work ran after a point of a test: its tick
counter (``monitor_agent_ticks_total`` on /metrics, counted as each engine tick ends) moved
on twice. A tick started after a write has seen it: its stall and hang checks, its alert
resolves and its prune pass are done. What a "nothing happened" check waits for, instead of
a sleep that a slow machine outlasts::

    _post(url, records)
    ticked(url)          # the ticks that would have found something have run
    assert findings(url) == []
"""

from __future__ import annotations

import httpx

from eventually import eventually

TICKS = "monitor_agent_ticks_total"


def ticks(url: str, headers: dict[str, str] | None = None) -> float:
    """The sidecar's tick count now."""
    text = httpx.get(url + "/metrics", headers=headers, timeout=30).text
    [line] = [ln for ln in text.splitlines() if ln.startswith(TICKS + " ")]
    return float(line.split()[1])


def ticked(url: str, n: int = 2, headers: dict[str, str] | None = None,
           timeout: float = 30.0) -> None:
    """Wait for ``n`` ticks to end from now (2: one that started before now may have read
    the state from before; the next began after it)."""
    start = ticks(url, headers)
    eventually(lambda: ticks(url, headers) >= start + n, timeout=timeout,
               what=f"{n} sidecar ticks after {start:g}")
