"""Fuzz POST /v1/records with mutated real records (issue 12); see record_fuzz.py.

Budgets (docs/hostile-input.md): no 5xx; /healthz always 200; /metrics parses and
``promtool check metrics`` passes; the victim run's history unchanged; the sidecar's RSS
never above RSS_BUDGET_MIB.
"""

from __future__ import annotations

from pathlib import Path

from tests.reliability.record_fuzz import Checker, fuzz_cases, promtool_ok, rss_mib, seed_records
from tests.sidecar_process import SidecarProcess

CASES = 4000
RSS_BUDGET_MIB = 256.0   # docs/hostile-input.md's budget for a sidecar under hostile input
FULL_CHECK_EVERY = 10


def test_mutated_records_never_break_the_sidecar(tmp_path: Path):
    cases = list(fuzz_cases(seed_records(), limit=CASES))
    assert len(cases) == CASES
    config = tmp_path / "c.yaml"
    config.write_text("log_level: warning\nmax_record_bytes: 1048576\n")
    with SidecarProcess(tmp_path / "data", config=config) as sc:
        checker = Checker(sc.url, sc.proc.pid, RSS_BUDGET_MIB)
        checker.plant_victim()
        for i, case in enumerate(cases, 1):
            checker.send(case)
            checker.check(case, full=i % FULL_CHECK_EVERY == 0)
        final = checker.client.get(sc.url + "/metrics").text
        assert promtool_ok(final)
        assert sc.proc.poll() is None
        print(f"fuzz: {checker.cases} cases, statuses {checker.statuses}, "
              f"max RSS {checker.max_rss_mib:.0f} MiB (now {rss_mib(sc.proc.pid):.0f})")
    # The catalogue reaches both sides: some cases are accepted, most rejected with reasons.
    assert checker.statuses.get(200, 0) > 0 and checker.statuses.get(422, 0) > 0
