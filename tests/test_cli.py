"""The console script: replay writes findings as JSON lines; check-config explains errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'client'}"}
    return subprocess.run([sys.executable, "-m", "monitor_agent", *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=300)


def test_replay_writes_findings_jsonl(tmp_path: Path, traces_dir: Path):
    out = tmp_path / "f.jsonl"
    proc = _cli("replay", str(traces_dir / "nan_batch_cnn.jsonl.gz"), "--findings-out", str(out),
                "--quiet")
    assert proc.returncode == 0, proc.stderr
    findings = [json.loads(line) for line in out.read_text().splitlines()]
    assert findings, proc.stdout
    for f in findings:
        assert {"run_id", "type", "severity", "step", "rank", "layer", "message"} <= f.keys()
    nan = [f for f in findings if f["type"] == "nan_inf"]
    assert nan and nan[0]["step"] == 300 and nan[0]["severity"] == "critical"
    assert "nan_batch_cnn" in proc.stdout and "nan_inf" in proc.stdout


def test_replay_missing_file_is_a_clear_error(tmp_path: Path):
    proc = _cli("replay", str(tmp_path / "none.jsonl"))
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_check_config_ok_and_redacted(tmp_path: Path):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text("port: 9401\ntoken: do-not-print-me\n")
    proc = _cli("check-config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout and "do-not-print-me" not in proc.stdout + proc.stderr


def test_check_config_names_the_field(tmp_path: Path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("port: 0\nmystery: 1\n")
    proc = _cli("check-config", str(cfg))
    assert proc.returncode == 2
    assert "port:" in proc.stderr and "mystery: unknown setting" in proc.stderr
