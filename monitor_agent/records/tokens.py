"""What reads show of an attempt token: a digest of it, never the token.

A record's ``attempt`` token is the writer's identity (pipeline/attempts.py): a checkpoint
is taken only under a token its run already placed, so whoever knows a live process's
token can write as that process. Reads are open by default (``auth_reads`` off), so no
answer may carry one: wherever a token would be shown (a stored record, a run record, a
checkpoint) reads show ``h-`` and 16 hex digits of its SHA-256 instead. It still tells the
processes of a run apart, and it is itself a valid token, so an exported record ingests
again as the same process; it cannot be turned back into the token.

    >>> shown("a1b2c3d4e5f6")
    'h-bde81e9384b7848e'
    >>> redact(b'{"kind":"step","step":3,"attempt":"a1b2c3d4e5f6","loss":1.0}')
    b'{"kind":"step","step":3,"attempt":"h-bde81e9384b7848e","loss":1.0}'
    >>> redact_obj({"kind": "run", "attempt": "a1b2c3d4e5f6"})["attempt"]
    'h-bde81e9384b7848e'
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

_TOKEN = re.compile(rb'("attempt"\s*:\s*")([A-Za-z0-9._:-]{1,64})(")')


def shown(token: str) -> str:
    """The digest reads show for ``token`` ('' stays '': records sent without one)."""
    if not token:
        return token
    return "h-" + hashlib.sha256(token.encode()).hexdigest()[:16]


def redact(body: bytes) -> bytes:
    """A stored record's JSON with its token (the value of an ``attempt`` key) shown as
    its digest; everything else byte for byte (an answer is written from stored bytes)."""
    if b'"attempt"' not in body:
        return body
    return _TOKEN.sub(lambda m: m.group(1) + shown(m.group(2).decode()).encode() + m.group(3),
                      body)


def redact_obj(record: dict[str, Any]) -> dict[str, Any]:
    """A parsed record with its token shown as its digest."""
    token = record.get("attempt")
    if isinstance(token, str):
        return {**record, "attempt": shown(token)}
    return record
