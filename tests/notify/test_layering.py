"""notify/ stands alone (alerting builds on it, never the reverse); rules never import
settings (settings validate the rules file through rules)."""

from __future__ import annotations

import ast
from pathlib import Path

import monitor_agent

ROOT = Path(monitor_agent.__file__).parent


def imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function (lazy imports count)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_notify_never_imports_alerting():
    bad = {f"{p.name}: {m}" for p in (ROOT / "notify").glob("*.py") for m in imports(p)
           if m.startswith("monitor_agent.alerting")}
    assert bad == set()


def test_rules_do_not_import_settings():
    assert not any(m.startswith("monitor_agent.alerting.settings")
                   for m in imports(ROOT / "alerting" / "rules.py"))
