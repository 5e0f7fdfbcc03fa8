"""``monitor-agent push-spool DIR``: send what a client left in its spool, after the fact.

A client spools the records the sidecar could not take (down, unreachable, overloaded) to
``$TMPDIR/monitor_client-spool/<run_id>-r<rank>/*.ndjson`` and replays them itself when the
next Monitor with that run id and rank starts. When none will (the job is over, the node is
gone, the sidecar was down for the whole run), this sends them by hand. DIR is one run's
spool directory, a directory of them (the spool base), or one segment file.

The segments are wire records, one JSON object per line, exactly as the client would have
posted them, so the sidecar judges them as it judges any batch: a record it already has is a
duplicate (a spool whose records did arrive is harmless to push twice), one it refuses for
good (invalid, implausible) is counted with its reason. One it refuses *for now* (a request
may bring only so many new runs or ranks into memory: "send its records again in another
request"; too many active runs: "retry later") is sent again in another request at once, as
the sidecar asks, for as long as each request settles more of them; what the sidecar still
refuses for now keeps its file, to be pushed again later. A segment is deleted only once
every record in it was accepted, a duplicate or refused for good, and an emptied run
directory with it (``--keep`` keeps both); a failed push leaves the spool as it was. A
record cut short by a crash mid-write (no final newline) was never complete and is skipped,
as the client skips it.

A file is read a line at a time and sent a batch at a time, so a push holds one batch in
memory whatever the file's size (a line longer than ``MAX_LINE_BYTES``, more than a sidecar
with default limits takes, is not read whole: it is skipped and its file kept). Which files
are read and deleted, and how no link is followed, is ``spool_files.py``'s.

Pushing a spool of two steps to a sidecar that already has the first::

    >>> import json, tempfile
    >>> from pathlib import Path
    >>> tmp = tempfile.TemporaryDirectory()
    >>> run = Path(tmp.name, "gpt-7-r0"); run.mkdir()
    >>> _ = Path(run, "000000000001.ndjson").write_text("".join(
    ...     json.dumps({"kind": "step", "run_id": "gpt-7", "step": s, "time": 1.0}) + "\\n"
    ...     for s in (1, 2)))
    >>> def sidecar(lines):  # what POST /v1/records answers
    ...     return 200, {"accepted": 1, "duplicates": 1, "rejected": []}
    >>> report = push(scan(Path(tmp.name)), sidecar)
    >>> report.summary()
    '2 records in 1 file (run gpt-7): 1 accepted, 1 duplicate, 0 refused; spool removed'
    >>> run.exists()
    False

A sidecar that takes one new run per request: the second run's step is sent again at once,
in a request of its own, and the file goes once both are stored::

    >>> mixed = Path(tmp.name, "mixed-r0"); mixed.mkdir()
    >>> _ = Path(mixed, "000000000001.ndjson").write_text("".join(
    ...     json.dumps({"kind": "step", "run_id": r, "step": 1, "time": 1.0}) + "\\n"
    ...     for r in ("a", "b")))
    >>> def one_new_run_each(lines):
    ...     later = [{"index": i, "reason": "run b is new, and this request brought ...; "
    ...               "send its records again in another request"} for i in range(1, len(lines))]
    ...     return 200, {"accepted": 1, "duplicates": 0, "rejected": later}
    >>> push(scan(Path(tmp.name)), one_new_run_each).summary()
    '2 records in 1 file (runs a, b): 2 accepted, 0 duplicates, 0 refused; spool removed'
    >>> tmp.cleanup()
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import httpx

from monitor_agent.tools import ToolError
from monitor_agent.tools.spool_files import (
    Directory,
    Listing,
    SpoolFileError,
    delete_segment,
    open_directory,
    open_segment,
    remove_if_empty,
    scan,
)

__all__ = ["PushError", "PushReport", "SpoolFileError", "http_post", "push", "scan"]

# As the client batches: a body the sidecar's ingest limits take whole.
BATCH_RECORDS = 500
BATCH_BYTES = 2 << 20
# A line longer than this is more than a sidecar with default limits takes as one body
# (max_decompressed_bytes, 16 MiB): never read whole, so a hostile file costs no memory.
MAX_LINE_BYTES = 16 << 20
# How the sidecar says a refusal is for now, not for good (pipeline/admission.py: a
# request's budget of new runs and ranks; pipeline/engine.py: max_active_runs).
LATER = ("send its records again in another request", "retry later")
SAMPLES = 20  # refused records a report names; the rest are counted

Post = Callable[[list[bytes]], tuple[int, Any]]
"""One POST of JSON lines to /v1/records: the HTTP status and the decoded JSON answer."""


class PushError(ToolError):
    """The sidecar cannot take the spool now (unreachable, wrong token, ...): nothing was
    deleted; the message says why."""


@dataclass
class PushReport:
    files: int = 0
    records: int = 0
    accepted: int = 0
    duplicates: int = 0
    refused: int = 0  # for good
    waiting: int = 0  # refused for now: their files stay
    # "run r step 7: <reason>", the first SAMPLES of each: a file of a million refused
    # lines must not cost a million strings.
    refused_lines: list[str] = field(default_factory=list)
    waiting_lines: list[str] = field(default_factory=list)
    torn: int = 0
    runs: set[str] = field(default_factory=set)
    kept: list[str] = field(default_factory=list)  # "PATH: why" for each file left in place
    skipped: list[str] = field(default_factory=list)  # "PATH: why" for what was never read
    removed: bool = False

    def summary(self) -> str:
        runs = ", ".join(sorted(self.runs)) or "none"
        text = (f"{self.records} records in {self.files} file{'s' * (self.files != 1)} "
                f"(run{'s' * (len(self.runs) > 1)} {runs}): {self.accepted} accepted, "
                f"{self.duplicates} duplicate{'s' * (self.duplicates != 1)}, "
                f"{self.refused} refused")
        if self.waiting:
            text += f", {self.waiting} refused for now (to push again later)"
        if self.torn:
            text += f", {self.torn} cut short by a crash (skipped)"
        if self.removed:
            text += "; spool removed"
        elif self.kept:
            text += f"; {len(self.kept)} file{'s' * (len(self.kept) != 1)} kept"
        if self.skipped:
            text += (f"; {len(self.skipped)} skipped (links, or not regular files: "
                     "never read)")
        return text

    def refuse(self, lines: list[bytes], reason: str, for_now: bool = False) -> None:
        if for_now:
            self.waiting += len(lines)
            sample = self.waiting_lines
        else:
            self.refused += len(lines)
            sample = self.refused_lines
        sample += [f"{_where(line)}: {reason}" for line in lines[:SAMPLES - len(sample)]]


def push(listing: Listing, post: Post, keep: bool = False) -> PushReport:
    """Send every complete line of the listed files through ``post``; delete each file
    whose records were all settled (accepted, duplicate, or refused for good)."""
    report = PushReport(skipped=list(listing.skipped))
    removed = not keep
    for directory in listing.directories:
        try:
            with open_directory(listing, directory) as (top_fd, dir_fd):
                emptied = _push_directory(listing, directory, dir_fd, post, keep, report)
                removed &= emptied and remove_if_empty(listing, directory, top_fd)
        except SpoolFileError as exc:  # replaced by something else since it was listed
            report.skipped.append(str(exc))
            removed = False
    report.removed = removed
    return report


def _push_directory(listing: Listing, directory: Directory, dir_fd: int, post: Post,
                    keep: bool, report: PushReport) -> bool:
    """Push one directory's files in order; True when every one of them was deleted."""
    where = listing.top if directory.name is None else listing.top / directory.name
    emptied = not keep
    for name, is_segment in directory.files:
        try:
            with open_segment(dir_fd, name) as (fh, read):
                why_kept = _push_file(fh, post, report)
        except SpoolFileError as exc:  # a link or a FIFO put there since the listing
            report.skipped.append(f"{where}/{exc}")
            emptied = False
            continue
        report.files += 1
        if keep:
            continue
        if why_kept is None and not is_segment:
            why_kept = "not a spool segment (a file of your own is never deleted)"
        if why_kept is None and not delete_segment(dir_fd, name, read):
            why_kept = "replaced while it was pushed"
        if why_kept is not None:
            report.kept.append(f"{where / name}: {why_kept}")
            emptied = False
    return emptied


