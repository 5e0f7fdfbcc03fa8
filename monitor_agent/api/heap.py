"""Giving the memory a refused request used back to the system.

A request refused for its size (413) may have inflated up to ``max_decompressed_bytes``
and split or parsed lines before a budget stopped it. Python frees those objects at once,
but glibc's allocator keeps freed heap memory for reuse: once it has freed one large
block it raises its mmap threshold (up to 32 MiB), so later megabyte-sized buffers come
from the heap, and the heap is only trimmed when more than twice that is free at its top.
A 413 then leaves the process holding what the refused body cost, tens of MiB per attack
shape (``bench/chaos.py --sections amplification``, ``held MiB``). ``malloc_trim(0)``
returns the free pages at once; it costs a pass over the heap (well under a millisecond
here), paid only by refused requests. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def release_freed_memory() -> None:
    """Return the allocator's free heap pages to the system (glibc; elsewhere a no-op)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
