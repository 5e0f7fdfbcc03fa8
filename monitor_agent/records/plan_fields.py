"""The checks every field of an action's plan passes when it is parsed (records/actions.py,
records/rollback_plan.py): a plan arrives as JSON from a leader sidecar or from the alert
database, and a value out of range must fail the parse, never half-apply.

    >>> count(7), window([3, 5]), text("/c/1.pt")
    (7, (3, 5), '/c/1.pt')
    >>> window([5, 3])
    Traceback (most recent call last):
    ...
    ValueError: a window's last position comes after its first
"""

from __future__ import annotations

from typing import Any

__all__ = ["INT_MAX", "TEXT_MAX", "count", "text", "window"]

INT_MAX = 2**63 - 1
TEXT_MAX = 300  # hosts and reasons: they reach pages and the drain command's reason


def count(value: Any, limit: int = INT_MAX) -> int:
    """A JSON integer in 0..``limit`` (a bool is not one); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ValueError(f"expected a non-negative 64-bit integer, got {value!r:.40}")
    return value


def text(value: Any, limit: int = TEXT_MAX) -> str | None:
    """None, or a string of at most ``limit`` characters without control characters."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit or any(
            ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("expected a short string without control characters")
    return value


def window(value: Any, limit: int = INT_MAX) -> tuple[int, int]:
    """An inclusive ``[first, last]`` window of data positions (or steps)."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError("a window is [first, last]")
    first, last = count(value[0], limit), count(value[1], limit)
    if last < first:
        raise ValueError("a window's last position comes after its first")
    return first, last
