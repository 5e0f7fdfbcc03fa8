"""The README's first command: the embedded demo pages a NaN exactly as Slack gets it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_catches_the_injected_nan_and_shows_the_slack_message():
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'client'}"}
    proc = subprocess.run(
        [sys.executable, "-m", "monitor_agent", "demo", "--steps", "80", "--inject-step", "60",
         "--exit-after", "0"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "critical nan_inf" in out
    assert "what to try next:" in out
    assert "run page: http://127.0.0.1:" in out and "/runs/demo-nan-" in out
    slack = json.loads(out.split("the most severe, verbatim:\n", 1)[1].split("\n}\n", 1)[0]
                       + "\n}")
    assert "TrainingNanInf" in slack["text"] and "step 60" in slack["text"]
    assert slack["blocks"][0]["type"] == "header"
