"""Each node of a multi-node run judged healthy, suspect or sick, with a cause class, from
the findings its leader already makes of every node's digests (issue 44).

A node is **sick** on evidence that it is the node, not its data or the job's code: a hard
GPU error on it (``gpu_health`` at error or worse: XID, uncorrectable ECC, a failed row
remap, the GPU lost), every one of its ranks gone (``hang``), a rank of it dead without a word in two attempts (``relaunched``,
below), all its ranks slower than the
other nodes' (``straggler``'s whole-node judgement: what they share is the host), one of its
ranks the straggler again in a later judgement (sustained, not one slow window), or a NaN
that started on it in two incidents at different data positions, or every one of its ranks'
local loss off its peers' at once (``rank_outlier``, below). One soft signal makes it
**suspect**: a rank the straggler once, a GPU warning (throttle, PCIe width), some of its
ranks gone, one of its ranks dead without a word once, its first NaN. Every other node it has ranks on is **healthy**.

The cause classes, from what the finding says::

    compute-slow   straggler, its own compute
    network-slow   straggler, late to the all-reduce with its own work as fast (its link);
                   the node common to the slow pairs of every node's TCP round-trip
                   times (``link``, runs/network_slow.py: for two windows, or again)
    input-slow     straggler, its data loading
    gpu-hardware   gpu_health; a straggler whose GPU throttles while the others' do not
    sdc-suspect    NaN first on it, at two different data positions; its ranks' local
                   loss off their peers' (rank_outlier), all at once or twice (see below)
    gone           hang: its ranks sent nothing past the limit; relaunched: a rank of it
                   died without a word and its peers lost it (below)

A straggler's three slow classes are readings of one measurement, where its extra time
goes: the latest replaces the earlier, on the fuller window (a node once sick stays so).

**Dead without a word.** A launcher that restarts its job relaunches it seconds after a
rank's process dies, before any hang; the relaunch's finding (``relaunched``) says which
ranks of the ended attempt sent no end record while their peers' ended with a lost peer
(runs/attempt_end.py): ``gone_ranks``. One rank of a node once is **suspect**: a process
killed from outside (the OOM killer, a person, a segfault of the job's own code) is as
often the job's as the machine's, and its relaunch ran on. Every rank of the node at once,
two or more (the machine went: power, kernel, its link), is **sick**, as a hang of every
rank is; so is the node losing a rank so again in a later attempt: the fault outlived the
restart. A node of one rank losing it once is one process dead, not yet the machine. The
peers that lost it are never named: their end is its.

**Silent corruption or bad data.** A NaN's first rank (``nan_inf``'s ``first_rank``, its
local loss broke first; else its first ranks, when all are one node's: ``_first_rank``)
names a node and, from that rank's latest step, a data position.
The same node first in two incidents at different data positions is a silent-corruption
suspect (different data, same machine). A NaN that comes back at a data position an
earlier incident started at, on another node or rank, is the data's: the node is cleared
of it (the closed loop skips that window).

A flipped bit need not make a NaN: an error of a few exponent steps leaves a replica
that computes on slightly different weights, and its ranks' local loss leaves their
peers' while every global number still looks fine (``rank_outlier``: the rank's loss
beyond its peers' spread, step after step). One rank so is a suspect: a corrupt shard of
the data makes the same sign. Every rank of one node (two or more) off their peers at
once - incidents starting within one outlier window of each other - is the node's: each
rank reads its own shard of every batch (a distributed sampler interleaves them), so bad
data would have to fall on exactly the ranks that share a host; what they share is the
host. So is the same node off its peers again in a later incident (a new start), as with
a NaN: the fault outlived the data that was in flight.

**Is leaving it out worth a restart?** (``price``) The straggler tax the node has cost so
far (the goodput ledger's: the other ranks' wait for it, runs/straggler_tax.py) against
what one restart of this job costs (its measured recoveries, runs/ettr.py: seconds to
train again plus the work re-done; ``DEFAULT_RESTART_SECONDS`` when none was measured).
Ski rental: keep renting (pay the tax) until what was paid equals the price of buying (a
restart without the node); from then on, leaving it out pays. That bound is within 2x of
the best choice made knowing the future, whatever the node does next.

Two nodes of two ranks; node b's ranks are slow as a whole::

    >>> from monitor_agent.records.types import Finding, Severity
    >>> book = NodeVerdicts()
    >>> slow = Finding(type="straggler", severity=Severity.WARNING, run_id="r", step=40,
    ...                message="node b (ranks 2-3) is slow as a whole", rank=2,
    ...                evidence={"cause": "compute", "host": "b", "node_ranks": "2-3"})
    >>> book.observe(slow, {0: "a", 1: "a", 2: "b", 3: "b"}, {})
    'b'
    >>> [(v.node, v.state, v.cause) for v in book.verdicts({0: "a", 1: "a", 2: "b", 3: "b"})]
    [('a', 'healthy', None), ('b', 'sick', 'compute-slow')]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monitor_agent.records.types import Finding, Severity

CAUSES: tuple[str, ...] = ("gone", "gpu-hardware", "sdc-suspect", "compute-slow",
                           "network-slow", "input-slow")
"""The cause classes, strongest first: a node sick of two is named by the first."""
STATES: tuple[str, ...] = ("healthy", "suspect", "sick")
STRAGGLER_CLASS = {"compute": "compute-slow", "collective": "network-slow",
                   "data": "input-slow", "gpu_throttle": "gpu-hardware"}
SLOW_CLASSES = frozenset({"compute-slow", "network-slow", "input-slow"})
"""Readings of one measurement, where a straggler's extra time goes: the latest replaces
the earlier (``_straggler``)."""
MAX_NODES_EXPOSED = 16
"""Nodes not healthy a run exposes on /metrics, sick first (a label per node)."""
DEFAULT_RESTART_SECONDS = 300.0
"""One restart when this job has measured none: five minutes, for the relaunch, the
rendezvous, loading the checkpoint and redoing the steps since it (Meta reports minutes
to tens of minutes per interruption at scale; torchft measured 948 s). Stated on every
verdict that uses it."""


@dataclass(slots=True)
class Mark:
    """One piece of evidence against a node."""

    cause: str
    sick: bool
    step: int
    why: str


@dataclass(frozen=True, slots=True)
class Price:
    """The node's straggler tax so far and per hour, against one restart's cost."""

    tax_seconds: float
    tax_per_hour: float
    restart_seconds: float
    restart_measured: bool

    @property
    def exclude_pays(self) -> bool:
        return self.tax_seconds >= self.restart_seconds

    def words(self) -> str:
        source = "measured" if self.restart_measured else "none measured: the default"
        head = (f"its straggler tax so far {self.tax_seconds:.0f} s ({self.tax_per_hour:.0f} s "
                f"an hour) against one restart's {self.restart_seconds:.0f} s ({source})")
        if self.exclude_pays:
            return head + ": leaving it out pays"
        if self.tax_per_hour > 0:
            hours = (self.restart_seconds - self.tax_seconds) / self.tax_per_hour
            return head + f": leaving it out pays in {hours:.1f} h at this rate"
        return head + ": leaving it out does not pay"

    def to_dict(self) -> dict[str, Any]:
        return {"tax_seconds": self.tax_seconds, "tax_per_hour": self.tax_per_hour,
                "restart_seconds": self.restart_seconds,
                "restart_measured": self.restart_measured, "exclude_pays": self.exclude_pays}


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    ranks: tuple[int, ...]
    state: str  # one of STATES
    cause: str | None  # one of CAUSES; None when healthy
    step: int | None  # the step of the evidence that set the state
    why: str
    price: Price | None = None

    def words(self) -> str:
        """'node b: sick (compute-slow) since step 40: ...'."""
        if self.state == "healthy":
            return f"node {self.node}: healthy"
        text = f"node {self.node}: {self.state} ({self.cause}) at step {self.step}: {self.why}"
        return text + (f"; {self.price.words()}" if self.price is not None else "")

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "ranks": list(self.ranks), "state": self.state,
                "cause": self.cause, "step": self.step, "why": self.why,
                "words": self.words(),
                "price": None if self.price is None else self.price.to_dict()}


@dataclass(slots=True)
class NodeVerdicts:
    """The evidence so far against each node of one run (module docstring)."""

    marks: dict[str, dict[str, Mark]] = field(default_factory=dict)  # node -> cause -> mark
    slow_steps: dict[str, int] = field(default_factory=dict)  # node -> first straggler step
    # Each NaN incident's start: [node, data position or None, rank, step]
    nans: list[list[Any]] = field(default_factory=list)
    # node -> rank -> [the step its latest loss-outlier incident started, the window]
    outliers: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    # node -> the attempts in which a rank of it died without a word (``_dead``)
    dead: dict[str, list[int]] = field(default_factory=dict)
    # The latest NaN judged the data's, not a node's: (its step, the words for its page)
    data_note: tuple[int, str] | None = None
    # Nodes whose link the TCP figures judged slow (``link``): a straggler's reading of
    # where its time goes does not replace that measurement.
    linked: set[str] = field(default_factory=set)

    def observe(self, finding: Finding, hosts: dict[int, str],
                positions: dict[int, int | None]) -> str | None:
        """Fold in one finding of the run (``hosts``: rank -> node; ``positions``: rank ->
        its latest data position); the node whose evidence it changed, else None."""
        if finding.log_only:
            return None
        if finding.type == "straggler":
            return self._straggler(finding, hosts)
        if finding.type == "gpu_health":
            node = _str(finding.evidence.get("node")) or hosts.get(finding.rank)
            sick = finding.severity >= Severity.ERROR
            condition = finding.evidence.get("condition") or "GPU health"
            return self._mark(node, Mark("gpu-hardware", sick, finding.step,
                                         f"{condition} on its GPU"))
        if finding.type == "hang":
            return self._gone(finding, hosts)
        if finding.type == "nan_inf":
            return self._nan(finding, hosts, positions)
        if finding.type == "rank_outlier":
            return self._outlier(finding, hosts)
        if finding.type == "relaunched":
            return self._dead(finding, hosts)
        return None

    def _straggler(self, finding: Finding, hosts: dict[int, str]) -> str | None:
        ev = finding.evidence
        node = _str(ev.get("host")) or hosts.get(finding.rank)
        cause = STRAGGLER_CLASS.get(str(ev.get("cause")))
        if node is None or cause is None:
            return None
        whole = ev.get("node_ranks") is not None
        first = self.slow_steps.setdefault(node, finding.step)
        sustained = finding.step > first
        why = ("all its ranks are slower than the other nodes'" if whole else
               f"rank {finding.rank} the straggler" + (f" since step {first}" if sustained
                                                       else ""))
        if cause == "network-slow" and self.linked and node not in self.linked:
            # Late to the all-reduce while another node's link is measured slow: the ring
            # waits for that link, whoever is late to it.
            return None
        mine = self.marks.get(node, {})
        if cause in SLOW_CLASSES:
            # Where the extra time goes is read off one window's means (the straggler's
            # ``cause_of``), and a window that has just begun to change holds only a few
            # of the slow steps, within the run's noise of the other parts; the reading of
            # a later, fuller window replaces it. The node is as sick as it was: the
            # slowness itself was measured either way (a link measured slow stays so).
            earlier = [mine.pop(c) for c in SLOW_CLASSES - {cause} if c in mine
                       and not (c == "network-slow" and node in self.linked)]
            if any(m.sick for m in earlier):
                return self._mark(node, Mark(cause, True, finding.step, why))
        return self._mark(node, Mark(cause, whole or sustained, finding.step, why))

    def link(self, node: str, sick: bool, step: int, why: str) -> str | None:
        """``node``'s link judged slow from the TCP figures of every pair of the run's
        nodes (runs/network_slow.py): a measurement of the link itself, not a reading of
        where a straggler's time goes. The node if its state changed (the evidence that
        set a state is kept, not each later sample's)."""
        old = self.marks.get(node, {}).get("network-slow")
        if old is not None and old.sick >= sick and node in self.linked:
            return None
        self.linked.add(node)
        for other, marks in self.marks.items():
            # A straggler's "late to the all-reduce" on another node, not sick: the ring
            # waiting for this link (``_straggler`` takes no more of them).
            mark = marks.get("network-slow")
            if other not in self.linked and mark is not None and not mark.sick:
                del marks["network-slow"]
        return self._mark(node, Mark("network-slow", sick, step, why))

    def _gone(self, finding: Finding, hosts: dict[int, str]) -> str | None:
        gone = {int(r) for r in finding.evidence.get("gone_ranks") or ()}
        changed = None
        for node in sorted({hosts[r] for r in gone if r in hosts}):
            mine = {r for r, h in hosts.items() if h == node}
            every = mine <= gone
            why = ("every rank of it sent nothing past the hang limit" if every else
                   f"{_span(sorted(mine & gone))} of it sent nothing past the limit")
            changed = self._mark(node, Mark("gone", every, finding.step, why)) or changed
        return changed

    def _dead(self, finding: Finding, hosts: dict[int, str]) -> str | None:
        """Ranks of the ended attempt that died without a word (module docstring)."""
        ev = finding.evidence
        dead = {_int(r, -1) for r in ev.get("gone_ranks") or ()}
        attempt = _int(ev.get("ended_attempt"), finding.step)
        changed = None
        for node in sorted({hosts[r] for r in dead if r in hosts}):
            mine = sorted(r for r, h in hosts.items() if h == node)
            seen = self.dead.setdefault(node, [])
            if attempt in seen:
                continue  # the same relaunch, said again
            before = list(seen)
            seen.append(attempt)
            lost = sorted(dead & set(mine))
            # Several processes dead at once are the machine's; one process alone (a node
            # of one rank) is one process, as one rank of many is.
            every = set(mine) <= dead and len(mine) > 1
            if every:
                why = (f"every rank of it ({_span(mine)}) died without a word in attempt "
                       f"{attempt}: the machine went")
            elif before:
                why = (f"{_span(lost)} of it died without a word in attempt {attempt}, as a "
                       f"rank of it did in attempt {before[-1]}: the fault outlived the "
                       "restart")
            else:
                why = (f"{_span(lost)} of it died without a word in attempt {attempt} (its "
                       "peers lost it); once, one rank: the job's own end not ruled out")
            sick = every or bool(before)
            changed = self._mark(node, Mark("gone", sick, finding.step, why)) or changed
        return changed

    def _nan(self, finding: Finding, hosts: dict[int, str],
             positions: dict[int, int | None]) -> str | None:
        rank = _first_rank(finding.evidence, hosts)
        if rank is None:
            return None
        node, position = hosts[rank], positions.get(rank)
        if any(n == node and p == position for n, p, _, _ in self.nans):
            return None  # the same incident, said again
        same_data = [i for i in self.nans if position is not None and i[1] == position]
        self.nans.append([node, position, rank, finding.step])
        if same_data:
            # Back at a data position an earlier incident started at: the data's, not the
            # node's; the nodes it named are cleared of it.
            for n, *_ in same_data + [self.nans[-1]]:
                self.marks.get(n, {}).pop("sdc-suspect", None)
            was = same_data[-1]
            self.data_note = (finding.step, (
                f"the data's, not a node's: NaN first on rank {rank} ({node}) at data "
                f"position {position}, where the incident at step {was[3]} started on rank "
                f"{was[2]} ({was[0]}); the same data breaks whichever node reads it: skip "
                "that window (a rollback rule does)"))
            return node
        earlier = [i for i in self.nans[:-1] if i[0] == node and i[1] != position
                   and i[1] is not None and position is not None]
        if earlier:
            why = (f"NaN started on it in two incidents at different data positions "
                   f"({earlier[-1][1]} at step {earlier[-1][3]}, {position} at step "
                   f"{finding.step}), no other node's NaN at either: silent corruption, "
                   "not the data")
            return self._mark(node, Mark("sdc-suspect", True, finding.step, why))
        where = f"data position {position}" if position is not None else "no data position"
        why = f"NaN started on it (rank {rank}, {where}): once; the data not ruled out yet"
        return self._mark(node, Mark("sdc-suspect", False, finding.step, why))

    def _outlier(self, finding: Finding, hosts: dict[int, str]) -> str | None:
        """A rank's local loss off its peers' (module docstring: silent corruption)."""
        rank, ev = finding.rank, finding.evidence
        if rank not in hosts:
            return None
        node = hosts[rank]
        since, window = _int(ev.get("since_step"), finding.step), _int(ev.get("window"), 8)
        opened = self.outliers.setdefault(node, {})
        before = [s for s, _ in opened.values()]
        if rank in opened and opened[rank][0] == since:
            return None  # the same incident, said again
        opened[rank] = [since, window]
        mine = sorted(r for r, h in hosts.items() if h == node)
        starts = [opened[r][0] for r in mine if r in opened]
        if len(mine) >= 2 and len(starts) == len(mine) and max(starts) - min(starts) <= window:
            why = (f"the local loss of every rank of it ({_span(mine)}) left its peers' at "
                   f"once (since step {min(starts)}), each on its own shard of the batch: "
                   "what they share is the host, not the data")
            return self._mark(node, Mark("sdc-suspect", True, finding.step, why))
        again = [s for s in before if s + window < since]
        if again:
            why = (f"its local loss left its peers' again (rank {rank} since step {since}, "
                   f"an earlier incident since step {again[-1]}): the fault outlived the "
                   "data then in flight")
            return self._mark(node, Mark("sdc-suspect", True, finding.step, why))
        why = (f"rank {rank}'s local loss off its peers' since step {since}: once, one rank; "
               "a corrupt data shard not ruled out")
        return self._mark(node, Mark("sdc-suspect", False, finding.step, why))

    def _mark(self, node: str | None, mark: Mark) -> str | None:
        if not node:
            return None
        mine = self.marks.setdefault(node, {})
        old = mine.get(mark.cause)
        if old is not None and old.sick and not mark.sick:
            return None  # a softer sign of what is already known
        mine[mark.cause] = mark
        return node

    def verdicts(self, hosts: dict[int, str],
                 prices: dict[str, Price] | None = None) -> list[NodeVerdict]:
        """Every node the run has ranks on, or evidence against, by name."""
        nodes: dict[str, list[int]] = {n: [] for n in self.marks}
        for r, h in hosts.items():
            nodes.setdefault(h, []).append(r)
        return [self.verdict(n, tuple(sorted(ranks)), (prices or {}).get(n))
                for n, ranks in sorted(nodes.items())]

    def verdict(self, node: str, ranks: tuple[int, ...], price: Price | None = None
                ) -> NodeVerdict:
        marks = list(self.marks.get(node, {}).values())
        if not marks:
            return NodeVerdict(node, ranks, "healthy", None, None, "nothing against it")
        top = min(marks, key=lambda m: (not m.sick, CAUSES.index(m.cause)))
        return NodeVerdict(node, ranks, "sick" if top.sick else "suspect", top.cause,
                           top.step, top.why, price)

    def to_dict(self) -> dict[str, Any]:
        return {"marks": {n: {c: [m.sick, m.step, m.why] for c, m in ms.items()}
                          for n, ms in self.marks.items()},
                "slow_steps": dict(self.slow_steps), "nans": [list(i) for i in self.nans],
                "outliers": {n: {str(r): list(v) for r, v in by.items()}
                             for n, by in self.outliers.items()},
                "dead": {n: list(a) for n, a in self.dead.items()},
                "linked": sorted(self.linked)}

    def restore(self, data: dict[str, Any]) -> None:
        self.marks = {str(n): {str(c): Mark(str(c), bool(v[0]), int(v[1]), str(v[2]))
                               for c, v in ms.items()}
                      for n, ms in (data.get("marks") or {}).items()}
        self.slow_steps = {str(n): int(s) for n, s in (data.get("slow_steps") or {}).items()}
        self.nans = [list(i) for i in data.get("nans") or []]
        self.outliers = {str(n): {int(r): [int(v[0]), int(v[1])] for r, v in by.items()}
                         for n, by in (data.get("outliers") or {}).items()}
        self.dead = {str(n): [int(a) for a in v] for n, v in (data.get("dead") or {}).items()}
        self.linked = {str(n) for n in data.get("linked") or ()}


