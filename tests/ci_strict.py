"""Under ``CI=true`` a skipped test is a failed one.

CI installs everything the suite needs (``.ci/run``: the Prometheus and Alertmanager
binaries, Chromium and its driver, Slurm and munge, torch, transformers, lightning) and runs
as root, so a test that skips there for a missing binary, browser, package, file or
privilege is a broken install, and a suite of such skips passes having tested nothing. On a
developer's machine the same test skips, saying what is missing.

One definition for every skip of the suite, whatever raised it (``pytest.skip`` in a test or
a fixture, ``skipif``, ``importorskip`` at a module's top): the report hooks below, which
``tests/conftest.py`` takes in. A test whose skip says nothing about the install (the one
thing root cannot be refused) carries ``@pytest.mark.allowed_skip("why")``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

WHY = ("skipped under CI=true: {reason}. CI installs everything and runs as root (.ci/run), "
       "so this is a broken install, and a skip would pass a suite that tested nothing")


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: why")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail(report: pytest.CollectReport | pytest.TestReport) -> None:
    report.outcome = "failed"
    report.longrepr = WHY.format(reason=_reason(report))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (report.skipped and on_ci() and not hasattr(report, "wasxfail")
            and item.get_closest_marker("allowed_skip") is None):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A module that skips as it is imported (``importorskip`` at its top)."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped and on_ci():
        _fail(report)
