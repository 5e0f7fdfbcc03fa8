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

The score is killed / (killed + survived + timeout - equivalent): mutants no test reaches
("no tests") are counted apart, as they are the coverage's gap rather than the tests'
blindness, and the mutants listed in ``mutation_equivalent.toml`` (beside this script), each
with one line why no input can tell it from the module, are left out of the score and
counted in the ``equiv`` column. A listed mutant that a test kills is reported: the list is
stale (mutmut numbers a function's mutants in order, so an edit of the function renumbers
them).

    python -m bench.mutation --module notify/outbox.py --children 1 --keep /tmp/mut-outbox
    python -m bench.mutation --module notify/outbox.py --children 1 --keep /tmp/mut-outbox \
        --again   # after adding tests: copy them in, check again what was not killed

``--again`` reuses a kept run whose copy of the module is byte for byte the checkout's and
whose tests are the module's tests in MODULES (otherwise it runs everything again: mutmut
maps each function to the tests that reach it once, from the test files it was given), the
rest of the checkout copied afresh: killed mutants stay killed when tests are only added.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# module -> the tests that are its own. A module is named by its path under monitor_agent/,
# or, for the client's, by its path in the checkout (client/monitor_client/...).
MODULES: dict[str, list[str]] = {
    "notify/fairness.py": ["tests/notify/test_outbox_fairness.py", "tests/notify/test_outbox.py"],
    "notify/outbox.py": ["tests/notify/test_outbox.py", "tests/notify/test_outbox_fairness.py",
                         "tests/notify/test_outbox_policy.py"],
    "alerting/rollback.py": ["tests/alerting/test_rollback.py", "tests/api/test_rollback_windows.py",
                             "tests/api/test_rollback_skips_by.py",
                             "tests/api/test_rollback_refused.py",
                             "tests/api/test_rollback_revision.py"],
    "api/peer.py": ["tests/api/test_peer.py"],
    "alerting/restart.py": ["tests/alerting/test_restart_decide.py",
                            "tests/alerting/test_restart_pages.py"],
    "alerting/rule_actions.py": ["tests/alerting/test_alerting_actions.py",
                                 "tests/alerting/test_rollback.py",
                                 "tests/alerting/test_restart_decide.py",
                                 "tests/alerting/test_restart_actions.py"],
    "cluster/drain.py": ["tests/cluster/test_drain.py", "tests/deploy/test_kubernetes_healing.py",
                         "tests/cluster/test_restart_placement.py"],
    "runs/goodput.py": ["tests/runs/test_goodput_ledger.py", "tests/runs/test_goodput_causes.py",
                        "tests/runs/test_ettr.py", "tests/api/test_goodput.py"],
    "detectors/divergence.py": ["tests/detectors/test_divergence.py"],
    "detectors/nan_inf.py": ["tests/detectors/test_nan_inf.py"],
    "detectors/loss_spike.py": ["tests/detectors/test_loss_spike.py"],
    "detectors/grad_explosion.py": ["tests/detectors/test_grad_explosion.py"],
    "detectors/hang.py": ["tests/detectors/test_hang.py"],
    "detectors/crashed.py": ["tests/detectors/test_crashed.py"],
    "detectors/not_learning.py": ["tests/detectors/test_not_learning.py"],
    "detectors/straggler.py": ["tests/detectors/test_straggler.py"],
    "runs/lifecycle.py": ["tests/runs/test_run_lifecycle.py"],
    # test_cpu_bounds.py's two ledger tests only (its resume tests take 20 s a run).
    "runs/checkpoint_ledger.py": [
        "tests/runs/test_checkpoint_ledger.py",
        "tests/pipeline/test_cpu_bounds.py::test_a_checkpoint_flood_judges_each_checkpoint_once",
        "tests/pipeline/test_cpu_bounds.py::test_the_incremental_ledger_judges_as_the_rule_does"],
    "alerting/episodes.py": ["tests/alerting/test_episodes.py", "tests/alerting/test_service.py",
                             "tests/alerting/test_related.py", "tests/alerting/test_sink.py",
                             "tests/alerting/test_alerting_actions.py",
                             "tests/alerting/test_rollback.py",
                             "tests/alerting/test_restart_actions.py",
                             "tests/alerting/test_restart_decide.py",
                             "tests/notify/test_outbox_fairness.py"],
    "alerting/rules.py": ["tests/alerting/test_rules.py"],
    "client/monitor_client/_guard.py": ["tests/client/test_guard.py",
                                        "tests/client/test_guard_band.py"],
    "client/monitor_client/_agreement.py": ["tests/client/test_agreement.py",
                                            "tests/client/test_rollback_plan.py",
                                            "tests/client/test_control.py"],
}
CLIENT = "client/monitor_client/"
# The scratch copy's layout: the client's package at its top, beside monitor_agent, and
# client/ without it. mutmut names a mutant after its file's path (a file under client/
# would be "client.monitor_client.x", a module no test imports) and puts only mutants/ on
# sys.path; and the tests' subprocesses, on PYTHONPATH=client:., then import the mutated
# package too, not an unmutated copy under client/.
# deploy/: what tests/deploy reads (cluster/drain.py's state file, read by the Node Problem
# Detector plugin there).
COPIED = ("monitor_agent", "monitor_client", "client", "tests", "deploy", "pyproject.toml")


