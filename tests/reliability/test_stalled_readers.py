"""Readers that send a GET of a large run and never read the answer (issue 25, class 1).

A real sidecar process holding 8 MiB of records; 60 clients, more than ``max_connections``,
each send ``GET /v1/runs/big/records?limit=10000`` (55 bytes) and never read. Before the
read-side bounds each answer was built whole and held in its connection's write buffer for
ever (30 such clients held +2.7 GB), and the cap could shed none of them, so /healthz and
ingest were refused. Now (docs/hostile-input.md): all read answers together stay within
READ_BUDGET_MIB of RSS, /healthz and ingest are answered during the attack, every reader
is dropped once its writes waited ``write_timeout_seconds``, and the run still reads in
full afterwards (the read slots came back).
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.eventually import scaled
from tests.reliability.stalled_readers import (
    Shape,
    attack,
    close_all,
    closed_by_sidecar,
    records_path,
    seed_run,
)
from tests.sidecar_process import SidecarProcess

READ_BUDGET_MIB = 64.0   # docs/hostile-input.md: what every read answer together may hold
READERS = 60
MAX_CONNECTIONS = 40
WRITE_TIMEOUT = 2.0
KEEP_ALIVE = 5.0         # uvicorn closes an idle kept-alive connection after this


def test_readers_that_never_read_stay_within_the_budget_and_are_dropped(tmp_path: Path):
    config = tmp_path / "c.yaml"
    config.write_text(f"write_timeout_seconds: {WRITE_TIMEOUT}\n"
                      f"max_connections: {MAX_CONNECTIONS}\nlog_level: warning\n")
    with SidecarProcess(tmp_path / "data", config=config) as sc:
        seed_run(sc.url, "big", records=8, layers=6000)
        row = attack(sc.url, sc.port, sc.proc.pid, Shape("records", records_path("big"), READERS))
        try:
            print(row.line())
            assert row.healthz == 200 and row.ingest == 200, row.line()
            assert row.peak_mib <= READ_BUDGET_MIB, row.line()
            # Each reader is closed by the sidecar: a stalled answer after the write
            # deadline, a refused one (503) as an idle connection.
            waited = scaled(WRITE_TIMEOUT + KEEP_ALIVE + 5.0)
            assert all(closed_by_sidecar(s, waited) for s in row.sockets)
        finally:
            close_all(row.sockets)
        assert sc.proc.poll() is None
        pages, records, path = 0, [], records_path("big")
        while path is not None:
            page = httpx.get(sc.url + path, timeout=30).json()
            records += page["records"]
            path, pages = page["next"], pages + 1
        assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, 9))
