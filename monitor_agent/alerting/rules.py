"""Alert rules: which findings become which alerts, where they go, and how often.

The rules file is YAML (the packaged ``default_rules.yaml`` documents every field). It is
validated with pydantic at load, so a typo is rejected with the field's path and the fix,
and turned into frozen ``Rule`` dataclasses; the first rule that matches a finding wins.

The packaged rules send memory pressure of severity error and up to one rule, the rest
to the next; and a typo names its rule, its field and the fix::

    >>> rules = load_rules()   # what settings.alerting.rules_file None means
    >>> oom = Finding("memory_pressure", Severity.ERROR, "gpt-7", step=40, message="97% used")
    >>> rule = first_match(rules, oom, run_labels={"project": "gpt"})
    >>> rule.name, rule.severity, rule.channels[:2], rule.cooldown
    ('TrainingMemoryPressureCritical', <Severity.ERROR: 2>, ('pagerduty', 'slack'), 300.0)
    >>> tight = Finding("memory_pressure", Severity.WARNING, "gpt-7", step=40, message="91% used")
    >>> first_match(rules, tight, run_labels={}).name
    'TrainingMemoryPressure'
    >>> parse_rules("{routes: {chat: [console]}, rules: [{name: Spike, cooldown: 5x,"
    ...             " match: {types: [loss_spike]}}]}")
    Traceback (most recent call last):
    ...
    monitor_agent.alerting.rules.RuleError: invalid alert rules in <rules>:
      rules[0].cooldown (rule Spike): Value error, invalid duration '5x': use seconds or e.g. ...
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from monitor_agent.detectors.catalogue import FINDING_TYPES, USUAL_SEVERITY
from monitor_agent.errors import MonitorAgentError
from monitor_agent.records.types import Finding, Severity
from monitor_agent.records.yaml_errors import yaml_error_line

log = logging.getLogger(__name__)

# FINDING_TYPES is docs/format.md's catalogue; "*" in a rule matches any type (a catch-all).
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


class RuleError(MonitorAgentError, ValueError):
    """The rules file is invalid; the message names the file, the field and the fix."""


def parse_duration(value: Any) -> float:
    """Seconds from a number or a Prometheus-style string: ``90``, ``"90s"``, ``"1h30m"``."""
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a boolean")
    if isinstance(value, int | float) or re.fullmatch(r"\d+(\.\d+)?", str(value).strip()):
        seconds = float(value)
    else:
        text = str(value).strip()
        parts = _DURATION.findall(text)
        if not text or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"invalid duration {value!r}: use seconds or e.g. 30s, 5m, 1h30m")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]
FingerprintLabel = Literal["layer", "rank"]


def _by_layer() -> list[FingerprintLabel]:
    """The default fingerprint labels: one alert per layer (all ranks together)."""
    return ["layer"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MatchModel(_Strict):
    types: list[str] = Field(min_length=1)
    min_severity: Literal["info", "warning", "error", "critical"] | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("types")
    @classmethod
    def _known(cls, types: list[str]) -> list[str]:
        unknown = [t for t in types if t != "*" and t not in FINDING_TYPES]
        if unknown:
            raise ValueError(f"unknown finding type(s) {unknown}; known: {', '.join(FINDING_TYPES)}")
        return types


class WhenModel(_Strict):
    """Conditions on the finding's measured value (e.g. memory fraction above 0.95)."""

    value_above: float | None = None
    value_below: float | None = None


class RuleModel(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=100)
    match: MatchModel
    when: WhenModel = Field(default_factory=WhenModel)
    severity: Literal["info", "warning", "error", "critical"] | None = None
    route: str | None = None
    cooldown: Duration | None = None
    repeat_interval: Duration | None = None
    resolve_after: Duration | None = None
    fingerprint: list[FingerprintLabel] = Field(default_factory=_by_layer)
    action: Literal["stop", "checkpoint", "rollback", "restart", "exclude",
                    "notify-only"] = "notify-only"
    action_after: int = Field(1, ge=1, le=1_000_000)
    # action: rollback only (alerting/rollback.py; defaults on ``Rule``).
    rollback_skip_margin: int | None = Field(None, ge=0, le=10_000_000)
    rollback_lr_factor: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    rollback_lr_steps: int | None = Field(None, ge=1, le=10_000_000)
    rollback_budget: int | None = Field(None, ge=1, le=100)
    # action: restart or exclude only (alerting/restart.py; defaults on ``Rule``).
    restart_budget: int | None = Field(None, ge=1, le=100)
    restart_window: Duration | None = None
    restart_cure_steps: int | None = Field(None, ge=0, le=10_000_000)
    exclude_budget: int | None = Field(None, ge=0, le=100_000)

    @model_validator(mode="after")
    def _rollback_fields(self) -> RuleModel:
        given = [k for k in _ROLLBACK_FIELDS if getattr(self, k) is not None]
        if given and self.action != "rollback":
            raise ValueError(f"{', '.join(given)} only apply to action: rollback "
                             f"(this rule's action is {self.action})")
        given = [k for k in _RESTART_FIELDS if getattr(self, k) is not None]
        if given and self.action not in ("restart", "exclude"):
            raise ValueError(f"{', '.join(given)} only apply to action: restart or exclude "
                             f"(this rule's action is {self.action})")
        if self.restart_window is not None and self.restart_window <= 0:
            raise ValueError("restart_window must be a positive duration")
        if (self.rollback_lr_factor is None) != (self.rollback_lr_steps is None):
            raise ValueError("rollback_lr_factor and rollback_lr_steps go together: the LR "
                             "is scaled by the factor for that many steps after the resume")
        return self


