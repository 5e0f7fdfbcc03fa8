"""Shared fixtures: a real sidecar (subprocess or in-process uvicorn) and trace paths.

A test waits for another thread or process with ``eventually()`` (tests/eventually.py),
never a loop of its own; on a slow box, ``MONITOR_TEST_TIME_SCALE=3`` stretches every wait.
Under ``CI=true`` a skipped test fails (tests/ci_strict.py: CI installs everything).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "client"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from tests.ci_strict import pytest_make_collect_report, pytest_runtest_makereport  # noqa: E402, F401
from tests.receivers import Receiver  # noqa: E402
from tests.sidecar_process import SidecarProcess  # noqa: E402

TRACES = REPO / "tests" / "traces" / "public"


@pytest.fixture
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"public traces not found at {TRACES}")
    return TRACES


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[SidecarProcess]:
    """A running sidecar subprocess on a free port; ``kill()``/``start()`` to crash it."""
    proc = SidecarProcess(tmp_path / "data")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def sidecar_factory(tmp_path: Path) -> Iterator[type[SidecarProcess]]:
    """Build sidecars with a config file or env of your own; all stopped at teardown."""
    made: list[SidecarProcess] = []

    def make(config: Path | None = None, env: dict[str, str] | None = None,
             data_dir: Path | None = None) -> SidecarProcess:
        proc = SidecarProcess(data_dir or tmp_path / f"data{len(made)}", config=config, env=env)
        made.append(proc)
        return proc

    try:
        yield make  # type: ignore[misc]
    finally:
        for proc in made:
            proc.stop()


STOP_RULES = """
routes: {page: [pagerduty]}
rules:
  - name: StopOnRepeatedNaN
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: []
    action: stop
    action_after: 2
"""


@pytest.fixture
def pd_receiver() -> Iterator[Receiver]:
    """A local PagerDuty Events API v2 receiver."""
    with Receiver("pagerduty") as receiver:
        yield receiver


@pytest.fixture
def stopping_sidecar(tmp_path: Path, sidecar_factory, pd_receiver) -> SidecarProcess:
    """A sidecar whose one rule pages on NaN and asks the run to stop on the second
    nan_inf finding (the first NaN step, then NaN 3 steps in a row)."""
    rules = tmp_path / "stop-rules.yaml"
    rules.write_text(STOP_RULES)
    config = tmp_path / "stop-config.yaml"
    config.write_text(f"alerting:\n  rules_file: {rules}\n  group_wait_seconds: 0.05\n"
                      f"  pagerduty: {{routing_key: k-0123456789abcdef0123456789abcd, "
                      f"url: '{pd_receiver.url}/v2/enqueue'}}\n")
    return sidecar_factory(config=config).start()
