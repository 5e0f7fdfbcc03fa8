"""How an attempt's ranks ended, and which of them died without a word (issue 44, ``gone``).

A launcher that restarts its job (torchrun elastic) relaunches it within seconds of a rank's
process dying (SIGKILL, the OOM killer, a segfault): long before any hang detector could
fire. What is left to read is how each rank of the ended attempt ended, by its ``end``
record (the client sends one when its script dies of an exception):

- **crashed**: a ``failed`` end with an exception of the job's own (a ``ValueError``, an
  out-of-memory, a failed assertion): the attempt's cause, said by ``crashed``'s page.
- **lost a peer**: a ``failed`` end whose exception is a collective that lost the process
  at its other end (gloo's "Connection closed by peer" / "Connection reset by peer", a
  broken pipe, NCCL's remote error, a collective timed out): a victim of another rank's
  death, never its cause (detectors/crashed.py ``PEER_LOST``).
- **stopped by a signal**: a ``stopped`` end whose error is SIGTERM's. A launcher stops
  every other worker with SIGTERM once one of them died (torchrun's agent, ``srun``), and
  the client says so before the process dies of it (client/_sigterm.py): also a victim.
- **silent**: no end record at all. A process killed outright says nothing; nor does one
  stopped by an older client, or one whose last records could not leave in time.

The dead rank is among the silent ones, and only when some other rank ended as a victim
(lost a peer, or was stopped by a signal) and none of an exception of its own: that is the
evidence that a process went away, and nothing else explains the end. Several silent ranks
(the dead one and those cut off without a word) are told apart by the address the peer-lost
errors name (gloo says ``[10.0.0.3]:port``): the silent ranks of the node at that address
(``addresses``: rank -> its node's address, as the run's leader hears it). Without an
address, the silent ranks are named only when they all sit on one node. Anything else
names nobody: a wrong node costs a restart.

A 2-node x 2-rank job; rank 2's process was killed, ranks 0, 1, 3 lost it::

    >>> lost = "RuntimeError: [pair.cc:553] Connection closed by peer [10.0.0.2]:21170"
    >>> end = judge(1, [0, 1, 2, 3], {0: ("failed", lost), 1: ("failed", lost),
    ...                               3: ("failed", lost)},
    ...             {0: "a", 1: "a", 2: "b", 3: "b"})
    >>> end.gone, end.lost, end.crashed
    ((2,), (0, 1, 3), ())
    >>> print(end.words())
    rank 2 on b ended without a word (killed, out of memory, or lost with its node); ranks 0-1,3 lost it as a peer

The same kill where the launcher stopped the others first, each saying so::

    >>> stop = ("stopped", "SIGTERM: stopped by its launcher")
    >>> print(judge(1, [0, 1, 2, 3], {0: stop, 1: stop, 3: stop},
    ...             {0: "a", 1: "a", 2: "b", 3: "b"}).words())
    rank 2 on b ended without a word (killed, out of memory, or lost with its node); ranks 0-1,3 were stopped by a signal after it
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from monitor_agent.detectors.crashed import peer_lost, user_stop
from monitor_agent.records.types import launcher_stopped

_ADDRESS = re.compile(r"\[([0-9A-Fa-f:.]+)\]:\d+")
def cut_off(rank: int, status: str, error: str | None, ranks: Iterable[int],
            ends: Mapping[int, tuple[str, str | None]]) -> bool:
    """Whether ``rank``'s end (``status``, ``error``) says only that its launcher stopped it
    while some other rank of its attempt (``ranks``, with their ``ends`` so far) did not
    end so: such an end does not end the run, whose relaunch (``judge`` then names the rank
    that died) or silence tells how it ended. Every rank stopped so is the job stopped.

        >>> stop = ("stopped", "SIGTERM: stopped by its launcher (...)")
        >>> cut_off(0, *stop, [0, 1, 2], {1: stop}), cut_off(0, *stop, [0, 1, 2], {1: stop, 2: stop})
        (True, False)
    """
    if not launcher_stopped(status, error):
        return False
    ends = {**ends, rank: (status, error)}
    return not all(r in ends and launcher_stopped(*ends[r]) for r in ranks)


def named_addresses(error: str | None) -> set[str]:
    """The peer addresses a collective's error names (gloo: ``[10.1.0.3]:20693``)."""
    return set(_ADDRESS.findall(error or ""))


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """How attempt ``number``'s ranks ended (module docstring)."""

    number: int
    gone: tuple[int, ...]  # died without a word: named
    silent: tuple[int, ...]  # sent no end record (the dead, and those cut off)
    lost: tuple[int, ...]  # ended with a peer-lost error
    crashed: tuple[int, ...]  # ended with an exception of their own
    hosts: tuple[tuple[int, str], ...] = ()  # rank -> node, of the ranks named
    signalled: tuple[int, ...] = ()  # ended stopped by SIGTERM (their launcher's teardown)

    def words(self) -> str:
        """'rank 5 on node-2 ended without a word ...; ranks 0-4,6-7 lost it as a peer'."""
        where = dict(self.hosts)
        if self.gone:
            nodes = sorted({where[r] for r in self.gone if r in where})
            on = f" on {', '.join(nodes)}" if nodes else ""
            text = (f"{_span(self.gone)}{on} ended without a word (killed, out of memory, "
                    "or lost with its node)")
            it = "it" if len(self.gone) == 1 else "them"
            if self.lost:
                text += f"; {_span(self.lost)} lost {it} as a peer"
            if self.signalled:
                text += (f"; {_span(self.signalled)} "
                         f"{'was' if len(self.signalled) == 1 else 'were'} stopped by a "
                         f"signal after {it}")
            return text
        if self.crashed:
            return f"{_span(self.crashed)} crashed of an exception of its own"
        if self.lost and self.silent:
            return (f"{_span(self.lost)} lost a peer; {_span(self.silent)} ended without a "
                    "word, the dead one among them (no address or node tells which)")
        return ""

    def evidence(self) -> dict[str, Any]:
        return {"ended_attempt": self.number, "gone_ranks": list(self.gone),
                "silent_ranks": list(self.silent), "peer_lost_ranks": list(self.lost),
                "signalled_ranks": list(self.signalled), "crashed_ranks": list(self.crashed)}