_ROLLBACK_FIELDS = ("rollback_skip_margin", "rollback_lr_factor", "rollback_lr_steps",
                    "rollback_budget")
_RESTART_FIELDS = ("restart_budget", "restart_window", "restart_cure_steps", "exclude_budget")


class DefaultsModel(_Strict):
    cooldown: Duration = 300.0
    repeat_interval: Duration = 4 * 3600.0
    resolve_after: Duration = 600.0


class RulesFileModel(_Strict):
    version: Literal[1] = 1
    routes: dict[str, list[Literal["slack", "pagerduty", "alertmanager", "webhook", "console"]]]
    defaults: DefaultsModel = Field(default_factory=DefaultsModel)
    rules: list[RuleModel] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Rule:
    """One validated rule; durations in seconds, ``channels`` resolved from its route."""

    name: str
    types: tuple[str, ...]
    channels: tuple[str, ...]
    cooldown: float
    repeat_interval: float
    resolve_after: float
    severity: Severity | None = None
    min_severity: Severity | None = None
    labels: tuple[tuple[str, str], ...] = ()
    value_above: float | None = None
    value_below: float | None = None
    fingerprint: tuple[str, ...] = ("layer",)
    action: str = "notify-only"   # stop | checkpoint | rollback | restart | exclude |
    #                               notify-only (rule_actions.py)
    action_after: int = 1         # matching findings in one episode before acting
    # Steps past the fault's step whose batches a rollback skips too (alerting/rollback.py).
    # PaLM restarted ~100 steps before each spike and skipped 200-500 batches; the window
    # here already begins at the checkpoint, before the onset, so 200 past the fault is
    # PaLM's lower end: enough to leave the batches that drove the fault behind without
    # throwing away more data than it did.
    rollback_skip_margin: int = 200
    rollback_lr_factor: float | None = None  # LR x this for rollback_lr_steps after a resume
    rollback_lr_steps: int | None = None
    # Rollbacks per run before the rule stops it instead: a fault that comes back twice
    # after going back to clean weights is not a bad batch, and a human must look.
    rollback_budget: int = 2
    # action: restart / exclude (alerting/restart.py). Restarts per run within
    # ``restart_window`` before the rule stops it instead: Meta's study (arXiv 2410.21680)
    # measured a mean time to failure of 1.8 h at 16,384 GPUs, about 0.6 failures an hour at
    # the largest scale jobs run at; a third restart within one hour is five times that
    # rate, which is no longer chance hardware but something the restart does not reach (a
    # node the evidence did not name, the code, the filesystem), and a human must look.
    restart_budget: int = 3
    restart_window: float = 3600.0
    # A fault of the same kind again within this many steps of the resume was not cured by
    # the restart: stop and page, never loop. 100 steps is past the first checkpoint
    # interval of most jobs (the restarted job has shown it can train again) and far
    # shorter than the steps between two independent hardware faults (hours apart).
    restart_cure_steps: int = 100
    # Nodes one run may leave out (None: a tenth of its nodes, at least 1): more than that
    # means the evidence blames nodes for what is not theirs (the network, a bad image), and
    # leaving more out would only shrink the job; past it the rule stops and pages.
    exclude_budget: int | None = None
    # The route its channels come from: "page" (someone is woken) or another, e.g. "chat".
    route: str = "page"

    def matches(self, finding: Finding, run_labels: dict[str, str]) -> bool:
        if "*" not in self.types and finding.type not in self.types:
            return False
        if self.min_severity is not None and finding.severity < self.min_severity:
            return False
        if any(run_labels.get(k) != v for k, v in self.labels):
            return False
        return self._value_ok(finding.value)

    def _value_ok(self, value: float | None) -> bool:
        if self.value_above is None and self.value_below is None:
            return True
        if value is None or value != value:
            return False
        above = self.value_above is None or value > self.value_above
        return above and (self.value_below is None or value < self.value_below)

    def severity_for(self, finding: Finding) -> Severity:
        return self.severity if self.severity is not None else finding.severity


