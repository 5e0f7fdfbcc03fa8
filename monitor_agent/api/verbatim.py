"""May an NDJSON line be stored as it came? Only when it holds nothing but known fields.

Storing the client's line saves re-serialising a validated record (for a GPT-sized record
that cost more than validating it), but a line may carry fields docs/format.md does not define,
at any depth, or a key written twice with a padded first value: stored verbatim, those
would fill the disk at the sender's will. So a line is kept only when every key
is one the models know and the line has exactly as many ``:`` as the parsed object has
keys: a duplicated key, or a colon inside a string (a padded value may hide anything) make
the counts differ, and the record is stored re-serialised instead. Both ways store the
same record; this only decides which bytes.

The ingest route stores ``raw`` when ``verbatim_ok(obj, raw)``, else the model's own JSON.
A line of known fields passes; one with a field no model defines, or with a key written
twice, does not::

    >>> from monitor_agent.records import wire
    >>> def check(raw):
    ...     return verbatim_ok(wire.loads(raw), raw)
    >>> check(b'{"kind": "step", "run_id": "r1", "step": 1, "time": 1.0, "loss": 2.5}')
    True
    >>> check(b'{"kind": "step", "run_id": "r1", "step": 1, "time": 1.0, "junk": "x"}')
    False
    >>> check(b'{"kind": "step", "run_id": "r1", "step": 1, "time": 1, "loss": 9, "loss": 2}')
    False
"""

from __future__ import annotations

from typing import Any

from monitor_agent.records import schemas

_NESTED = {
    "layers": frozenset(schemas.LayerModel.__annotations__),
    "activations": frozenset(schemas.ActivationModel.__annotations__),
    "grad_hist": frozenset(schemas.HistModel.__annotations__),
    "param_hist": frozenset(schemas.HistModel.__annotations__),
    "models": frozenset(schemas.ModelStepModel.__annotations__),
}
_MEMORY = frozenset(schemas.MemoryModel.model_fields)
_NAME_MAPS = ("gpu", "labels", "metrics")
_FREE_FORM = ("config", "model", "hardware")


def verbatim_ok(obj: dict[str, Any], raw: bytes) -> bool:
    """True when ``raw`` (the line ``obj`` was parsed from, already validated) may be stored."""
    if not obj.keys() <= schemas.TOP_FIELDS.get(str(obj.get("kind")), frozenset()):
        return False
    keys = len(obj)
    for section, allowed in _NESTED.items():
        entries = obj.get(section)
        if entries:  # C-level loops: a GPT record has hundreds of layers
            if not all(map(allowed.issuperset, entries.values())):
                return False
            keys += len(entries) + sum(map(len, entries.values()))
    memory = obj.get("memory")
    if memory:
        if not memory.keys() <= _MEMORY:
            return False
        keys += len(memory)
    keys += sum(len(obj.get(s) or ()) for s in _NAME_MAPS)
    keys += sum(_count_keys(obj.get(s)) for s in _FREE_FORM)
    return raw.count(b":") == keys  # one byte: the fast count; a colon in a string differs


def _count_keys(value: Any) -> int:
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count