def _source(module: str) -> Path:
    """The module's file in the scratch copy (``monitor_client/_guard.py``)."""
    if module.startswith(CLIENT):
        return Path(module).relative_to("client")
    return Path("monitor_agent") / module


def _config(module: str, tests: list[str]) -> str:
    package = _source(module).parts[0]
    other = "monitor_client" if package == "monitor_agent" else "monitor_agent"
    return "\n".join([
        "", "[tool.mutmut]", f"source_paths = [{json.dumps(package)}]",
        f"only_mutate = [{json.dumps(str(_source(module)))}]",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        'pytest_add_cli_args = ["-n", "0", "-q", "-p", "no:cacheprovider"]',
        f'also_copy = ["client", "deploy", {json.dumps(other)}]', ""])


def equivalents() -> dict[str, dict[str, str]]:
    """module -> mutant name -> why it is equivalent (``mutation_equivalent.toml``)."""
    path = Path(__file__).with_name("mutation_equivalent.toml")
    return tomllib.loads(path.read_text()) if path.exists() else {}


def _copy(work: Path, names: tuple[str, ...]) -> None:
    """Copy ``names`` of the checkout into ``work``, in COPIED's layout."""
    for name in names:
        src = REPO / (CLIENT.rstrip("/") if name == "monitor_client" else name)
        dst = work / name
        if src.is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(
                "__pycache__", "*.egg-info", ".pytest_cache",
                *(["monitor_client"] if name == "client" else [])))
        else:
            shutil.copy(src, dst)


def _statuses(work: Path, module: str) -> dict[str, str]:
    """mutant name -> mutmut's status (killed, survived, no tests, timeout, ...)."""
    from mutmut.stats import status_by_exit_code  # a bench's tool: imported when run

    meta = json.loads((work / "mutants" / f"{_source(module)}.meta").read_text())
    return {name: status_by_exit_code[code]
            for name, code in meta["exit_code_by_key"].items()}


def _globs(functions: list[str]) -> list[str]:
    """mutmut's names of a function's mutants: ``pkg.mod.x_f__mutmut_3`` for a function,
    ``pkg.mod.xǁClassǁf__mutmut_3`` for a method."""
    return [g for f in functions for g in (f"*.x_{f}__mutmut_*", f"*ǁ{f}__mutmut_*")]


