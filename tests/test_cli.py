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


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_yaml_syntax_error_is_one_line_with_file_line_and_column(tmp_path: Path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("port: 9401\nalerting:\n  slack: {webhook_url: 'x'\n  console: {}\n")
    for args in (("check-config", str(cfg)), ("serve", "--config", str(cfg)),
                 ("replay", "--config", str(cfg), str(cfg))):
        line = _one_line_error(_cli(*args))
        assert f"{cfg}:4:3: YAML syntax error: expected ',' or '}}'" in line, line


def test_a_yaml_syntax_error_in_the_rules_file_names_that_file(tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("routes:\n  page: [console\nrules: []\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"alerting:\n  rules_file: {rules}\n")
    proc = _cli("check-config", str(cfg))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{rules}:3:6: YAML syntax error: expected ',' or ']'" in proc.stderr, proc.stderr


def test_a_malformed_trace_is_one_line_naming_file_line_and_column(tmp_path: Path):
    import gzip

    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"kind": "run", "run_id": "r"}\n\n{"kind": "step", oops}\n')
    line = _one_line_error(_cli("replay", "--quiet", str(bad_json)))
    assert line.startswith(f"monitor-agent replay: {bad_json}:3:18: not valid JSON"), line

    data = gzip.compress(b'{"kind": "run", "run_id": "r"}\n' * 2000)
    truncated = tmp_path / "truncated.jsonl.gz"
    truncated.write_bytes(data[: len(data) // 2])
    line = _one_line_error(_cli("replay", "--quiet", str(truncated)))
    assert f"{truncated}:" in line and "cannot read" in line, line

    not_object = tmp_path / "list.jsonl"
    not_object.write_text("[1, 2]\n")
    line = _one_line_error(_cli("replay", "--quiet", str(not_object)))
    assert f"{not_object}:1: expected a JSON object" in line, line


def test_a_config_that_is_not_a_mapping_or_not_text_is_one_line(tmp_path: Path):
    listing = tmp_path / "list.yaml"
    listing.write_text("- port: 9401\n")
    line = _one_line_error(_cli("check-config", str(listing)))
    assert f"{listing}:1:1: expected a mapping of settings" in line, line
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00port")
    line = _one_line_error(_cli("check-config", str(binary)))
    assert f"{binary}: not UTF-8 text" in line, line


def test_serve_refuses_to_start_on_a_blank_or_missing_token(tmp_path: Path):
    """A token that is configured but blank or unreadable never silently means "no auth"."""
    blank = tmp_path / "blank"
    blank.write_text("  \n\t\n")
    for env, why in (({"MONITOR_AGENT_TOKEN_FILE": str(blank)}, "empty or only whitespace"),
                     ({"MONITOR_AGENT_TOKEN_FILE": str(tmp_path / "gone")}, "cannot read"),
                     ({"MONITOR_AGENT_TOKEN": "   "}, "only whitespace")):
        full = {**os.environ, **env, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'client'}"}
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "monitor_agent", "serve", "--port", "1",
                 "--data-dir", str(tmp_path / "data")],
                capture_output=True, text=True, env=full, cwd=REPO, timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"serve started with {env}") from None
        assert proc.returncode == 2, (env, proc.stderr)
        assert "token" in proc.stderr and why in proc.stderr, proc.stderr
