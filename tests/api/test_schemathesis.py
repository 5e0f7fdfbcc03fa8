"""Property-based fuzzing of every operation in the OpenAPI schema: never a 5xx.

Bounded here (CI); ``SCHEMATHESIS_MAX_EXAMPLES`` raises it, and bench/chaos.py runs
thousands of cases.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer


@pytest.mark.skipif(shutil.which("schemathesis") is None, reason="schemathesis not installed")
def test_no_server_errors_over_the_openapi_schema(tmp_path: Path):
    examples = os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "25")
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        proc = subprocess.run(
            ["schemathesis", "run", f"{srv.url}/openapi.json", "--checks",
             "not_a_server_error", "--max-examples", examples, "--seed", "1", "--no-color",
             "--request-timeout", "10", "--generation-database", "none"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert " passed" in out and "generated" in out
