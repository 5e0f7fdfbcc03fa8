"""What one record may carry: the budgets and the one rule for every string at the edge.

A single small request must not be able to hold memory, fill the disk or break an answer
for everyone: one sidecar serves every run, and a buggy or hostile client can send anything.
So every free-form or repeated part of a record has a budget, and every string that can
reach a Prometheus label, a stored column or a JSON answer obeys one rule, whatever field
it arrives in:

- valid Unicode (no lone UTF-16 surrogates: they cannot be encoded as UTF-8, so the first
  JSON answer or exposition that touches them fails);
- no control characters in names and label values (the exposition format and the people
  reading it); free text keeps tab and newline;
- a length limit (256 characters for names and labels, like the ``labels`` map).

And one rule for every integer: it fits a signed 64-bit integer (``MIN_INT`` ..
``MAX_INT``). That is what every consumer can hold: SQLite's INTEGER (a bigger one raises
OverflowError on insert), orjson (refuses past 64 bits when it writes an answer or sizes a
section) and a float conversion (a 401-digit integer overflows one). Typed fields have
narrower bounds of their own (``schemas.Step``, ``schemas.Rank``); the free-form maps
(config, model, hardware) are held to this one in ``check_freeform``. An integer out of
range is refused, naming its field, not silently turned into a float or a string: the
client's author learns that a value they sent cannot round-trip, and no consumer ever
sees one.

Each rejection names the budget it hit, so a client author knows which knob they met.

A lone surrogate in a name, a free-form section within its budgets (returned as it is)
and one string over the free-text budget::

    >>> check_text("a\\ud800b", MAX_NAME_LEN, "config.project")
    Traceback (most recent call last):
    ValueError: config.project: contains a lone UTF-16 surrogate ('\\ud800') at 1
    >>> check_freeform({"lr": 0.1}, "config")
    {'lr': 0.1}
    >>> check_freeform({"note": "x" * 5000}, "config")
    Traceback (most recent call last):
    ValueError: config.note: 5000 characters exceed the budget of 4096
    >>> check_freeform({"opt": {"warmup_steps": 2**63}}, "config")
    Traceback (most recent call last):
    ValueError: config.opt.warmup_steps: integer 9223372036854775808 is outside the signed 64-bit range (send it as a float or a string)
"""

from __future__ import annotations

import re
from typing import Any

import orjson

MAX_NAME_LEN = 256            # layer/metric names, label values, config.project
MAX_TEXT_LEN = 4096           # any other string (free-form values, end.error)
MAX_FREEFORM_ENTRIES = 1024   # keys of one map, or items of one list, in config/model/hardware
MAX_FREEFORM_BYTES = 64 * 1024  # one free-form section, as JSON
MAX_DEPTH = 32
MIN_INT, MAX_INT = -(2**63), 2**63 - 1  # SQLite INTEGER, orjson, float(): all hold these
# Numbers in all histograms of one record (edges + counts + quantiles, grad and param).
# The client's default (16 bins, 8 quantiles) is 41 per layer: 6,000 layers fit.
MAX_HIST_VALUES = 1 << 18
# A checkpoint record's ``path`` (a file path or URL: PATH_MAX on Linux is 4096 bytes) and
# its free-form ``tag``.
MAX_CHECKPOINT_PATH_LEN = 4096
MAX_CHECKPOINT_TAG_LEN = 200

# Durations the client measures (an eval's or a checkpoint save's ``seconds``, a step's
# timings, a hang's): no single interval of a training process lasts a month (a save or an
# evaluation takes minutes, a hang is reported once the watchdog's limit, at most a day by
# its schema, has passed). The bound keeps every sum of them exact: one 1e308 made a run's
# goodput ledger infinite and its unaccounted time NaN. Where a duration sits between two
# records, the ledger caps it by that interval too (runs/goodput.py).
MAX_DURATION_SECONDS = 30 * 86400.0
# A record's ``time`` is the client's clock when it was made, and it is sent after that:
# it can be ahead of the sidecar's clock at arrival only by the skew between the two
# clocks. NTP keeps machines milliseconds apart; a hardware clock kept in local time is
# at most 14 hours off. A day covers both; a time further ahead (1e300) is not a clock,
# and would own every figure that spans a run's time (its goodput, the fleet's). Spooled
# records arrive late, so there is no bound on age (only >= 0: Unix time).
MAX_CLOCK_AHEAD_SECONDS = 86400.0

# A hang record (a stuck process's thread stacks): what the client keeps is at most
# HANG_STACK_BYTES of JSON (client/monitor_client/_watchdog.py); the sidecar allows twice
# that for clients of other languages and refuses the rest, naming the budget.
MAX_HANG_THREADS = 256
MAX_HANG_FRAMES = 128         # per thread, innermost kept by the client
MAX_HANG_STACK_BYTES = 128 * 1024