def judge(number: int, ranks: Iterable[int], ends: Mapping[int, tuple[str, str | None]],
          hosts: Mapping[int, str], addresses: Mapping[int, str] | None = None) -> AttemptEnd:
    """How attempt ``number`` ended: ``ranks`` trained in it, ``ends`` rank -> (status,
    error) of their end records, ``hosts`` rank -> node, ``addresses`` rank -> its node's
    address where known (module docstring states the rule)."""
    ranks = sorted(set(ranks))
    silent = tuple(r for r in ranks if r not in ends)
    failed = {r: e for r, (s, e) in ends.items() if r in ranks and s == "failed"
              and not user_stop(e)}
    lost = tuple(sorted(r for r, e in failed.items() if peer_lost(e)))
    crashed = tuple(sorted(r for r in failed if r not in lost))
    signalled = tuple(sorted(r for r, (s, e) in ends.items() if r in ranks
                             and s == "stopped" and (e or "").startswith("SIGTERM")))
    gone: tuple[int, ...] = ()
    if (lost or signalled) and silent and not crashed:
        gone = _dead(silent, [failed[r] for r in lost], hosts, addresses or {})
    named = {r: hosts[r] for r in gone if r in hosts}
    return AttemptEnd(number, gone, silent, lost, crashed, tuple(sorted(named.items())),
                      signalled)


def _dead(silent: tuple[int, ...], errors: list[str | None], hosts: Mapping[int, str],
          addresses: Mapping[int, str]) -> tuple[int, ...]:
    """The silent ranks that died: those of the node the victims' errors name, else all
    of them when they share one node; () when nothing tells. An address tells only when
    every silent rank's is known (the dead one is silent: its node cannot be missing from
    the table while another node's cut-off ranks are matched) and it is one node's alone
    (on one host every node shares it)."""
    named = set().union(*(named_addresses(e) for e in errors))
    nodes = {hosts[r] for r, a in addresses.items() if a in named and r in hosts}
    if len(nodes) == 1 and all(r in addresses for r in silent):
        (node,) = nodes
        there = tuple(r for r in silent if hosts.get(r) == node)
        if there:
            return there
    if len({hosts.get(r) for r in silent}) == 1 and silent[0] in hosts:
        return silent
    return ()


def _span(ranks: tuple[int, ...]) -> str:
    """(5,) -> "rank 5", (4, 5) -> "ranks 4-5", (0, 1, 3) -> "ranks 0-1,3"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return "ranks " + ",".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in runs)