def price(tax_seconds: float, wall_seconds: float, recoveries: list[float]) -> Price:
    """A node's ``Price``: its straggler tax so far over the run's ``wall_seconds``, against
    the median of the job's measured restart costs (``recoveries``: seconds to train again
    plus the work re-done, each), else ``DEFAULT_RESTART_SECONDS``.

        >>> price(420.0, 7200.0, []).words()
        "its straggler tax so far 420 s (210 s an hour) against one restart's 300 s (none measured: the default): leaving it out pays"
        >>> price(60.0, 3600.0, [100.0, 140.0, 900.0]).words()
        "its straggler tax so far 60 s (60 s an hour) against one restart's 140 s (measured): leaving it out pays in 1.3 h at this rate"
    """
    rate = tax_seconds * 3600.0 / wall_seconds if wall_seconds > 0 else 0.0
    if recoveries:
        costs = sorted(recoveries)
        return Price(tax_seconds, rate, costs[len(costs) // 2], True)
    return Price(tax_seconds, rate, DEFAULT_RESTART_SECONDS, False)


def _first_rank(ev: dict[str, Any], hosts: dict[int, str]) -> int | None:
    """The rank a NaN incident started on: ``nan_inf``'s ``first_rank``, else, when the
    first ranks (``first_ranks``, "2, 3") all sit on one node and some other rank stayed
    finite or only followed, the first of them. Without a local loss gone first the
    collective hides which rank made it, but a non-finite gradient norm on one node's
    ranks alone cannot have come through the all-reduce (it hands every rank the same
    sum): it was made on that node after it (a flip in its copy of the gradients, its
    optimizer step)."""
    rank = ev.get("first_rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return rank if rank in hosts else None
    text = ev.get("first_ranks")
    if not isinstance(text, str):
        return None
    try:
        lead = sorted(int(r) for r in text.split(",") if r.strip())
    except ValueError:
        return None
    if not lead or any(r not in hosts for r in lead) or len({hosts[r] for r in lead}) != 1:
        return None
    return lead[0] if set(hosts) - set(lead) else None


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _str(value: Any) -> str | None:
    return value[:128] if isinstance(value, str) and value else None


def _span(ranks: list[int]) -> str:
    """[5] -> "rank 5", [4, 5] -> "ranks 4-5", [4, 6] -> "ranks 4,6"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + (f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1))
                       else ",".join(map(str, ranks)))