_BAD_NAME = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_BAD_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def check_text(value: str, max_len: int, where: str, *, name: bool = True) -> str:
    """Apply the string rule; ``name`` False allows tab/newline (free text)."""
    if len(value) > max_len:
        raise ValueError(f"{where}: {len(value)} characters exceed the budget of {max_len}")
    bad = (_BAD_NAME if name else _BAD_TEXT).search(value)
    if bad is not None:
        what = "a lone UTF-16 surrogate" if "\ud800" <= bad.group() <= "\udfff" else \
            "a control character"
        raise ValueError(f"{where}: contains {what} ({ascii(bad.group())}) at {bad.start()}")
    return value


def check_time(value: float | None, arrival: float, where: str = "time") -> None:
    """A record's ``time`` against its arrival (``MAX_CLOCK_AHEAD_SECONDS``).

        >>> check_time(1000.0, arrival=2000.0)
        >>> check_time(1e300, arrival=2000.0)
        Traceback (most recent call last):
        ValueError: time: 1e+300 is 1e+300 s ahead of the sidecar's clock (2000); a record's time is when it was made, at most 86400 s ahead (the clocks' skew): fix the client's clock
    """
    if value is not None and value > arrival + MAX_CLOCK_AHEAD_SECONDS:
        raise ValueError(f"{where}: {value:g} is {value - arrival:.6g} s ahead of the "
                         f"sidecar's clock ({arrival:.0f}); a record's time is when it was "
                         f"made, at most {MAX_CLOCK_AHEAD_SECONDS:g} s ahead (the clocks' "
                         "skew): fix the client's clock")


def check_path_segment(value: str, where: str) -> str:
    """An id that is one segment of a URL path (a run id: ``/v1/runs/{id}``): ``.`` and
    ``..`` are refused, since clients, proxies and servers resolve them as "this" and
    "parent" (RFC 3986 dot-segments) and the run could never be asked for.

        >>> check_path_segment("gpt-7..final", "run_id")
        'gpt-7..final'
        >>> check_path_segment("..", "run_id")
        Traceback (most recent call last):
        ValueError: run_id: '..' cannot be a URL path segment (every URL would resolve it away)
    """
    if value in (".", ".."):
        raise ValueError(f"{where}: {value!r} cannot be a URL path segment (every URL would "
                         "resolve it away)")
    return value


def check_names(names: Any, where: str) -> None:
    """The name rule for the keys of a map (layers, metrics, ...), in one C-level pass
    over them all: a Python call per name cost more than validating the record did.
    Lengths and lone surrogates are checked by the string type itself."""
    if not names or all(map(str.isprintable, names)):  # C loop; printable is never bad
        return
    for name in names:
        if _BAD_NAME.search(name):
            check_text(name, MAX_NAME_LEN, f"{where} key {safe(name)!r}")


def check_int(value: int, where: str) -> int:
    """The integer rule: within ``MIN_INT`` .. ``MAX_INT`` (bools are ints and pass)."""
    if not MIN_INT <= value <= MAX_INT:
        shown = str(value) if value.bit_length() < 128 else f"of {len(str(abs(value)))} digits"
        raise ValueError(f"{where}: integer {shown} is outside the signed 64-bit range "
                         "(send it as a float or a string)")
    return value


def check_freeform(value: dict[str, Any], where: str) -> dict[str, Any]:
    """A free-form section (config, model, hardware): depth, entries, strings and bytes."""
    stack: list[tuple[Any, int, str]] = [(value, 1, where)]
    while stack:
        obj, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels")
        if len(obj) > MAX_FREEFORM_ENTRIES:
            raise ValueError(f"{path}: {len(obj)} entries exceed the budget of "
                             f"{MAX_FREEFORM_ENTRIES}")
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for key, child in items:
            if isinstance(key, str):
                check_text(key, MAX_NAME_LEN, f"{path} key {safe(key)!r}")
            here = f"{path}.{safe(str(key))}"
            if isinstance(child, str):
                check_text(child, MAX_TEXT_LEN, here, name=False)
            elif isinstance(child, int):
                check_int(child, here)
            elif isinstance(child, dict | list):
                stack.append((child, depth + 1, here))
    size = len(orjson.dumps(value))
    if size > MAX_FREEFORM_BYTES:
        raise ValueError(f"{where}: {size} bytes of JSON exceed the budget of "
                         f"{MAX_FREEFORM_BYTES}")
    return value


def hist_values(*sections: dict[str, Any] | None) -> int:
    """How many numbers the histogram sections of one record hold."""
    total = 0
    for sec in sections:
        for h in (sec or {}).values():
            total += len(h["edges"]) + len(h["counts"]) + len(h.get("quantiles", ()))
    return total


def stack_bytes(threads: list[Any]) -> int:
    """The size of a hang record's stacks as JSON (what ``MAX_HANG_STACK_BYTES`` bounds)."""
    return len(orjson.dumps(threads))


def safe(text: str, limit: int = 64) -> str:
    """A string fit for an error message: short, printable, encodable."""
    text = text[:limit]
    return text if text.isprintable() and not _BAD_NAME.search(text) else ascii(text)[1:-1]


def scrub(text: str, limit: int | None = None) -> str:
    """Make any string safe for a label or JSON answer (data stored by older versions)."""
    if limit is not None:
        text = text[:limit]
    if _BAD_NAME.search(text) is None:
        return text
    return _BAD_NAME.sub("\ufffd", text)
