"""How much a request makes the sidecar hold and store, per byte it sent (issue 12).

For each request: bytes sent on the wire; the sidecar's peak RSS above what it had before
(VmHWM after resetting it through /proc/PID/clear_refs, so one request's peak is seen);
RSS still held once it answered; and bytes stored (record bodies and run records, read from
the SQLite file by a second connection). RSS moves by a few hundred KiB on its own (ticks,
allocator), so "held" counts only what exceeds NOISE_MIB.

Example::

    report = measure(sc.url, sc.proc.pid, data_dir / "monitor.sqlite", cases)
    print(report.summary())
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from monitor_agent.storage.database import read_only_uri
from tests.reliability.record_fuzz import FUZZ_RUN, Case, rss_mib

NOISE_MIB = 1.0
MiB = 1024 * 1024
PEAK_BUDGET_MIB = 64.0  # docs/hostile-input.md's budget: peak RSS of any one request


def attack_cases() -> list[Case]:
    """The issue's amplification attacks, and the largest payloads the budgets still let in."""
    step = {"kind": "step", "run_id": FUZZ_RUN, "step": 1, "time": 1.0, "loss": 1.0}
    hist = {f"layer.{i}": {"edges": [0.0] * 1025, "counts": [0.0] * 1024} for i in range(16_000)}
    layers = {f"blocks.{i}.weight": {"grad_norm": 1.0, "param_norm": 2.0, "update_norm": 0.1}
              for i in range(20_000)}
    line = json.dumps
    return [
        Case("grad_hist 16k layers x 1025 edges", line({**step, "grad_hist": hist}).encode(),
             gzip=True),
        Case("50 MB config string", line({"kind": "run", "run_id": FUZZ_RUN,
                                          "config": {"x": "a" * 50_000_000}}).encode(), gzip=True),
        Case("60 MB of unknown fields", b"\n".join(
            line({**step, "step": s, "junk": "j" * 1_000_000}).encode() for s in range(2, 62)),
             gzip=True),
        Case("one line under max_record_bytes, unknown field", line(
            {**step, "step": 70, "junk": "k" * (4 * MiB - 200)}).encode(), gzip=True),
        Case("20k layers (MAX_LAYERS)", line({**step, "step": 80, "layers": layers}).encode(),
             gzip=True),
        Case("config at its 64 KiB budget", line({"kind": "run", "run_id": FUZZ_RUN, "config": {
            f"k{i}": "v" * 60 for i in range(900)}}).encode(), gzip=True),
    ]


