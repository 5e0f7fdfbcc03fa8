"""Docstring examples run: every ``>>>`` example in both packages is a doctest of the suite.

An example nobody runs goes stale without a sound (a renamed argument, a method that moved),
and a newcomer copies it first. So examples are written as doctests, and a literal
``Example::`` block, which nothing would run, is refused.
"""

from __future__ import annotations

import ast
import doctest
import importlib
from pathlib import Path

import pytest

from tests.test_architecture import PACKAGES, ROOT, _modules

# Importing these runs a program; they hold no examples.
NOT_IMPORTED = {"monitor_agent.__main__"}
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
MODULES = {name: path for package in PACKAGES for name, path in _modules(package).items()}


@pytest.mark.parametrize("name", sorted(set(MODULES) - NOT_IMPORTED))
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in finder.find(module, name, module=module):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} doctest example(s) failed in {name} (above)"


def _literal_examples(path: Path) -> list[str]:
    """Docstrings holding an ``Example::`` block: an example written so nothing runs it."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node) or ""
            if "Example::" in doc or "Examples::" in doc:
                found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}")
    return found


def test_examples_are_doctests_not_literal_blocks() -> None:
    found = [hit for path in MODULES.values() for hit in _literal_examples(path)]
    assert not found, ("write these examples as >>> doctests (they then run in the suite), "
                       "or delete them:\n" + "\n".join(found))


def test_a_failing_example_fails_the_check() -> None:
    """The runner above reports a wrong example (a check that cannot fail is none)."""
    parser = doctest.DocTestParser()
    test = parser.get_doctest(">>> 1 + 1\n3\n", {}, "broken", "broken.py", 0)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=lambda _: None)
    assert runner.summarize(verbose=False).failed == 1
