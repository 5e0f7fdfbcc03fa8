"""A request's cost to the sidecar is bounded by its budgets (issue 12): the issue's own
amplification attacks (a 16k-layer histogram, a 50 MB config string, 60 MB of unknown
fields, each a few KB of gzip) are refused before they are built, hold nothing once
answered, and no request of the set peaks above 64 MiB of RSS. bench/chaos.py's
amplification section prints the same figures over the whole fuzz corpus.

Shapes whose cost grows with a count rather than with bytes (millions of ``{}`` lines, the
ranks of one run, one-line runs) are held to the same 64 MiB: each count has a budget,
enforced before the memory is spent, on ``/v1/records`` and ``/v1/records/preview`` alike.
"""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import httpx

from monitor_agent.settings import Settings
from tests.eventually import eventually
from tests.reliability.amplification import NOISE_MIB, MiB, attack_cases, measure, shape_cases
from tests.sidecar_process import SidecarProcess

PEAK_BUDGET_MIB = 64.0


def test_amplification_attacks_are_refused_and_hold_nothing(tmp_path: Path):
    cases = attack_cases()
    with SidecarProcess(tmp_path / "data") as sc:
        report = measure(sc.url, sc.proc.pid, sc.data_dir / "monitor.sqlite", cases)
    print(report.table({c.name for c in cases}))
    rows = {r.name: r for r in report.rows}
    for name in ("grad_hist 16k layers x 1025 edges", "50 MB config string",
                 "60 MB of unknown fields"):
        assert rows[name].status == 413 and rows[name].stored == 0, rows[name]
        assert rows[name].held_mib <= 4 * NOISE_MIB, rows[name]
    # Accepted: unknown fields are not stored, whatever their size.
    assert rows["one line under max_record_bytes, unknown field"].stored < 1000
    assert all(r.peak_mib <= PEAK_BUDGET_MIB for r in report.rows), report.rows


def test_counted_shapes_stay_within_the_request_budget(tmp_path: Path):
    cases = shape_cases()
    with SidecarProcess(tmp_path / "data") as sc:
        # The refused previews first: after the shapes that store records (10k ranks, 10k
        # runs) the chart history's thread folds them for a while, and what it allocates
        # meanwhile would count as held by whichever request is measured then.
        preview = measure(sc.url, sc.proc.pid, sc.data_dir / "monitor.sqlite", cases[:2],
                          path="/v1/records/preview")
        report = measure(sc.url, sc.proc.pid, sc.data_dir / "monitor.sqlite", cases)
        ranks = httpx.get(sc.url + "/v1/runs/rank-bomb").json()["ranks"]
        runs = [r["run_id"] for r in httpx.get(sc.url + "/v1/runs").json()["runs"]]
        tiny = gzip.compress(cases[0].body)
        answer = httpx.post(sc.url + "/v1/records", content=tiny, headers={
            "content-type": "application/x-ndjson", "content-encoding": "gzip"})
    print(report.table({c.name for c in cases}))
    print(preview.table({c.name for c in cases}))
    rows = {r.name: r for r in report.rows}
    for row in [rows[c.name] for c in cases[:3]] + preview.rows:
        assert row.status == 413 and row.stored == 0, row
        # What stays is at most the body's own bytes, which the allocator keeps for reuse.
        assert row.held_mib <= 4 * NOISE_MIB + row.sent / MiB, row
    assert answer.status_code == 413 and "max_records_per_request" in answer.json()["detail"]
    # Ranks and runs past their budgets are refused record by record; the rest is kept.
    assert rows["10k ranks of one run, one request"].status == 200
    assert len(ranks) == Settings().max_new_ranks_per_request
    assert rows["10k one-line runs, one request"].status == 200
    assert len([r for r in runs if r.startswith("one-line-")]) == 64
    assert all(r.peak_mib <= PEAK_BUDGET_MIB for r in report.rows + preview.rows), report.rows


def _step(run_id: str, step: int = 1, rank: int = 0) -> dict:
    return {"kind": "step", "run_id": run_id, "rank": rank, "step": step, "time": float(step),
            "loss": 1.0}


def test_rank_cap_refuses_new_ranks_with_a_reason_and_keeps_known_ones(tmp_path: Path):
    env = {"MONITOR_AGENT_MAX_RANKS_PER_RUN": "8"}
    with SidecarProcess(tmp_path / "data", env=env) as sc:
        first = sc.post([_step("job", rank=r) for r in range(20)])
        late = sc.post([_step("job", step=2, rank=12)])
        known = sc.post([_step("job", step=2, rank=3)])
        other = sc.post([_step("other-job", rank=r) for r in range(8)])
        ranks = httpx.get(sc.url + "/v1/runs/job").json()["ranks"]
    assert first.status_code == 200 and first.json()["accepted"] == 8
    reasons = {r["reason"] for r in first.json()["rejected"]}
    assert len(first.json()["rejected"]) == 12
    assert all("max_ranks_per_run=8" in r for r in reasons), reasons
    assert late.status_code == 422 and "max_ranks_per_run=8" in late.json()["detail"]
    assert known.status_code == 200 and known.json()["accepted"] == 1
    assert other.status_code == 200 and other.json()["accepted"] == 8  # per run, not global
    assert sorted(ranks, key=int) == [str(r) for r in range(8)]


def test_one_line_runs_cannot_lock_new_runs_out(tmp_path: Path):
    env = {"MONITOR_AGENT_MAX_ACTIVE_RUNS": "100",
           "MONITOR_AGENT_RUN_DISPLACE_AFTER_SECONDS": "2"}
    with SidecarProcess(tmp_path / "data", env=env) as sc:
        bomb = sc.post([_step(f"bomb-{i}") for i in range(10_000)])
        while sc.post([_step(f"bomb-more-{time.monotonic_ns()}-{i}") for i in range(64)]
                      ).json().get("accepted", 0) == 64:
            pass  # fill the registry, 64 new runs a request
        refused = sc.post([_step("legit")])

        def admitted() -> httpx.Response:
            later = sc.post([_step("legit")])
            assert later.status_code != 429, later.text
            return later

        later = eventually(admitted, timeout=60, interval=0.2,
                           what="room for a legitimate run again")
        again = sc.post([_step("legit", step=2)])
    assert bomb.status_code == 200 and bomb.json()["accepted"] == 64
    assert "max_new_runs_per_request=64" in bomb.json()["rejected"][0]["reason"]
    assert refused.status_code == 429 and "max_active_runs=100" in refused.json()["detail"]
    assert refused.headers["retry-after"]
    assert later.status_code == 200 and later.json()["accepted"] == 1
    assert again.status_code == 200 and again.json()["accepted"] == 1
