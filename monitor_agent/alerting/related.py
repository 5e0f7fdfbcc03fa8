"""Findings that follow from an open page, grouped under it instead of alerting one by one.

A diverged run raises a page (divergence, a gradient explosion, a NaN), and then the
weights it threw make every layer's gradient distribution heavy-tailed, layers go dead,
updates oversize: one warning per layer, each its own alert, all saying what the page
already said. They are grouped under the page instead: the page counts them and names
what they were ("+11 related findings (grad_distribution heavy_tail in 11 layers)"),
the API shows them on the page's alert, and none is an alert or a message of its own.

**Follows from**, precisely: a finding F follows from an alert P when

* P is a page of the same run (its severity is error or critical) and is open (pending
  or firing): its window runs from its first finding until it resolves;
* F's step is at or after the step P began at. Arrival order is not enough: a NaN step
  the client sent ahead of its backlog (``/v1/records/preview``) begins its page before
  the steps that came first are judged, and a warning 100 steps before the NaN is no
  consequence of it: it alerts on its own, as it does when the records arrive in order;
* no silence covers P: grouping stands on people hearing the page, and a silence on it
  must not mute what it does not cover;
* F's alert would be less severe than P (``Rule.severity_for``);
* F would begin a new alert episode (one already open goes on as it was), and its rule
  takes no action (a stop or checkpoint rule must still act);
* F is about the model, not the job: ``throughput_drop``, ``memory_pressure``,
  ``straggler``, ``stalled``, ``rank_outlier`` (a sick GPU or shard), ``hang`` and
  ``gpu_health`` (a failing GPU, often the cause of the page, not its consequence) are
  independent problems with their own fixes, and
  ``lr_jump`` is a cause the pages cite, never a consequence.

Of several such pages, the most severe (then the earliest) takes it. A finding replayed
after a restart (the same type and layer at a step already counted) is not counted twice.

Eleven heavy-tail warnings, one per layer, under a divergence page::

    >>> from monitor_agent.records.types import Finding, Severity
    >>> related = RelatedFindings()
    >>> for k in range(11):
    ...     tail = Finding("grad_distribution", Severity.WARNING, "r", step=320 + k,
    ...                    message="heavy tail", layer=f"h.{k}.w", evidence={"kind": "heavy_tail"})
    ...     _ = related.add(tail)
    >>> related.add(tail)   # the last one again (replayed after a restart)
    False
    >>> related.summary()
    '+11 related findings (grad_distribution heavy_tail in 11 layers)'
    >>> RelatedFindings.from_json(related.to_json()).summary() == related.summary()
    True
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from monitor_agent.records.types import Finding, Severity

NOT_CONSEQUENCES = frozenset({"throughput_drop", "memory_pressure", "straggler", "stalled",
                              "lr_jump", "rank_outlier", "hang", "gpu_health"})
MAX_KEYS = 256  # distinct (type, layer) remembered per page: bounds a name bomb


def follows(page_severity: str, page_state: str, page_first_step: int | None,
            finding_severity: Severity, finding: Finding, acts: bool) -> bool:
    """Whether ``finding`` (whose alert would have ``finding_severity``) follows from an
    open alert of ``page_severity`` in ``page_state``, begun at ``page_first_step`` (None:
    stored before the step was kept), on the same run (module docstring)."""
    page = Severity.parse(page_severity)
    after = page_first_step is None or finding.step >= page_first_step
    return (page.pages and page_state in ("pending", "firing") and after
            and finding_severity < page and not acts and finding.type not in NOT_CONSEQUENCES)


@dataclass(slots=True)
class TypeGroup:
    count: int = 0
    kinds: list[str] = field(default_factory=list)   # evidence "kind" values seen
    layers: list[str] = field(default_factory=list)  # distinct layers (at most MAX_KEYS)


@dataclass(slots=True)
class RelatedFindings:
    """What a page gathered: counts per type, the layers, and each key's last step."""

    count: int = 0
    types: dict[str, TypeGroup] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)  # "type|layer" -> last step counted

    def add(self, f: Finding) -> bool:
        """Count ``f``; False when it was counted already (a replay)."""
        key = f"{f.type}|{f.layer or ''}"
        last = self.seen.get(key)
        if last is not None and f.step <= last:
            return False
        if last is not None or len(self.seen) < MAX_KEYS:
            self.seen[key] = f.step
        self.count += 1
        group = self.types.setdefault(f.type, TypeGroup())
        group.count += 1
        kind = f.evidence.get("kind")
        if isinstance(kind, str) and kind not in group.kinds and len(group.kinds) < 8:
            group.kinds.append(kind)
        if f.layer and f.layer not in group.layers and len(group.layers) < MAX_KEYS:
            group.layers.append(f.layer)
        return True

    def summary(self) -> str:
        """``+N related findings (<type> <kinds> in <n> layers; ...)``; "" when none."""
        if not self.count:
            return ""
        parts = []
        for ftype, g in sorted(self.types.items(), key=lambda kv: -kv[1].count):
            what = " ".join([ftype, "/".join(g.kinds)]).strip()
            where = (f" in {len(g.layers)} layer{'s' if len(g.layers) != 1 else ''}"
                     if g.layers else f" x{g.count}")
            parts.append(what + where)
        plural = "s" if self.count != 1 else ""
        return f"+{self.count} related finding{plural} ({'; '.join(parts)})"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | None) -> RelatedFindings:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(count=int(data.get("count", 0)),
                   types={t: TypeGroup(**g) for t, g in (data.get("types") or {}).items()},
                   seen={str(k): int(v) for k, v in (data.get("seen") or {}).items()})
