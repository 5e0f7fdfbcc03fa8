"""A PagerDuty routing key of the wrong shape fails at config load, not at the first page
(every event would be answered 400): check-config and serve both refuse it, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'client'}"}
    return subprocess.run([sys.executable, "-m", "monitor_agent", *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)


@pytest.mark.parametrize("key, why", [
    ("abc123", "got 6 characters"),
    ("'0123456789abcdef 0123456789abcde'", "whitespace inside"),
])
def test_bad_routing_key_is_refused_by_check_config_and_serve(tmp_path: Path, key, why):
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(f"alerting:\n  pagerduty: {{routing_key: {key}}}\n")
    for args in (("check-config", str(cfg)),
                 ("serve", "--config", str(cfg), "--port", "1", "--data-dir", str(tmp_path))):
        proc = _cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert "routing_key" in proc.stderr and why in proc.stderr
        assert key.strip("'") not in proc.stderr  # the secret itself is not echoed


def test_key_from_a_file_is_stripped(tmp_path: Path):
    (tmp_path / "key").write_text("  0123456789abcdef0123456789abcdef\n")
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(f"alerting:\n  pagerduty: {{routing_key_file: {tmp_path / 'key'}}}\n")
    proc = _cli("check-config", str(cfg))
    assert proc.returncode == 0, proc.stderr
