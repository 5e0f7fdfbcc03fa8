"""What the README tells a newcomer to run works as written: the quickstart snippet against
a real sidecar, and the sample monitor-agent.yaml through check-config; and the README stays
a front door, with every page of docs/ in its index."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'client'}",
            "OMP_NUM_THREADS": "1", **extra}


def _quickstart() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Use it in a training script"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_quickstart_runs_as_written(sidecar, tmp_path):
    code = _quickstart()
    assert "config=cfg" in code and "cfg = " in code  # defined before use
    assert "clip_grad_norm_(" not in code  # grad_clip= clips; no second clipping
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path,
                          env=_env(MONITOR_AGENT_URL=sidecar.url,
                                   MONITOR_AGENT_RUN_ID="readme-quickstart",
                                   MONITOR_AGENT_SPOOL_DIR=str(tmp_path / "spool")))
    assert proc.returncode == 0, proc.stderr
    assert "monitor_client" not in proc.stderr, proc.stderr  # no warning of any kind
    records = sidecar.records("readme-quickstart")
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 200 and steps[-1]["step"] == 200
    run = next(r for r in records if r["kind"] == "run")
    assert run["config"]["batch_size"] == 16 and run["config"]["grad_clip"] == 1.0
    assert run["config"]["total_steps"] == 200  # progress and the ETA come from it
    assert [r["status"] for r in records if r["kind"] == "end"] == ["completed"]


def test_the_sample_config_passes_check_config():
    sample = REPO / "monitor-agent.yaml"
    proc = subprocess.run([sys.executable, "-m", "monitor_agent", "check-config", str(sample)],
                          capture_output=True, text=True, env=_env(), cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"{sample}: OK" in proc.stdout
    # A sample nobody documents is not a sample: README points at it, and it is commented.
    assert "monitor-agent.yaml" in (REPO / "README.md").read_text()
    comments = [ln for ln in sample.read_text().splitlines() if ln.lstrip().startswith("#")]
    assert len(comments) >= 20


def test_the_readme_is_a_front_door_and_the_index_lists_every_page():
    """README.md stays short (the rest lives under docs/), and docs/README.md, the index,
    links every page of docs/ and docs/reference/, so a new page cannot go unfound."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "README.md grew: move the detail to a page in docs/"
    assert "(docs/README.md)" in readme
    index = (REPO / "docs" / "README.md").read_text()
    pages = sorted(p.relative_to(REPO / "docs").as_posix()
                   for p in (REPO / "docs").rglob("*.md") if p.name != "README.md")
    missing = [page for page in pages if f"]({page})" not in index]
    assert not missing, f"docs/README.md does not list: {missing}"
