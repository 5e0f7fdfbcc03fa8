"""A request's cost to the sidecar is bounded by its budgets (issue 12): the issue's own
amplification attacks (a 16k-layer histogram, a 50 MB config string, 60 MB of unknown
fields, each a few KB of gzip) are refused before they are built, hold nothing once
answered, and no request of the set peaks above 64 MiB of RSS. bench/chaos.py's
amplification section prints the same figures over the whole fuzz corpus."""

from __future__ import annotations

from pathlib import Path

from amplification import NOISE_MIB, attack_cases, measure

from sidecar_process import SidecarProcess

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
