"""The plan of a ``rollback`` action: a typed value, one parser, one wording.

alerting/rollback.py decides it (when, from which checkpoint, which data windows); this is
what the decision says, as every reader on the sidecar holds it: the alert store, the run's
lifecycle, the engine, a node sidecar adopting its leader's decisions, the pages. It travels
as JSON in the action's ``plan`` (the ingest answer, ``GET /v1/runs/{id}/actions``, the peer
link) in the shape the client reads (client/monitor_client/_rollback.py, whose own frozen
value is its ``RollbackPlan``: hence ``RollbackSpec`` here, one class name meaning one
thing) and docs/action.schema.json states; ``to_dict`` writes that shape, key for key and in the same
order as ever, and ``parse`` reads it back, once, with the bounds a rule could decide
(alerting/rules.py): a plan that does not parse is not acted on.

- ``checkpoint_step``/``checkpoint_path``: the clean checkpoint the run goes back to;
- ``resume_position``, ``skip``, ``positions``: the data resumes after ``resume_position``
  and never trains a position inside a ``[first, last]`` window of ``skip`` (every earlier
  rollback's windows included), counted in ``positions`` ("positions", or "steps" for a
  run that reports no data position); ``skips_by``: how the run leaves a window out, as
  its run record said (absent when unsaid);
- ``skip_from``/``skip_to``: the fault's window in steps, which is what applies the plan
  (an attempt that settles at or before ``skip_from``);
- ``lr_factor``/``lr_steps``: the LR scaled for that many steps after the resume, or null;
- ``number``/``budget``: this run's n-th rollback of ``rollback_budget``;
- ``fault_node``/``fault_host``: the node the evidence put the fault on, in a run of more
  than one node (absent otherwise): what a later incident compares with.

A plan from before data positions has only ``skip_from``/``skip_to``: it parses as that one
window counted in steps.

    >>> plan = RollbackSpec(checkpoint_step=200, checkpoint_path="/c/200.pt",
    ...     resume_position=200, skip=((201, 300),), positions="positions", skip_from=201,
    ...     skip_to=300,
    ...     lr_factor=0.5, lr_steps=100, number=1, budget=2)
    >>> plan.describe()
    'rolled back to step 200 (/c/200.pt, data position 200), skipping batches 201-300; LR x0.5 for 100 steps'
    >>> RollbackSpec.parse(plan.to_dict()) == plan
    True
    >>> RollbackSpec.parse({"checkpoint_step": 10, "checkpoint_path": "/c/10.pt",
    ...                     "skip_from": 11, "skip_to": 40}).skip     # before data positions
    ((11, 40),)
    >>> try:
    ...     RollbackSpec.parse({**plan.to_dict(), "lr_factor": 1e308})
    ... except PlanError as exc:
    ...     print(exc)
    lr_factor: 1e+308 is not a finite number in (0, 1]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from monitor_agent.records import RecordError
from monitor_agent.records.plan_fields import count, text, window

__all__ = ["MAX_COUNT", "MAX_LR_STEPS", "MAX_PATH", "MAX_WINDOWS", "PlanError", "RollbackSpec"]

MAX_COUNT = 2**53  # a step or position a JSON reader holds exactly
MAX_WINDOWS = 10_000
MAX_LR_STEPS = 10_000_000  # alerting/rules.py: rollback_lr_steps and rollback_skip_margin
MAX_PATH = 4096  # records/limits.py: a checkpoint record's path
_WINDOWS_SHOWN = 4  # a page lists this many windows, then "and N more"
# What a page adds to the windows, from how the run said it leaves them out.
_SKIPS_BY = {"sampler": ", left out in the sampler (never loaded)",
             "reading": " by reading past them (streamed data)"}


class PlanError(RecordError):
    """A plan that is not a whole one; the message names the field and why (a
    ``RecordError``, so a ``ValueError`` as before)."""


@dataclass(frozen=True, slots=True)
class RollbackSpec:
    """What a rollback decision asks (module docstring). The JSON leaves ``skips_by`` out
    when it is None, and ``fault_node``/``fault_host`` when the fault has no node: the
    answers' schema (api/models.py, read by pydantic) says those keys may be absent."""

    __pydantic_config__ = {"json_schema_serialization_defaults_required": False}

    checkpoint_step: int
    checkpoint_path: str
    skip_from: int
    skip_to: int
    skip: tuple[tuple[int, int], ...] = ()
    resume_position: int | None = None
    positions: str = "steps"
    skips_by: str | None = None
    lr_factor: float | None = None
    lr_steps: int | None = None
    number: int = 1
    budget: int = 1
    fault_node: int | None = None
    fault_host: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plan as the client reads it (the wire's key order, byte for byte)."""
        out: dict[str, Any] = {
            "checkpoint_step": self.checkpoint_step, "checkpoint_path": self.checkpoint_path,
            "resume_position": self.resume_position, "skip": [list(w) for w in self.skip],
            "positions": self.positions}
        if self.skips_by is not None:
            out["skips_by"] = self.skips_by
        out.update({"skip_from": self.skip_from, "skip_to": self.skip_to,
                    "lr_factor": self.lr_factor, "lr_steps": self.lr_steps,
                    "number": self.number, "budget": self.budget})
        if self.fault_node is not None:
            out.update({"fault_node": self.fault_node, "fault_host": self.fault_host})
        return out

    @classmethod
    def parse(cls, data: Any) -> RollbackSpec:
        """The plan of an action's ``plan`` JSON; ``PlanError`` naming the field that is
        not one a rule could decide (a plan with holes must not half-apply)."""
        if not isinstance(data, Mapping):
            raise PlanError("a rollback needs one")
        got: dict[str, Any] = {}
        for key in ("checkpoint_step", "skip_from", "skip_to", "resume_position", "number",
                    "budget", "fault_node"):
            value = data.get(key)
            if value is None and key not in ("checkpoint_step", "skip_from", "skip_to"):
                continue
            got[key] = _field(key, count, value, MAX_COUNT, why="an integer in 0..2**53")
        path = data.get("checkpoint_path")
        if not isinstance(path, str) or not 0 < len(path) <= MAX_PATH:
            raise PlanError(f"checkpoint_path: not a string of 1..{MAX_PATH} characters")
        if not got["checkpoint_step"] < got["skip_from"] <= got["skip_to"]:
            raise PlanError("skip_from: the window is not after the checkpoint")
        skip = data.get("skip")
        if skip is None or skip == []:  # a plan from before data positions: its steps
            windows = ((got["skip_from"], got["skip_to"]),)
        elif isinstance(skip, list) and len(skip) <= MAX_WINDOWS:
            windows = tuple(_field("skip", window, w, MAX_COUNT, why=(
                f"not a list of at most {MAX_WINDOWS} [first, last] integer windows"))
                for w in skip)
        else:
            raise PlanError(f"skip: not a list of at most {MAX_WINDOWS} [first, last] "
                            "integer windows")
        unit = data.get("positions", "steps") if skip else "steps"
        if unit not in ("positions", "steps"):
            raise PlanError("positions: not 'positions' or 'steps'")
        factor, steps = data.get("lr_factor"), data.get("lr_steps")
        if factor is not None:
            if isinstance(factor, bool) or not isinstance(factor, int | float) or \
                    not math.isfinite(factor) or not 0 < factor <= 1:
                raise PlanError(f"lr_factor: {factor!r:.40} is not a finite number in (0, 1]")
            if not (isinstance(steps, int) and not isinstance(steps, bool)
                    and 1 <= steps <= MAX_LR_STEPS):
                raise PlanError(f"lr_steps: not an integer in 1..{MAX_LR_STEPS}")
        return cls(skip=windows, positions=unit, checkpoint_path=path,
                   skips_by=_field("skips_by", text, data.get("skips_by")),
                   fault_host=_field("fault_host", text, data.get("fault_host")),
                   lr_factor=factor, lr_steps=steps if factor is not None else None, **got)

    @classmethod
    def from_dict(cls, data: Any) -> RollbackSpec | None:
        """``parse``, or None for a plan that is not a whole one."""
        try:
            return cls.parse(data)
        except PlanError:
            return None

    def describe(self) -> str:
        """The sentence pages carry about the rollback."""
        windows = [f"{a}-{b}" if a != b else str(a) for a, b in self.skip]
        if len(windows) > _WINDOWS_SHOWN:
            windows = [*windows[:_WINDOWS_SHOWN], f"and {len(windows) - _WINDOWS_SHOWN} more"]
        where, counted = self.checkpoint_path, ""
        if self.positions == "positions":
            where = f"{where}, data position {self.resume_position}"
        elif self.positions == "steps" and self.resume_position is not None:
            counted = " (counted as steps: the run reports no data position)"
        text_ = (f"rolled back to step {self.checkpoint_step} ({where}), skipping batches "
                 f"{', '.join(windows)}{counted}{_SKIPS_BY.get(str(self.skips_by), '')}")
        if self.lr_factor is not None:
            text_ += f"; LR x{self.lr_factor:g} for {self.lr_steps} steps"
        return text_


def _field(key: str, check: Any, value: Any, *limit: int, why: str = "") -> Any:
    try:
        return check(value, *limit)
    except ValueError as exc:
        raise PlanError(f"{key}: {why or exc}") from None
