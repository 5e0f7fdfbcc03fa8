"""The import graph: dependencies point one way and nothing imports in a circle.

docs/architecture.md: api -> reads -> pipeline -> runs -> (detectors, alerting -> notify) ->
storage / records. Every module of the sidecar sits on a layer below; a module may import
only from a lower layer or from its own package. Imports inside functions and under
``TYPE_CHECKING`` count as well: a lazy import that breaks a cycle at run time still ties
the two files together for a reader.

A new module must be placed in ``LAYERS`` (the test says so): that is where a newcomer reads
what may depend on what.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"monitor_agent": ROOT / "monitor_agent",
            "monitor_client": ROOT / "client" / "monitor_client"}

# Lowest first. A key is a module, or a package standing for everything inside it.
LAYERS: dict[str, int] = {
    # The one base of the sidecar's errors, which each package's own error derives from:
    # below everything (numbered so that no other layer moves).
    "errors": -1,
    # The record and its wire form: knows nothing but the format and its budgets.
    "records": 0,
    # SQLite behind one helper and one error type; metric names and self-metrics.
    "storage": 1, "metrics": 1,
    # Delivery knows a Notification and nothing of rules; detectors know records.
    "notify": 2, "detectors": 2,
    "alerting": 3,
    # One run, one brain: which sidecar leads a multi-node run, the digests and the link
    # to the leader (no rules, no engine: those are handed in).
    "cluster": 3,
    # The chart history: a copy of the stored records folded for charts. It knows records,
    # storage and the detectors' maths (the loss EMA, eval categories, the update bands),
    # nothing of alerts or the engine: its indexer reads the record store's file on a
    # connection of its own, so the pipeline never feeds it; api serves it, tools report it.
    "history": 3,
    # A run's own facts (its state, progress, verdict, checkpoints, lifecycle, goodput),
    # written by the pipeline and read by the read side.
    "runs": 4,
    "settings": 4,
    # The write path: records and the clock in, live runs, durability.
    "pipeline": 5,
    # The read side: queries and views of runs, and run state rendered for /metrics.
    "reads": 6,
    # The edges: HTTP, pages, the app that wires them, tools, the command line.
    "api": 7, "ui": 8, "serving": 9, "tools": 10, "cli": 11, "__main__": 12,
}


def _modules(package: str) -> dict[str, Path]:
    base = PACKAGES[package]
    out = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(base).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join((package, *parts))] = path
    return out


def _imports(module: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """Every module an import in the file loads, at any depth of the syntax tree.

    ``from pkg import sub`` names the submodule, not the package's ``__init__``;
    ``from pkg import name`` (an attribute) names the package.
    """
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in modules else base


def _graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports."""
    modules = _modules(package)
    return {m: {name for name in _imports(m, p, modules) if name in modules and name != m}
            for m, p in modules.items()}


def _layer(module: str) -> tuple[str, int]:
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return key, LAYERS[key]
    raise KeyError(module)


def test_every_module_has_a_layer() -> None:
    missing = []
    for module in _modules("monitor_agent"):
        if module == "monitor_agent":
            continue
        try:
            _layer(module)
        except KeyError:
            missing.append(module)
    assert not missing, f"place these in tests/test_architecture.py LAYERS: {missing}"


def test_imports_point_down() -> None:
    graph = _graph("monitor_agent")
    wrong = []
    for src, targets in graph.items():
        if src == "monitor_agent":
            continue
        home, level = _layer(src)
        for dst in targets:
            if dst == "monitor_agent":
                continue  # the version string
            their_home, their_level = _layer(dst)
            if their_home != home and their_level >= level:
                wrong.append(f"{src} (layer {level}) imports {dst} (layer {their_level})")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(sorted(wrong))


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycles(package: str) -> None:
    graph = _graph(package)
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_client_stands_alone() -> None:
    """The client installs without the sidecar: it never imports it."""
    modules = _modules("monitor_client")
    found = [f"{m}: {name}" for m, p in modules.items()
             for name in _imports(m, p, modules) if name.split(".")[0] == "monitor_agent"]
    assert not found, found


