"""YAML syntax errors as one line a person can jump to: ``file:line:column: what is wrong``.

PyYAML's messages span several lines and mention the parser's state ("while parsing a flow
mapping"); the config file and the rules file both report through here instead.

An unclosed flow list, reported at the line where the parser gave up::

    >>> try:
    ...     yaml.safe_load("detectors:\\n  disabled: [plateau\\n")
    ... except yaml.YAMLError as exc:
    ...     print(yaml_error_line(exc, "monitor-agent.yaml"))
    monitor-agent.yaml:3:1: YAML syntax error: expected ',' or ']', but got '<stream end>'
    (while parsing a flow sequence started at line 2)
"""

from __future__ import annotations

import yaml


def yaml_error_line(exc: yaml.YAMLError, source: object) -> str:
    """``source:line:column: problem (context at line L)``, 1-based like editors count."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else f"{source}"
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and context_mark.line != getattr(mark, "line", None):
        problem += f" ({context} started at line {context_mark.line + 1})"
    return f"{where}: YAML syntax error: {problem}"