def run(module: str, tests: list[str], children: int, keep: Path | None, again: bool,
        functions: list[str]) -> tuple[dict[str, str], float]:
    """Mutate ``module``, run its tests on each mutant (of ``functions`` only, if named);
    each mutant's status and the seconds."""
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        work = keep or Path(tmp)
        src = _source(module)
        checkout = REPO / module if module.startswith(CLIENT) else REPO / src
        config = (REPO / "pyproject.toml").read_text() + _config(module, tests)
        reuse = again and (work / "mutants" / f"{src}.meta").exists() \
            and (work / src).read_bytes() == checkout.read_bytes() \
            and (work / "pyproject.toml").read_text() == config
        if reuse:  # the rest of the checkout afresh (the module is the same byte for byte)
            _copy(work, tuple(n for n in COPIED if n != "pyproject.toml"))
            todo = [n for n, st in _statuses(work, module).items() if st != "killed"
                    and (not functions or any(fnmatch.fnmatchcase(n, g) for g in _globs(functions)))]
        else:
            if work.exists():
                shutil.rmtree(work)
            work.mkdir(parents=True)
            _copy(work, COPIED)
            (work / "pyproject.toml").write_text(config)
            todo = _globs(functions)
        env = {**os.environ, "MONITOR_TEST_TIME_SCALE": os.environ.get(
            "MONITOR_TEST_TIME_SCALE", "3")}
        env.pop("CI", None)  # tests/ci_strict.py: a bench's machine may lack a binary
        # mutmut forks each mutant's test run from a process that has run the tests: a
        # torch that had started its OpenMP threads there hangs in the child for good (a
        # lock held by a thread that was not forked), and the mutant reads as a timeout.
        env["OMP_NUM_THREADS"] = "1"
        t0 = time.monotonic()
        done = subprocess.run([_mutmut() or "mutmut", "run", "--max-children", str(children),
                               *todo],
                              cwd=work, env=env, capture_output=True, text=True)
        elapsed = time.monotonic() - t0
        if done.returncode != 0:
            sys.exit(f"mutmut failed on {module}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        status = _statuses(work, module)
        if functions:
            status = {n: st for n, st in status.items()
                      if any(fnmatch.fnmatchcase(n, g) for g in _globs(functions))}
        return status, elapsed


def _mutmut() -> str | None:
    """The mutmut script beside this interpreter (a virtual environment used without
    activating it), else on PATH."""
    here = str(Path(sys.executable).parent)
    return shutil.which("mutmut", path=os.pathsep.join([here, os.environ.get("PATH", "")]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", action="append", choices=sorted(MODULES),
                    help="a module under monitor_agent/, or client/monitor_client/... "
                    "(repeat; default: all)")
    ap.add_argument("--children", type=int, default=2, help="parallel test runs")
    ap.add_argument("--survivors", action="store_true",
                    help="list the mutants not killed and not listed as equivalent")
    ap.add_argument("--keep", type=Path, help="run in this folder and keep it (one module)")
    ap.add_argument("--again", action="store_true",
                    help="with --keep: check again only what the kept run did not kill")
    ap.add_argument("--function", action="append", default=[],
                    help="only this function's or method's mutants (repeat; one --module)")
    args = ap.parse_args()
    modules = args.module or sorted(MODULES)
    if _mutmut() is None:
        sys.exit("mutmut not installed: pip install mutmut")
    if (args.keep or args.function) and len(modules) != 1:
        sys.exit("--keep and --function take one --module")
    listed = equivalents()
    print(f"{'module':35} {'mutants':>7} {'killed':>6} {'survived':>8} {'timeout':>7} "
          f"{'no tests':>8} {'equiv':>5} {'score':>6} {'time':>7}")
    for module in modules:
        status, seconds = run(module, MODULES[module], args.children, args.keep, args.again,
                              args.function)
        equiv = listed.get(module, {})
        count = {k: sum(st == k for st in status.values())
                 for k in ("killed", "survived", "timeout", "no tests")}
        excluded = sum(status.get(name) in ("survived", "timeout") for name in equiv)
        judged = count["killed"] + count["survived"] + count["timeout"] - excluded
        score = count["killed"] / judged if judged else float("nan")
        print(f"{module:35} {len(status):7d} {count['killed']:6d} {count['survived']:8d} "
              f"{count['timeout']:7d} {count['no tests']:8d} {excluded:5d} {score:6.1%} "
              f"{seconds:6.0f}s", flush=True)
        for name in sorted(equiv):
            if args.function and not any(fnmatch.fnmatchcase(name, g)
                                         for g in _globs(args.function)):
                continue  # not among the functions checked
            if name not in status or status[name] == "killed":
                print(f"    listed as equivalent but {status.get(name, 'not a mutant')}: {name}")
        if args.survivors:
            for name, st in status.items():
                if st != "killed" and name not in equiv:
                    print(f"    {name}: {st}")


if __name__ == "__main__":
    main()