def _push_file(fh: BinaryIO, post: Post, report: PushReport) -> str | None:
    """Stream one file's complete lines to the sidecar a batch at a time; None when every
    record was settled, else why the file must stay."""
    waiting, too_long = report.waiting, 0
    batch: list[bytes] = []
    size = 0
    while raw := fh.readline(MAX_LINE_BYTES + 1):
        if not raw.endswith(b"\n"):
            if len(raw) <= MAX_LINE_BYTES:  # the end of the file: the writer died mid-record
                report.torn += bool(raw.strip())
                break
            too_long += 1
            _skip_rest_of_line(fh)
            continue
        line = raw[:-1]
        if not line.strip():
            continue
        report.records += 1
        report.runs.add(_run_of(line))
        if batch and (len(batch) >= BATCH_RECORDS or size + len(raw) > BATCH_BYTES):
            _deliver(batch, post, report)
            batch, size = [], 0
        batch.append(line)
        size += len(raw)
    if batch:
        _deliver(batch, post, report)
    why = []
    if report.waiting > waiting:
        why.append(f"{report.waiting - waiting} records refused for now, to push again")
    if too_long:
        why.append(f"{too_long} line{'s' * (too_long != 1)} longer than "
                   f"{MAX_LINE_BYTES >> 20} MiB, not sent")
    return "; ".join(why) or None