def test_every_public_client_module_is_named_in_the_architecture_doc() -> None:
    """A module without ``_`` is API a user may import: docs/architecture.md lists them all,
    and the package's docstring, where a user reads first, names each one too."""
    public = sorted(p.stem for p in PACKAGES["monitor_client"].glob("*.py")
                    if not p.stem.startswith("_"))
    assert public, "no public client module found"
    doc = (ROOT / "docs" / "architecture.md").read_text()
    listed = doc[doc.index("Client modules other than"):].split("are private")[0]
    init = (PACKAGES["monitor_client"] / "__init__.py").read_text()
    missing = [m for m in public if f"`{m}`" not in listed or f"monitor_client.{m}" not in init]
    assert not missing, f"public client modules not named in docs/architecture.md " \
                        f"and monitor_client's docstring: {missing}"


def test_the_architecture_doc_names_the_client_modules_as_they_are() -> None:
    """The drift the other way (the page said ``config`` once the module was ``settings``):
    its list of public modules is exactly the package's; the client's paragraph names every
    module the public API comes from (each ``from monitor_client.X import`` of the package
    root); and each client module it names, ``_x`` or ``client/monitor_client/x.py``, is a
    file of the package."""
    package = PACKAGES["monitor_client"]
    public = {p.stem for p in package.glob("*.py") if not p.stem.startswith("_")}
    doc = (ROOT / "docs" / "architecture.md").read_text()
    listed = doc[doc.index("Client modules other than"):].split("are private")[0]
    assert set(re.findall(r"`(\w+)`", listed)) - {"__all__"} == public
    paragraph = doc[doc.index("The client, `client/monitor_client/`"):].split("\n\n")[0]
    named = set(re.findall(r"`(\w+)`", paragraph))
    init = ast.parse((package / "__init__.py").read_text())
    sources = {node.module.split(".")[1] for node in init.body
               if isinstance(node, ast.ImportFrom) and node.module
               and node.module.startswith("monitor_client.")}
    assert sources - named == set(), "modules of the public API the paragraph does not name"
    said = {n for n in named if n.startswith("_")} | set(
        re.findall(r"client/monitor_client/(\w+)\.py", doc))
    assert sorted(n for n in said if not (package / f"{n}.py").is_file()) == []


def _routers(modules: dict[str, Path]) -> set[str]:
    """The modules that define a FastAPI router: the routes, as opposed to the plumbing."""
    return {m for m, p in modules.items() if "router = APIRouter(" in p.read_text()}


def router_imports(modules: dict[str, Path]) -> list[str]:
    routers = _routers(modules)
    return [f"{m} imports {name}" for m in sorted(routers)
            for name in _imports(m, modules[m], modules) if name in routers - {m}]


def test_no_router_imports_a_router(tmp_path: Path) -> None:
    """A route's module shares with another route only through the plumbing beneath them
    (api/body.py, record_batch.py, deps.py, ...): a route stays readable on its own, and
    moving one never drags another."""
    modules = _modules("monitor_agent")
    assert len(_routers(modules)) >= 10, sorted(_routers(modules))
    assert router_imports(modules) == []
    fake = tmp_path / "x.py"  # and the check finds one that does
    fake.write_text("from monitor_agent.api.ingest import router as r\nrouter = APIRouter(r)\n")
    breaking = {**modules, "monitor_agent.api.x": fake}
    assert router_imports(breaking) == ["monitor_agent.api.x imports monitor_agent.api.ingest"]


