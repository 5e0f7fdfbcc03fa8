"""``monitor-agent export``: a stored run back into a trace file that ``replay`` accepts.

From the data directory (a read-only SQLite connection: safe beside a running sidecar) or
from a running sidecar's API (paged through ``/v1/runs/{id}/records``). Records come out
in the order the store keeps them (step, then run/step/eval/end, then rank), one JSON line
each, non-finite numbers spelled as docs/format.md says.

A data directory with two steps of one run (stored out of order), exported::

    >>> import tempfile
    >>> from monitor_agent.storage.store import RecordRow, Store
    >>> rows = [RecordRow("gpt-7", 0, "step", s, None, wire.dumps(
    ...     {"kind": "step", "run_id": "gpt-7", "step": s, "loss": float("nan")})) for s in (2, 1)]
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     store = Store(Path(tmp, "monitor.sqlite"))
    ...     _ = store.insert_records(rows)
    ...     store.close()
    ...     count = export_from_data_dir(Path(tmp), "gpt-7", Path(tmp, "gpt-7.jsonl.gz"))
    ...     text = gzip.decompress(Path(tmp, "gpt-7.jsonl.gz").read_bytes()).decode()
    >>> count, text.splitlines()
    (2, ['{"kind":"step","run_id":"gpt-7","step":1,"loss":"NaN"}',
         '{"kind":"step","run_id":"gpt-7","step":2,"loss":"NaN"}'])
"""

from __future__ import annotations

import gzip
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx

from monitor_agent.records import wire

PAGE = 10_000  # the records endpoint's largest page


class ExportError(RuntimeError):
    """The run cannot be exported (unknown run, unreachable sidecar, refused token)."""


def export_from_data_dir(data_dir: Path, run_id: str, out: Path) -> int:
    db_path = data_dir / "monitor.sqlite"
    if not db_path.is_file():
        raise ExportError(f"no database at {db_path}")
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        # The run's current history, as the records API answers it (pipeline/attempts.py);
        # a database no sidecar with attempts opened yet has nothing replaced.
        current = (" AND superseded_by IS NULL"
                   if db.execute("PRAGMA user_version").fetchone()[0] >= 2 else "")
        rows = db.execute(
            f"SELECT body FROM records WHERE run_id = ?{current} ORDER BY step, CASE kind "
            "WHEN 'run' THEN 0 WHEN 'step' THEN 1 WHEN 'eval' THEN 2 ELSE 3 END, rank",
            (run_id,))
        count = _write(out, (wire.loads(body) for (body,) in rows))
    finally:
        db.close()
    if count == 0:
        out.unlink(missing_ok=True)
        raise ExportError(f"no records of run {run_id!r} in {db_path}")
    return count


def export_from_url(url: str, run_id: str, out: Path, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60) as client:
        count = _write(out, _pages(client, run_id))
    return count


def _pages(client: httpx.Client, run_id: str) -> Iterator[dict[str, Any]]:
    """Every record once: a page that ends mid-step is re-read from that step."""
    seen: set[tuple[Any, ...]] = set()
    since = -1
    path = f"/v1/runs/{quote(run_id, safe='')}/records"
    while True:
        try:
            res = client.get(path, params={"since_step": since, "limit": PAGE})
        except httpx.HTTPError as exc:
            raise ExportError(f"cannot reach {client.base_url}: {exc}") from exc
        if res.status_code != 200:
            raise ExportError(f"{res.request.url} answered {res.status_code}: {res.text[:300]}")
        records = res.json()["records"]
        fresh = 0
        for rec in records:
            key = (rec.get("kind"), rec.get("rank", 0), rec.get("step", -1))
            if key not in seen:
                seen.add(key)
                fresh += 1
                yield rec
        if len(records) < PAGE:
            return
        last = records[-1].get("step", -1)
        if fresh == 0:  # a single step holds more than a page: nothing more can be paged
            raise ExportError(f"step {last} of {run_id!r} has more than {PAGE} records")
        since = last


def _write(out: Path, records: Iterable[dict[str, Any]]) -> int:
    count = 0
    opener = gzip.open if out.name.endswith(".gz") else open
    with opener(out, "wb") as fh:
        sink: IO[bytes] = fh  # type: ignore[assignment]
        for rec in records:
            sink.write(wire.dumps(rec) + b"\n")
            count += 1
    return count
