"""python -m monitor_client.relaunch: a command that exits 75 with a plan is relaunched with
the plan's resume argument (an earlier one replaced) and MONITOR_ROLLBACK_PLAN naming the
consumed plan file; any other exit code ends it, as does a missing plan or the relaunch
limit. Real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A stand-in for a training script: it records how it was launched; the first two launches
# each leave a plan (as the HF callback writes it) and exit 75, the third finishes.
SCRIPT = """
import json, os, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = out / "launches.jsonl"
n = sum(1 for _ in open(runs)) if runs.exists() else 0
with open(runs, "a") as f:
    f.write(json.dumps({"argv": sys.argv[2:], "plan": os.environ.get("MONITOR_ROLLBACK_PLAN")}) + "\\n")
if n < int(os.environ.get("ROLLBACKS", "2")):
    (out / "monitor_rollback.json").write_text(json.dumps({
        "id": n + 1, "number": n + 1, "message": f"rolled back to step {100 * (n + 1)}",
        "checkpoint_path": str(out / f"checkpoint-{100 * (n + 1)}"),
        "resume_from_checkpoint": str(out / f"checkpoint-{100 * (n + 1)}")}))
    sys.exit(75)
sys.exit(int(os.environ.get("LAST", "0")))
"""


def _relaunch(tmp_path: Path, *extra: str, **env: str) -> tuple[int, list[dict], str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "monitor_client.relaunch", "--dir", str(tmp_path), *extra, "--",
         sys.executable, str(script), str(tmp_path), "--lr", "1"],
        capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "client"), **env})
    launches = [json.loads(line) for line in (tmp_path / "launches.jsonl").read_text()
                .splitlines()]
    return proc.returncode, launches, proc.stderr


def test_each_rollback_is_relaunched_from_its_plan_and_the_plan_consumed(tmp_path):
    code, launches, said = _relaunch(tmp_path)
    assert code == 0 and len(launches) == 3
    assert launches[0] == {"argv": ["--lr", "1"], "plan": None}
    assert launches[1]["argv"] == ["--lr", "1",
                                   f"--resume_from_checkpoint={tmp_path}/checkpoint-100"]
    assert launches[2]["argv"] == ["--lr", "1",  # the first resume argument replaced
                                   f"--resume_from_checkpoint={tmp_path}/checkpoint-200"]
    assert [launch["plan"] for launch in launches[1:]] == [
        str(tmp_path / "monitor_rollback.1.json"), str(tmp_path / "monitor_rollback.2.json")]
    assert not (tmp_path / "monitor_rollback.json").exists()
    assert "rollback 1: rolled back to step 100; relaunching (1)" in said


def test_another_exit_code_is_the_helpers_and_the_limit_holds(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _relaunch(tmp_path / "a", ROLLBACKS="0", LAST="3")[0] == 3
    code, launches, said = _relaunch(tmp_path / "b", "--max-relaunches", "1")
    assert code == 75 and len(launches) == 2 and "--max-relaunches" in said


def test_an_exit_75_without_a_plan_is_not_relaunched(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys; sys.exit(75)")
    proc = subprocess.run(
        [sys.executable, "-m", "monitor_client.relaunch", "--dir", str(tmp_path), "--",
         sys.executable, str(script)], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "client")})
    assert proc.returncode == 75 and "holds no plan it can take: not relaunching" in proc.stderr


def test_a_plan_waiting_when_it_starts_is_taken_at_once(tmp_path):
    (tmp_path / "monitor_rollback.json").write_text(json.dumps({
        "id": 4, "number": 1, "checkpoint_path": "c-7", "ckpt_path": "c-7"}))
    code, launches, said = _relaunch(tmp_path, ROLLBACKS="0")
    assert code == 0 and [launch["argv"] for launch in launches] == [["--lr", "1",
                                                                     "--ckpt_path=c-7"]]
    assert launches[0]["plan"] == str(tmp_path / "monitor_rollback.4.json")


def _launch_with(tmp_path: Path, plan_file: Path) -> subprocess.CompletedProcess:
    """The helper over a command that exits 75 as soon as it runs, ``plan_file`` being
    what it finds as ``monitor_rollback.json`` (left before it starts)."""
    script = tmp_path / "train.py"
    script.write_text("import sys; sys.exit(75)")
    return subprocess.run(
        [sys.executable, "-m", "monitor_client.relaunch", "--dir", str(plan_file.parent), "--",
         sys.executable, str(script)], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "client")})


def test_a_plan_file_that_is_a_symlink_to_a_fifo_is_refused_not_waited_on(tmp_path):
    # A plain open() of the FIFO blocks until a writer comes: the helper hung forever.
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "monitor_rollback.json").symlink_to(tmp_path / "pipe")
    proc = _launch_with(tmp_path, tmp_path / "monitor_rollback.json")
    assert proc.returncode == 75, proc.stderr
    assert "plan file refused" in proc.stderr and "symlink: not followed" in proc.stderr
    assert "holds no plan it can take: not relaunching" in proc.stderr


def test_a_plan_file_past_the_size_bound_is_refused_unread(tmp_path):
    # A valid plan padded past 4 MiB: read whole before, and relaunched from (a 1.5 GB one
    # died with MemoryError); refused now from its size alone.
    plan = {"id": 1, "number": 1, "checkpoint_path": "c-1", "resume_from_checkpoint": "c-1",
            "message": "x" * (5 << 20)}
    (tmp_path / "monitor_rollback.json").write_text(json.dumps(plan))
    proc = _launch_with(tmp_path, tmp_path / "monitor_rollback.json")
    assert proc.returncode == 75, proc.stderr
    assert "bytes, more than 4194304" in proc.stderr
    assert "relaunching" not in proc.stderr.replace("not relaunching", "")