def first_match(rules: Sequence[Rule], finding: Finding, run_labels: dict[str, str]) -> Rule | None:
    """The first rule that matches, like a routing tree without ``continue``."""
    return next((r for r in rules if r.matches(finding, run_labels)), None)


def load_rules(path: Path | str | None = None) -> list[Rule]:
    """Load and validate a rules file (None: the packaged defaults).

    Takes a path, not settings: ``AlertingSettings`` validates its ``rules_file`` with
    this at config load, so the dependency runs settings -> rules only.
    """
    if path is None:
        text = resources.files("monitor_agent").joinpath("default_rules.yaml").read_text()
        return parse_rules(text, "default_rules.yaml")
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RuleError(f"cannot read alert rules {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise RuleError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    return parse_rules(text, str(path))


def parse_rules(text: str, source: str = "<rules>") -> list[Rule]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleError(yaml_error_line(exc, source)) from None
    if not isinstance(data, dict):
        raise RuleError(f"alert rules {source}: expected a mapping with 'routes' and 'rules'")
    try:
        model = RulesFileModel.model_validate(data)
    except ValidationError as exc:
        raise RuleError(_explain(exc, source, data)) from None
    rules = [_build(r, i, model, source) for i, r in enumerate(model.rules)]
    for warning in shadowed(rules, source):
        log.warning("%s", warning)
    return rules


def shadowed(rules: list[Rule], source: str = "<rules>") -> list[str]:
    """First match wins, so a rule below one that takes all of its findings never fires:
    one warning for each such rule (logged at load).

    "Takes all": for every type the later rule names, an earlier rule with no label or
    value condition matches a finding of that type at the severity its detector usually
    gives it (``USUAL_SEVERITY``). A catch-all above a specific rule is the usual mistake;
    a warning, not a refusal, because a rule kept below an acting one on purpose (the
    commented ``StopOnRepeatedNaN`` of default_rules.yaml) is the same shape.
    """
    out: list[str] = []
    for j, later in enumerate(rules):
        types = FINDING_TYPES if "*" in later.types else later.types
        for earlier in rules[:j]:
            if earlier.labels or earlier.value_above is not None or (
                    earlier.value_below is not None):
                continue
            taken = [t for t in types if earlier.matches(
                Finding(t, USUAL_SEVERITY[t], "", step=0, message=""), {})]
            if taken and len(taken) == len(types):
                out.append(
                    f"alert rules {source}: rule {later.name} never matches: rule "
                    f"{earlier.name} above it takes every {', '.join(taken[:5])}"
                    f"{' ...' if len(taken) > 5 else ''} finding first (first match wins); "
                    f"move {later.name} above {earlier.name}")
                break
    return out


def _build(r: RuleModel, index: int, model: RulesFileModel, source: str) -> Rule:
    severity = Severity.parse(r.severity) if r.severity else None
    route = r.route or ("page" if severity is not None and severity.pages else "chat")
    if route not in model.routes:
        raise RuleError(
            f"alert rules {source}: rules[{index}] ({r.name}).route: no route {route!r}; "
            f"define it under 'routes' (have: {', '.join(model.routes) or 'none'})"
        )
    d = model.defaults
    return Rule(
        name=r.name, types=tuple(r.match.types), channels=tuple(model.routes[route]), route=route,
        cooldown=d.cooldown if r.cooldown is None else r.cooldown,
        repeat_interval=d.repeat_interval if r.repeat_interval is None else r.repeat_interval,
        resolve_after=d.resolve_after if r.resolve_after is None else r.resolve_after,
        severity=severity,
        min_severity=Severity.parse(r.match.min_severity) if r.match.min_severity else None,
        labels=tuple(sorted(r.match.labels.items())),
        value_above=r.when.value_above, value_below=r.when.value_below,
        fingerprint=tuple(dict.fromkeys(r.fingerprint)),
        action=r.action, action_after=r.action_after,
        **{k: v for k in (*_ROLLBACK_FIELDS, *_RESTART_FIELDS)
           if (v := getattr(r, k)) is not None},
    )


def _explain(exc: ValidationError, source: str, data: dict[str, Any]) -> str:
    lines = [f"invalid alert rules in {source}:"]
    for err in exc.errors(include_url=False):
        loc = err["loc"]
        parts = [f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc]
        field = "".join(parts).lstrip(".")
        name = _rule_name(data, loc)
        msg = "unknown field (check the spelling)" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  {field}{name}: {msg}")
    return "\n".join(lines)


def _rule_name(data: dict[str, Any], loc: tuple[Any, ...]) -> str:
    if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
        rules = data.get("rules") or []
        if loc[1] < len(rules) and isinstance(rules[loc[1]], dict) and "name" in rules[loc[1]]:
            return f" (rule {rules[loc[1]]['name']})"
    return ""
