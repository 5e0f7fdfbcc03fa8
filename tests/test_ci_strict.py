"""Under ``CI=true`` a skip fails, saying why (tests/ci_strict.py): pytest run as CI runs it,
in a subprocess, on a machine whose PATH lacks Chromium (the UI suite's browser), and on
small suites that skip in each way a test can (a fixture, ``skipif``, ``importorskip`` at
a module's top); without ``CI`` the same runs skip and pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _pytest(*args: str, cwd: Path, ci: bool, path: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(REPO)  # tests.ci_strict, for a suite outside tests/
    if ci:
        env["CI"] = "true"
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                           "no:cacheprovider", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=240)


def test_a_ci_run_without_chromium_fails_the_ui_suite_saying_why():
    # Only the venv's own bin on PATH: no chromium, no chromedriver.
    bare = str(Path(sys.executable).parent)
    test = "tests/ui/test_pages.py::test_runs_page_lists_the_fed_run"
    ci = _pytest(test, cwd=REPO, ci=True, path=bare)
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "skipped under CI=true: needs Debian's chromium and chromium-driver" in ci.stdout, (
        ci.stdout)
    here = _pytest(test, cwd=REPO, ci=False, path=bare)
    assert here.returncode == 0 and "1 skipped" in here.stdout, here.stdout + here.stderr


SUITE = {
    "conftest.py": """
import shutil
import pytest
from tests.ci_strict import pytest_make_collect_report, pytest_runtest_makereport

@pytest.fixture
def tool():
    if shutil.which("no-such-tool-ci-strict") is None:
        pytest.skip("no-such-tool-ci-strict not on PATH")
""",
    "test_fixture.py": "def test_uses_the_tool(tool):\n    pass\n",
    "test_marker.py": """
import pytest

@pytest.mark.skipif(True, reason="promtool not installed")
def test_checks_rules():
    pass

@pytest.mark.allowed_skip("root ignores file permissions")
@pytest.mark.skipif(True, reason="root ignores file permissions")
def test_permissions():
    pass

def test_plain():
    pass
""",
    "test_module.py": """
import pytest
pytest.importorskip("no_such_package_ci_strict")

def test_never_collected():
    pass
""",
}


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    allowed_skip(why): not failed under CI=true\n")
    return tmp_path


def test_every_kind_of_skip_fails_under_ci_but_one_marked_allowed(suite: Path):
    # (A module that cannot be collected stops the whole run; here the others run on.)
    ci = _pytest("-rA", "--continue-on-collection-errors", str(suite), cwd=suite,
                 ci=True).stdout
    # A skip in a test's setup (its fixture, skipif) or its module's import is an error.
    assert "1 passed, 1 skipped, 3 errors" in ci, ci
    for why in ("no-such-tool-ci-strict not on PATH", "promtool not installed",
                "could not import 'no_such_package_ci_strict'"):
        assert f"skipped under CI=true: {why}" in ci, (why, ci)
    here = _pytest("-rA", str(suite), cwd=suite, ci=False).stdout
    assert "1 passed, 4 skipped" in here, here
