"""One error hierarchy: every exception class the sidecar defines derives from
``MonitorAgentError`` (monitor_agent/errors.py), through its package's own error, so the
command line catches one type, once (tests/test_cli.py holds its messages)."""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

from monitor_agent.errors import MonitorAgentError

ROOT = Path(__file__).resolve().parents[1] / "monitor_agent"
BUILTIN_ERRORS = {name for name, obj in vars(builtins).items()
                  if isinstance(obj, type) and issubclass(obj, BaseException)}


def _exception_classes() -> list[tuple[str, str]]:
    """(module, class) for every top-level class deriving, by name, from an exception:
    a builtin one, or one found here (repeated until nothing new turns up)."""
    classes = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                         for b in node.bases}
                classes.append((module, node.name, bases))
    known = set(BUILTIN_ERRORS)
    while True:
        found = {name for _, name, bases in classes if bases & known} - known
        if not found:
            break
        known |= found
    return [(module, name) for module, name, bases in classes if bases & known]


def test_every_error_of_the_sidecar_is_a_monitor_agent_error():
    classes = _exception_classes()
    assert len(classes) >= 13, classes  # the walk finds them
    stray = [f"{module}.{name}" for module, name in classes
             if not issubclass(getattr(importlib.import_module(module), name),
                               MonitorAgentError)]
    assert not stray, f"derive these from their package's error: {stray}"


def test_the_specific_errors_derive_from_their_packages():
    from monitor_agent.records import RecordError
    from monitor_agent.records.wire import TraceError
    from monitor_agent.settings import ConfigError, TokenError
    from monitor_agent.storage.data_lock import DataDirInUse
    from monitor_agent.storage.database import StorageError
    from monitor_agent.storage.export import ExportError

    assert issubclass(TraceError, RecordError)
    assert issubclass(ExportError, StorageError) and issubclass(DataDirInUse, StorageError)
    assert issubclass(TokenError, ConfigError)
    # What callers caught before stays caught: a bad record or config is a ValueError.
    assert issubclass(RecordError, ValueError) and issubclass(ConfigError, ValueError)