def _skip_rest_of_line(fh: BinaryIO) -> None:
    while (chunk := fh.readline(1 << 20)) and not chunk.endswith(b"\n"):
        pass


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


def _deliver(batch: list[bytes], post: Post, report: PushReport) -> None:
    """Send ``batch``, and what the sidecar refuses for now again in another request, as
    it asks, while each request settles some; what it still refuses goes to ``waiting``."""
    while batch:
        again = _send(batch, post, report)
        if len(again) == len(batch):  # this request settled none: it will not, now
            for line, reason in again:
                report.refuse([line], reason, for_now=True)
            return
        batch = [line for line, _ in again]


def _send(batch: list[bytes], post: Post, report: PushReport) -> list[tuple[bytes, str]]:
    """One request (or halves of it); the lines refused for now, with their reasons."""
    status, answer = post(batch)
    detail = answer.get("detail") if isinstance(answer, dict) else None
    # 413: too large as one body. 422 over several runs or ranks: every record was refused,
    # but the answer names one reason, and the others may be "for now" (a request's budget
    # of new runs and ranks is all that refuses records of one run and rank for now).
    if len(batch) > 1 and (status == 413 or (status == 422 and _mixed(batch))):
        half = len(batch) // 2
        return _send(batch[:half], post, report) + _send(batch[half:], post, report)
    if status == 429:  # too many active runs: every record here is refused for now
        return [(line, f"{status} {detail}") for line in batch]
    if status in (413, 422) or (status == 400 and len(batch) == 1):
        if status == 422 and _later(str(detail)):
            return [(line, str(detail)) for line in batch]
        report.refuse(batch, f"{status} {detail}")
        return []
    if status != 200 or not isinstance(answer, dict):
        raise PushError(f"the sidecar answered {status}: {detail or answer}; nothing deleted "
                        "from the files not yet answered, push again")
    again: list[tuple[bytes, str]] = []
    for item in answer.get("rejected") or []:
        index = item.get("index") if isinstance(item, dict) else None
        line = batch[index] if isinstance(index, int) and 0 <= index < len(batch) else b""
        reason = str(item.get("reason", "")) if isinstance(item, dict) else ""
        if line and _later(reason):
            again.append((line, reason))
        else:
            report.refuse([line], reason)
    report.accepted += int(answer.get("accepted", 0))
    report.duplicates += int(answer.get("duplicates", 0))
    return again


def _later(reason: str) -> bool:
    return any(words in reason for words in LATER)


def _mixed(batch: list[bytes]) -> bool:
    return len({(_record(line).get("run_id"), _record(line).get("rank", 0))
                for line in batch}) > 1


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
