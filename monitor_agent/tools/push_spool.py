"""``monitor-agent push-spool DIR``: send what a client left in its spool, after the fact.

A client spools the records the sidecar could not take (down, unreachable, overloaded) to
``$TMPDIR/monitor_client-spool/<run_id>-r<rank>/*.ndjson`` and replays them itself when the
next Monitor with that run id and rank starts. When none will (the job is over, the node is
gone, the sidecar was down for the whole run), this sends them by hand. DIR is one run's
spool directory, a directory of them (the spool base), or one segment file.

The segments are wire records, one JSON object per line, exactly as the client would have
posted them, so the sidecar judges them as it judges any batch: a record it already has is a
duplicate (a spool whose records did arrive is harmless to push twice), one it refuses is
counted with its reason. A segment is deleted only once every record in it was answered, and
an emptied run directory with it (``--keep`` keeps both); a failed push leaves the spool as
it was, to be pushed again. A record cut short by a crash mid-write (no final newline) was
never complete and is skipped, as the client skips it.

Pushing a spool of two steps to a sidecar that already has the first::

    >>> import json, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> run = Path(tmp.name, "gpt-7-r0"); run.mkdir()
    >>> _ = Path(run, "000000000001.ndjson").write_text("".join(
    ...     json.dumps({"kind": "step", "run_id": "gpt-7", "step": s, "time": 1.0}) + "\\n"
    ...     for s in (1, 2)))
    >>> def sidecar(lines):  # what POST /v1/records answers
    ...     return 200, {"accepted": 1, "duplicates": 1, "rejected": []}
    >>> report = push(segments(Path(tmp.name)), sidecar)
    >>> report.summary()
    '2 records in 1 file (run gpt-7): 1 accepted, 1 duplicate, 0 refused; spool removed'
    >>> run.exists()
    False
    >>> tmp.cleanup()
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

SUFFIX = ".ndjson"
# As the client batches: a body the sidecar's ingest limits take whole.
BATCH_RECORDS = 500
BATCH_BYTES = 2 << 20

Post = Callable[[list[bytes]], tuple[int, Any]]
"""One POST of JSON lines to /v1/records: the HTTP status and the decoded JSON answer."""


class PushError(Exception):
    """The sidecar cannot take the spool now (unreachable, wrong token, ...): nothing was
    deleted; the message says why."""


@dataclass
class PushReport:
    files: int = 0
    records: int = 0
    accepted: int = 0
    duplicates: int = 0
    refused: list[str] = field(default_factory=list)  # "run r step 7: <reason>"
    torn: int = 0
    runs: set[str] = field(default_factory=set)
    removed: bool = False

    def summary(self) -> str:
        runs = ", ".join(sorted(self.runs)) or "none"
        text = (f"{self.records} records in {self.files} file{'s' * (self.files != 1)} "
                f"(run{'s' * (len(self.runs) > 1)} {runs}): {self.accepted} accepted, "
                f"{self.duplicates} duplicate{'s' * (self.duplicates != 1)}, "
                f"{len(self.refused)} refused")
        if self.torn:
            text += f", {self.torn} cut short by a crash (skipped)"
        return text + ("; spool removed" if self.removed else "")


def segments(path: Path) -> list[Path]:
    """The segment files under ``path``, oldest first within each run directory."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise PushError(f"{path}: no such spool directory or file")
    found = sorted(path.glob(f"*{SUFFIX}"))
    for sub in sorted(p for p in path.iterdir() if p.is_dir()):
        found += sorted(sub.glob(f"*{SUFFIX}"))
    if not found:
        raise PushError(f"{path}: no spooled records (*{SUFFIX}) here")
    return found


def push(files: list[Path], post: Post, keep: bool = False) -> PushReport:
    """Send every complete line of ``files`` through ``post``; delete what was answered."""
    report = PushReport()
    for path in files:
        lines, torn = _lines(path)
        report.files += 1
        report.records += len(lines)
        report.torn += torn
        for line in lines:
            report.runs.add(_run_of(line))
        for batch in _batches(lines):
            _send(batch, post, report)
        if not keep:
            path.unlink()
    if not keep:
        report.removed = True
        for directory in {p.parent for p in files}:
            try:
                directory.rmdir()  # only when empty: a spool also holding other files stays
            except OSError:
                report.removed = False
    return report


def http_post(url: str, token: str | None = None, timeout: float = 30.0) -> Post:
    """A ``Post`` to the sidecar at ``url``, as the client posts: gzip JSON lines."""
    client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout, headers={
        "Content-Type": "application/x-ndjson", "Content-Encoding": "gzip",
        **({"Authorization": f"Bearer {token}"} if token else {})})

    def post(lines: list[bytes]) -> tuple[int, Any]:
        body = gzip.compress(b"\n".join(lines) + b"\n", compresslevel=1)
        try:
            resp = client.post("/v1/records", content=body)
        except httpx.HTTPError as exc:
            raise PushError(f"cannot reach the sidecar at {url}: {exc}") from exc
        try:
            answer = resp.json()
        except ValueError:
            answer = {"detail": resp.text[:300]}
        return resp.status_code, answer

    return post


def _send(batch: list[bytes], post: Post, report: PushReport) -> None:
    status, answer = post(batch)
    if status == 413 and len(batch) > 1:  # too large as one body: halves, in order
        half = len(batch) // 2
        _send(batch[:half], post, report)
        _send(batch[half:], post, report)
        return
    detail = answer.get("detail") if isinstance(answer, dict) else None
    if status in (413, 422) or (status == 400 and len(batch) == 1):
        report.refused += [f"{_where(line)}: {status} {detail}" for line in batch]
        return
    if status != 200 or not isinstance(answer, dict):
        raise PushError(f"the sidecar answered {status}: {detail or answer}; nothing deleted "
                        "from the files not yet answered, push again")
    rejected = answer.get("rejected") or []
    for item in rejected:
        index = item.get("index") if isinstance(item, dict) else None
        line = batch[index] if isinstance(index, int) and 0 <= index < len(batch) else b""
        report.refused.append(f"{_where(line)}: {item.get('reason', '')}")
    report.accepted += int(answer.get("accepted", 0))
    report.duplicates += int(answer.get("duplicates", 0))


def _lines(path: Path) -> tuple[list[bytes], int]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    torn = 1 if lines[-1].strip() else 0  # no final newline: the writer died mid-record
    return [line for line in lines[:-1] if line.strip()], torn


def _batches(lines: list[bytes]) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    size = 0
    for line in lines:
        if not out or len(out[-1]) >= BATCH_RECORDS or size + len(line) > BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(line)
        size += len(line) + 1
    return out


def _record(line: bytes) -> dict[str, Any]:
    try:
        found = json.loads(line)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _run_of(line: bytes) -> str:
    return str(_record(line).get("run_id", "?"))


def _where(line: bytes) -> str:
    record = _record(line)
    return (f"run {record.get('run_id', '?')} {record.get('kind', 'record')} "
            f"{record.get('step', '')}").rstrip()
