"""The demo's trainer runs from the package alone: no examples/, no checkout beside it.

The package and the client are copied into an empty directory, as a wheel install would lay
them out, and the trainer is run from there as ``monitor-agent demo`` runs it
(``python -m monitor_agent.tools.demo_gpt``) against a real sidecar.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _installed_copy(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "monitor_agent", site / "monitor_agent", ignore=ignore)
    shutil.copytree(REPO / "client" / "monitor_client", site / "monitor_client", ignore=ignore)
    return site


def test_packaged_trainer_trains_and_pages_nan_without_the_checkout(sidecar, tmp_path):
    site = _installed_copy(tmp_path)
    # Neither the checkout's sources (examples/, client/, monitor_agent/) on the path, nor any
    # module loaded from them. The interpreter's own prefix is not the checkout even when it
    # lies inside it: README's setup puts the venv at .venv/, and torch loads from there.
    code = textwrap.dedent(f"""
        import runpy, sys
        def checkout(path):
            return path.startswith({str(REPO)!r}) and not path.startswith(sys.prefix)
        if any(checkout(p) for p in sys.path):
            sys.exit("checkout on sys.path: " + repr(sys.path))
        try:
            runpy.run_module("monitor_agent.tools.demo_gpt", run_name="__main__")
        except SystemExit as exc:
            status = exc.code
        files = [getattr(m, "__file__", None) or "" for m in list(sys.modules.values())]
        if [f for f in files if checkout(f)]:
            sys.exit("modules loaded from the checkout: " + repr([f for f in files if checkout(f)]))
        sys.exit(status)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", code, "--url", sidecar.url, "--run-id", "pkg-demo",
         "--spool-dir", str(tmp_path / "spool"), "--steps", "12", "--inject", "nan",
         "--inject-step", "8", "--nan-patience", "3", "--threads", "1",
         "--peak-flops", "1e11", "--progress", "--quiet"],
        capture_output=True, text=True, cwd=tmp_path, timeout=180,
        env={**os.environ, "PYTHONPATH": str(site)})
    # The trainer's own exit status for "stopped on NaN" is 1; a string exit (above) is also 1,
    # so the first line of output proves the trainer ran before anything else is read.
    assert proc.stdout.startswith("step 1/12 loss "), (proc.stdout[-2000:], proc.stderr[-3000:])
    assert proc.returncode == 1, proc.stderr[-3000:]
    records = sidecar.records("pkg-demo")
    steps = {r["step"]: r for r in records if r["kind"] == "step"}
    assert sorted(steps) == list(range(1, 11))  # NaN from step 8, stopped after 3 of them
    assert steps[8]["loss"] == "NaN" and isinstance(steps[7]["loss"], float)


def test_demo_finds_its_trainer_in_an_installed_layout(tmp_path):
    site = _installed_copy(tmp_path)
    code = ("from monitor_agent.tools import demo; "
            "print(demo._trainer_path(), demo._missing_trainer_packages())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)},
                         timeout=60, check=True).stdout
    assert out.strip() == f"{[str(site)]} []"
