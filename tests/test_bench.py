"""bench/ is a package of scripts that measure, run from the repository root as ``python -m
bench.X``, the way the tests run: the code it measures comes from the install and the
checkout, never from a ``sys.path`` edit, and a script reaches another script or a test
helper only through public names (what several share is one module's public name:
``bench.harness``, ``bench.precision``, ``tests.sidecar_process``, ...). A private name is
its module's own business: importing it from elsewhere ties the two files together where no
reader of the first looks. The recorders of the test corpora measure nothing and live with
the corpora, in the package ``scripts.traces`` (``python -m scripts.traces.record_traces``),
held to the same rules."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PACKAGES = {"bench": BENCH, "scripts.traces": ROOT / "scripts" / "traces"}
# The code under measurement: a benchmark may time its internals (the client's hooks, the
# guard's decision) by their private names; nothing else's.
MEASURED = ("monitor_agent", "monitor_client")


def scripts(folder: Path = BENCH) -> dict[str, Path]:
    return {p.stem: p for p in sorted(folder.glob("*.py")) if p.stem != "__init__"}


def sys_path_edits(path: Path) -> list[str]:
    """Each use of ``sys.path`` (insert, slice assignment, append, a loop over it)."""
    lines = {node.lineno for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "path"
             and isinstance(node.value, ast.Name) and node.value.id == "sys"}
    return [f"{path.name}:{line}" for line in sorted(lines)]


def foreign_imports(path: Path, siblings: set[str]) -> list[str]:
    """Imports of a private name (from anything but the measured packages), and of a sibling
    script by its bare name (which resolves only with bench/ itself on ``sys.path``)."""
    found: list[str] = []
    nodes = sorted((n for n in ast.walk(ast.parse(path.read_text()))
                    if isinstance(n, ast.Import | ast.ImportFrom)), key=lambda n: n.lineno)
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            root = node.module.split(".")[0]
            if root in siblings:
                found.append(f"{path.name}:{node.lineno}: from {node.module} (bare name)")
            elif root not in MEASURED:
                found += [f"{path.name}:{node.lineno}: {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno}: import {a.name} (bare name)"
                      for a in node.names if a.name.split(".")[0] in siblings]
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_script_edits_sys_path(package: str) -> None:
    found = [edit for path in scripts(PACKAGES[package]).values() for edit in sys_path_edits(path)]
    assert found == [], found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_script_imports_another_scripts_private_names_or_a_sibling_bare(package: str) -> None:
    siblings = set(scripts(PACKAGES[package]))
    found = [hit for path in scripts(PACKAGES[package]).values()
             for hit in foreign_imports(path, siblings)]
    assert found == [], found


def test_the_checks_catch_an_edit_a_private_import_and_a_bare_sibling(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nsys.path.insert(0, 'x')\nsys.path[:0] = ['y']\n"
                   "from bench.harness import _private, sync\n"
                   "from tests.e2e.test_rank_faults import _job\n"
                   "from harness import build\nimport ingest\n"
                   "from amplification import _peak_mib\n"
                   "from monitor_client._stats import GradStats, _spy\n")  # measured: allowed
    assert sys_path_edits(bad) == ["bad.py:2", "bad.py:3"]
    assert foreign_imports(bad, {"harness", "ingest"}) == [
        "bad.py:4: bench.harness._private", "bad.py:5: tests.e2e.test_rank_faults._job",
        "bad.py:6: from harness (bare name)", "bad.py:7: import ingest (bare name)",
        "bad.py:8: amplification._peak_mib"]


def test_every_script_imports_as_a_module_from_the_checkout() -> None:
    """What ``python -m bench.X`` (or ``scripts.traces.X``) does first, in a fresh
    interpreter at the repository root with nothing on ``PYTHONPATH``: bench, scripts.traces
    and tests are packages there, so every script's imports resolve (the measured code from
    the install)."""
    assert all((folder / "__init__.py").is_file() for folder in PACKAGES.values())
    assert (ROOT / "tests" / "__init__.py").is_file()
    names = [f"{package}.{name}" for package, folder in PACKAGES.items()
             for name in scripts(folder)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", f"import importlib\nfor n in {names!r}: importlib.import_module(n)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_leader_load_speaks_to_the_peer_door_with_the_link_credential(tmp_path: Path) -> None:
    """bench/leader_load.py's simulated node sidecars reach a real leader's peer door: with
    the link's own credential, derived from the write token as a node sidecar derives it
    (the door refuses the write token itself since it was closed against hostile input;
    a bench still sending it measured a leader that answered 401 to every node)."""
    import gzip

    import httpx

    from bench.cluster_load import TOKEN
    from bench.leader_load import PEER_HEADERS
    from monitor_agent.records import wire
    from monitor_agent.settings import Settings
    from tests.live_server import LiveServer

    exchange = {"sidecar": "bench-node-1", "records": [], "findings": [],
                "runs": [{"run_id": "leader-load", "node": 1, "ranks": [8], "known_action": 0}]}
    with LiveServer(Settings(data_dir=tmp_path, token=TOKEN)) as srv:
        r = httpx.post(srv.url + "/v1/peer/digests", headers=PEER_HEADERS,
                       content=gzip.compress(wire.dumps(exchange)), timeout=30)
    assert r.status_code == 200, r.text