def test_the_checks_catch_a_cycle_and_an_upward_import() -> None:
    """The helpers above find what they are meant to find (a test that cannot fail is none)."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _layer("monitor_agent.notify.slack") == ("notify", 2)
    assert _layer("monitor_agent.alerting.rules")[1] > _layer("monitor_agent.notify.base")[1]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_path_through(graph, sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _path_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A readable cycle inside one component: from its first module back to itself."""
    members, start = set(component), component[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in members)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return [*path, start]
        step = next((w for w in nxt if w not in seen), None)
        if step is None:
            return [*path, start]
        path.append(step)
        seen.add(step)


# The storage boundary: only storage may mention sqlite3. Every other store (alerting's, the
# outbox, the chart history) reaches SQLite through its ``Database``, ``Connection`` and
# ``Row``, and everything above catches ``StorageError`` (storage/database.py).
SQLITE_OWNERS = (
    "storage/",  # the one helper (database.py), the record store, export
)


def _mentions_of_sqlite3(allowed: tuple[str, ...]) -> list[str]:
    """``file:line: text`` for every line outside ``allowed`` (paths under monitor_agent/, a
    trailing slash for a package) that says sqlite3: an import, an except, a type, a word."""
    root = PACKAGES["monitor_agent"]
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(rel.startswith(a) if a.endswith("/") else rel == a for a in allowed):
            continue
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if "sqlite3" in line:
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_nothing_above_the_storage_boundary_mentions_sqlite3() -> None:
    found = _mentions_of_sqlite3(SQLITE_OWNERS)
    assert not found, ("catch StorageError (monitor_agent/storage/database.py), not "
                       "sqlite3.Error; SQL belongs in a store:\n" + "\n".join(found))
    # The check can fail: without the list, the helper's own module is found.
    assert any(f.startswith("storage/database.py:") for f in _mentions_of_sqlite3(()))


def _classes(package: str) -> dict[str, list[str]]:
    """Top-level class name -> the modules of ``package`` that define one by that name."""
    defined: dict[str, list[str]] = {}
    for module, path in _modules(package).items():
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(module)
    return defined


def test_each_class_name_means_one_thing() -> None:
    """A class name names one concept: no two modules of the sidecar define a top-level
    class of the same name, and the client shares none with the sidecar (a reader who
    knows ``RunContext`` or ``Outcome`` from one file must not meet another elsewhere).
    Where two things are alike, one derives from the other, as ``AlertOut`` from
    ``AlertView``."""
    sidecar, client = _classes("monitor_agent"), _classes("monitor_client")
    twice = {name: modules for name, modules in sidecar.items() if len(modules) > 1}
    assert not twice, f"one class name, several definitions (rename one): {twice}"
    shared = {name: [*sidecar[name], *client[name]] for name in sorted(sidecar.keys() & client)}
    assert not shared, f"the sidecar and the client define the same class names: {shared}"


def _store_readers(package: str) -> list[str]:
    """Modules under ``package`` that take the record store's ``Store`` (to read it)."""
    found = []
    for module, path in _modules("monitor_agent").items():
        if not module.startswith(f"monitor_agent.{package}"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "monitor_agent.storage") and any(a.name == "Store" for a in node.names):
                found.append(module)
    return found


def test_a_runs_facts_read_no_storage() -> None:
    """runs/ holds a run's facts; what the store keeps of them is read below the pipeline
    and handed in (``pipeline/recovery.py`` ``stored_ledger``), so following a record's
    calls never goes down into the store from runs/ and back up (issue 46). Its stored
    row types (``StoredAttempt``) are data, and may be named."""
    assert not _store_readers("runs"), _store_readers("runs")
    assert _store_readers("pipeline")  # the check finds a reader where there is one


def test_a_runs_version_moves_in_one_place() -> None:
    """``RunState.changed`` says what a version bump means (a reader's view of the run
    moved); nothing else bumps ``version`` by hand (issue 46)."""
    bumps = [f"{path.relative_to(ROOT)}:{n}"
             for path in sorted((ROOT / "monitor_agent").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if "version += 1" in line]
    assert bumps == ["monitor_agent/runs/run_state.py:" + bumps[0].rpartition(":")[2]], bumps
