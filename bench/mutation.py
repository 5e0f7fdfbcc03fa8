"""A mutation score for core modules (issue 51): how many one-line breaks of a module its own
tests catch. mutmut (a well-kept mutation tester) breaks each line of the module in turn (an
operator, a constant, a comparison, a call's argument) and runs the tests that cover it; a
mutant the tests pass on "survived": a break nobody would notice.

Runs in a scratch copy of the checkout (mutmut writes its ``mutants/`` tree beside the code),
one module at a time, with the module's own tests. A bench, not a test: it takes minutes a
module on 2 cores, and its figure is read, not asserted. ``pip install mutmut`` first (not a
dependency of the project).

    python -m bench.mutation                        # every module below
    python -m bench.mutation --module notify/fairness.py --children 2
    python -m bench.mutation --survivors            # and list what survived

The score is killed / (killed + survived + timeout): mutants no test reaches ("no tests")
are counted apart, as they are the coverage's gap rather than the tests' blindness.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# module (under monitor_agent/) -> the tests that are its own.
MODULES: dict[str, list[str]] = {
    "notify/fairness.py": ["tests/notify/test_outbox_fairness.py", "tests/notify/test_outbox.py"],
    "notify/outbox.py": ["tests/notify/test_outbox.py", "tests/notify/test_outbox_fairness.py",
                         "tests/notify/test_outbox_policy.py"],
    "alerting/rollback.py": ["tests/alerting/test_rollback.py", "tests/api/test_rollback_windows.py",
                             "tests/api/test_rollback_skips_by.py",
                             "tests/api/test_rollback_refused.py",
                             "tests/api/test_rollback_revision.py"],
    "api/peer.py": ["tests/api/test_peer.py"],
    "runs/goodput.py": ["tests/runs/test_goodput_ledger.py", "tests/runs/test_goodput_causes.py",
                        "tests/runs/test_ettr.py", "tests/api/test_goodput.py"],
}
COPIED = ("monitor_agent", "client", "tests", "pyproject.toml")


def _config(module: str, tests: list[str]) -> str:
    return "\n".join([
        "", "[tool.mutmut]", 'source_paths = ["monitor_agent"]',
        f'only_mutate = ["monitor_agent/{module}"]',
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        'pytest_add_cli_args = ["-n", "0", "-q", "-p", "no:cacheprovider"]',
        'also_copy = ["client"]', ""])


def run(module: str, tests: list[str], children: int, survivors: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        work = Path(tmp)
        for name in COPIED:
            src = REPO / name
            if src.is_dir():
                shutil.copytree(src, work / name, ignore=shutil.ignore_patterns(
                    "__pycache__", "*.egg-info", ".pytest_cache"))
            else:
                shutil.copy(src, work / name)
        with (work / "pyproject.toml").open("a") as f:
            f.write(_config(module, tests))
        env = {**os.environ, "MONITOR_TEST_TIME_SCALE": os.environ.get(
            "MONITOR_TEST_TIME_SCALE", "3")}
        env.pop("CI", None)  # tests/ci_strict.py: a bench's machine may lack a binary
        t0 = time.monotonic()
        done = subprocess.run(["mutmut", "run", "--max-children", str(children)], cwd=work,
                              env=env, capture_output=True, text=True)
        elapsed = time.monotonic() - t0
        if done.returncode != 0:
            sys.exit(f"mutmut failed on {module}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        subprocess.run(["mutmut", "export-cicd-stats"], cwd=work, env=env,
                       capture_output=True, check=True)
        stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
        stats["seconds"] = elapsed
        if survivors:
            listed = subprocess.run(["mutmut", "results"], cwd=work, env=env,
                                    capture_output=True, text=True).stdout
            stats["survivors"] = [ln.strip() for ln in listed.splitlines() if ln.strip()]
        return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", action="append", choices=sorted(MODULES),
                    help="a module under monitor_agent/ (repeat; default: all)")
    ap.add_argument("--children", type=int, default=2, help="parallel test runs")
    ap.add_argument("--survivors", action="store_true", help="list the surviving mutants")
    args = ap.parse_args()
    if shutil.which("mutmut") is None:
        sys.exit("mutmut not installed: pip install mutmut")
    print(f"{'module':24} {'mutants':>7} {'killed':>6} {'survived':>8} {'timeout':>7} "
          f"{'no tests':>8} {'score':>6} {'time':>7}")
    for module in args.module or sorted(MODULES):
        s = run(module, MODULES[module], args.children, args.survivors)
        judged = s["killed"] + s["survived"] + s["timeout"]
        score = s["killed"] / judged if judged else float("nan")
        print(f"{module:24} {s['total']:7d} {s['killed']:6d} {s['survived']:8d} "
              f"{s['timeout']:7d} {s['no_tests']:8d} {score:6.1%} {s['seconds']:6.0f}s",
              flush=True)
        for line in s.get("survivors", []):
            print("   ", line)


if __name__ == "__main__":
    main()