def shape_cases() -> list[Case]:
    """Shapes whose cost grows with a count the byte budgets do not see: lines, records of
    a JSON array, ranks of one run, new runs. Each stays within every byte budget."""
    tiny = b"{}\n" * (16 * MiB // 3 - 8)  # inflates to just under max_decompressed_bytes
    ranks = b"\n".join(json.dumps({"kind": "step", "run_id": "rank-bomb", "rank": r, "step": 1,
                                   "time": 1.0, "loss": 1.0}).encode() for r in range(10_000))
    runs = b"\n".join(json.dumps({"kind": "step", "run_id": f"one-line-{i}", "step": 1,
                                  "time": 1.0}).encode() for i in range(10_000))
    return [
        Case("{} lines to max_decompressed_bytes (gzip)", tiny, gzip=True),
        Case("{} lines to max_body_bytes (plain)", tiny[:8 * MiB - 1024]),
        Case("JSON array of {} at max_values_per_request",
             b",".join([b"{}"] * 499_000), ndjson=False, gzip=True),
        Case("10k ranks of one run, one request", ranks, gzip=True),
        Case("10k one-line runs, one request", runs, gzip=True),
    ]


@dataclass
class Row:
    name: str
    sent: int
    inflated: int
    status: int
    peak_mib: float
    held_mib: float
    stored: int


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def worst(self, key) -> Row:
        return max(self.rows, key=key)

    def summary(self) -> str:
        peak = self.worst(lambda r: r.peak_mib)
        held = self.worst(lambda r: max(r.held_mib - NOISE_MIB, 0) * MiB / r.sent)
        stored = self.worst(lambda r: r.stored / r.sent)
        stored_inflated = self.worst(lambda r: r.stored / r.inflated)
        held_ratio = max(held.held_mib - NOISE_MIB, 0) * MiB / held.sent
        return "\n".join([
            f"{len(self.rows)} requests, {sum(r.sent for r in self.rows) / MiB:.1f} MiB sent",
            f"worst peak RSS of one request: {peak.peak_mib:.1f} MiB ({peak.name}, "
            f"{peak.sent} B sent, HTTP {peak.status})",
            f"worst RSS held / sent (above {NOISE_MIB:.0f} MiB noise): {held_ratio:.2f}x "
            f"({held.name}: {held.held_mib:.1f} MiB held from {held.sent} B)",
            f"worst bytes stored / sent: {stored.stored / stored.sent:.2f}x ({stored.name}: "
            f"{stored.stored} B stored from {stored.sent} B, HTTP {stored.status})",
            f"worst bytes stored / inflated body: "
            f"{stored_inflated.stored / stored_inflated.inflated:.2f}x ({stored_inflated.name})",
        ])

    def table(self, names: set[str]) -> str:
        lines = [f"budget: {PEAK_BUDGET_MIB:.0f} MiB of peak RSS for any request",
                 f"{'request':50} {'sent B':>10} {'inflated B':>10} {'HTTP':>4} {'peak MiB':>8} {'held MiB':>8} "
                 f"{'stored B':>9} {'budget':>6}"]
        lines += [f"{r.name[:50]:50} {r.sent:>10} {r.inflated:>10} {r.status:>4} {r.peak_mib:>8.1f} "
                  f"{r.held_mib:>8.1f} {r.stored:>9} "
                  f"{'ok' if r.peak_mib <= PEAK_BUDGET_MIB else 'OVER':>6}"
                  for r in self.rows if r.name in names]
        return "\n".join(lines)


def _stored_bytes(db: sqlite3.Connection) -> int:
    records = db.execute("SELECT COALESCE(SUM(LENGTH(body)), 0) FROM records").fetchone()[0]
    runs = db.execute("SELECT COALESCE(SUM(LENGTH(run_record)), 0) FROM runs").fetchone()[0]
    return records + runs


def reset_peak(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(url: str, pid: int, db_path: Path, cases: list[Case],
            path: str = "/v1/records") -> Report:
    report = Report()
    db = sqlite3.connect(read_only_uri(db_path), uri=True)
    with httpx.Client(timeout=120) as client:
        for case in cases:
            body = case.body if case.ndjson else b'{"records": [' + case.body + b"]}"
            headers = {"content-type": "application/x-ndjson" if case.ndjson
                       else "application/json"}
            if case.gzip:
                body, headers["content-encoding"] = gzip.compress(body, 6), "gzip"
            before, stored0 = rss_mib(pid), _stored_bytes(db)
            exact = reset_peak(pid)
            r = client.post(url + path, content=body, headers=headers)
            peak = (peak_mib(pid) if exact else rss_mib(pid)) - before
            inflated = len(case.body) if case.ndjson else len(case.body) + 15
            report.rows.append(Row(case.name, len(body), inflated, r.status_code, max(peak, 0.0),
                                   max(rss_mib(pid) - before, 0.0), _stored_bytes(db) - stored0))
    db.close()
    return report


def layer_names_over_time(url: str, pid: int, history_path: Path, steps: int,
                          per_request: int = 100) -> Row:
    """One run whose every step names one layer never seen before, ``per_request`` steps a
    request: the worst request's peak RSS, RSS held at the end, and what the chart history
    (``history.sqlite``, folded by its own thread) grew by, once it has caught up."""
    def history(sql: str) -> int:
        db = sqlite3.connect(f"file:{history_path}?mode=ro", uri=True)
        try:
            return db.execute(sql).fetchone()[0] or 0
        finally:
            db.close()

    def history_bytes() -> int:
        return sum(history(f"SELECT SUM(LENGTH(data)) FROM {t}")
                   for t in ("matrices", "matrix_blocks"))

    stored0, before, sent, peak, status = history_bytes(), rss_mib(pid), 0, 0.0, 0
    with httpx.Client(timeout=120) as client:
        for start in range(1, steps + 1, per_request):
            body = gzip.compress(b"\n".join(json.dumps({
                "kind": "step", "run_id": "name-drift", "step": s, "time": float(s), "loss": 1.0,
                "layers": {f"drift.{s}.weight": {"grad_norm": 1.0}}}).encode()
                for s in range(start, min(steps + 1, start + per_request))))
            exact = reset_peak(pid)
            status = client.post(url + "/v1/records", content=body, headers={
                "content-type": "application/x-ndjson", "content-encoding": "gzip"}).status_code
            peak = max(peak, (peak_mib(pid) if exact else rss_mib(pid)) - before)
            sent += len(body)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the history folds on its own thread
        if history("SELECT MAX(step) FROM steps WHERE run_id = 'name-drift'") >= steps:
            break
        time.sleep(0.2)  # a report, not a check: it says where the history got to
    return Row(f"{steps} steps, one new layer name each", sent, 0, status, max(peak, 0.0),
               max(rss_mib(pid) - before, 0.0), history_bytes() - stored0)


def in_parallel(url: str, pid: int, case: Case, copies: int) -> Row:
    """``copies`` of one request sent at once: the peak of them together (the per-request
    budget times the requests in flight is what concurrency may cost)."""
    import concurrent.futures

    body, headers = gzip.compress(case.body, 6), {
        "content-type": "application/x-ndjson" if case.ndjson else "application/json",
        "content-encoding": "gzip"}
    before = rss_mib(pid)
    exact = reset_peak(pid)
    with httpx.Client(timeout=120) as client, \
            concurrent.futures.ThreadPoolExecutor(copies) as pool:
        statuses = list(pool.map(lambda _: client.post(url + "/v1/records", content=body,
                                                       headers=headers).status_code,
                                 range(copies)))
    peak = (peak_mib(pid) if exact else rss_mib(pid)) - before
    return Row(f"{case.name} x{copies} at once", len(body) * copies, len(case.body) * copies,
               max(statuses), max(peak, 0.0), max(rss_mib(pid) - before, 0.0), 0)
