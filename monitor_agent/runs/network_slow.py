"""The node whose link is slow, from every node's TCP round-trip times to the others
(issue 44, ``network-slow``; the figures: cluster/tcp_probe.py).

A ring collective makes every rank wait for its slowest link, so a capped link slows every
rank alike and step timings cannot name it. The connections can: a node's link slow, what
it sends queues there, and so does what its peers send it, so every pair with it in it
measures a longer round trip, from either end, while the pairs without it do not. The
node is the one in common to the slow pairs.

The rule (``slow_node``), on the latest figures of each (node, peer node) pair that
carries the collective (``collective``: not a store's request/response connection), from
the connections that carried data since the sample before: with a pair without node N to
compare with, N's link is slow when

- most of its pairs (at least half) are slower than the slowest pair without it *plus
  four times that pair's RTT mean deviation* (``rttvar``, the kernel's own running noise
  of the pair's RTT samples): past what TCP's retransmission timer allows for that pair
  (RTO = srtt + 4 rttvar, RFC 6298). No milliseconds are chosen: the bound is the other
  pairs' own noise. Most, not all: a pair sampled while the node's queue happened to be
  empty, or a request/response connection (the rendezvous store's host has one to every
  node) measures a quiet moment; and
- those slow pairs reach two or more different peers (one slow pair cannot tell its two
  ends apart).

A pair is slow, too, when its connection spent longer sending each byte than any pair
without N allows for (``ms_per_mb``: the time it had data in flight, not waiting for its
receiver, over the bytes it moved since the sample before; tcp_probe.py says why a round
trip read at a moment misses a capped link's queue and this does not): longer than the
other pair's smoothed time per byte plus four of its mean deviations, the same estimator
and margin TCP keeps for round trips (RFC 6298: gains 1/8 and 1/4, a first deviation of
half the first sample), kept per pair over its samples (``Spread``, in ``LinkJudge``).
The bound is again the other pairs' own noise: on the namespace cluster the healthy pairs
moved a ring's data at 236-630 Mbit/s while sending and a node capped at 150 Mbit/s moved
it at 117-160.

Every pair past the bound has N in it (the bound is the slowest pair without it), so N is
the node in common to the slow pairs; at most one node passes (its peers' pairs with it
are slow, so every other node has a slow pair without it). Judged at every sample; one sample is a moment (a busy host answers late
for a second: on the namespace cluster a healthy node just starting its ranks once
measured 0.75-5.7 ms against another pair's 0.1 ms), so the node is **suspect** once its
link has been slow at every judgement for ``hold_seconds`` (a window of samples), and
**sick** once for twice that, or in a later episode that held a window too
(``LinkJudge``).

    >>> pairs = {("a", "b"): Rtt(68.0, 8.0), ("d", "a"): Rtt(80.0, 2.0),
    ...          ("b", "c"): Rtt(0.12, 0.07), ("c", "d"): Rtt(0.08, 0.03)}
    >>> slow_node(pairs).node
    'a'
    >>> slow_node({**pairs, ("d", "a"): Rtt(0.3, 0.2)}) is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

BULK_SHARE = 10
"""A pair whose connection moved less than a tenth of the busiest pair's bytes is not the
collective's but a request/response one (a rendezvous store's, an agent's heartbeat): it
measures its peer's answer time and delayed ACK (up to 40 ms), not the link, and its
noise would set everyone's bound. Measured on the namespace cluster: a ring's edges moved
550-780 KB a second each, the store's connections 1.2-1.7 KB; any cut between 2x and
300x splits them alike."""
NOISE_DEVIATIONS = 4.0
"""RTT mean deviations a slow pair's RTT must exceed the slowest other pair by: the
margin of TCP's own retransmission timer (RFC 6298: RTO = SRTT + 4 RTTVAR)."""


@dataclass(frozen=True, slots=True)
class Rtt:
    """One pair's figures: the median smoothed RTT of its active connections and their
    median RTT mean deviation, in ms."""

    rtt_ms: float
    rttvar_ms: float
    bytes: int = 0  # what the connection moved since the sample before
    sending_ms: float = 0.0  # the time it spent sending that (tcp_probe.py)

    @property
    def ms_per_mb(self) -> float | None:
        """Milliseconds spent sending each megabyte moved; None without both figures."""
        if self.sending_ms <= 0 or self.bytes <= 0:
            return None
        return self.sending_ms * 1e6 / self.bytes


@dataclass(frozen=True, slots=True)
class Spread:
    """A pair's smoothed time per megabyte sent and its mean deviation (RFC 6298's
    estimator, applied to ``Rtt.ms_per_mb`` sample by sample)."""

    mean: float
    dev: float

    @staticmethod
    def first(sample: float) -> Spread:
        return Spread(sample, sample / 2)

    def then(self, sample: float) -> Spread:
        return Spread(self.mean + (sample - self.mean) / 8,
                      self.dev + (abs(self.mean - sample) - self.dev) / 4)

    @property
    def bound(self) -> float:
        return self.mean + NOISE_DEVIATIONS * self.dev


@dataclass(frozen=True, slots=True)
class SlowLink:
    """The node in common to the slow pairs, and the evidence."""

    node: str
    peers: tuple[str, ...]
    slow_ms: tuple[float, float]  # its pairs' RTT, fastest and slowest
    others_ms: tuple[float, float]  # the pairs without it, fastest and slowest
    bound_ms: float  # the slowest other pair plus its noise margin
    slow_pairs: int = 0  # its pairs past the bound
    pairs: int = 0  # its pairs measured
    # Sending rates in Mbit/s, when some of its pairs were slow by their time per byte:
    # its slow pairs' (slowest, fastest), the other pairs' and the bound's (the rate of the
    # other pairs' longest smoothed time per byte plus its margin).
    slow_mbit: tuple[float, float] | None = None
    others_mbit: tuple[float, float] | None = None
    bound_mbit: float | None = None

    def words(self) -> str:
        share = ("every pair of it" if self.slow_pairs == self.pairs else
                 f"{self.slow_pairs} of its {self.pairs} pairs")
        said = (f"its link is slow: {share} ({len(self.peers)} peers: "
                f"{', '.join(self.peers[:8])}) ")
        if self.slow_mbit is not None and self.others_mbit is not None \
                and self.bound_mbit is not None:
            return said + (
                f"sent data at {_mbit(self.slow_mbit[0])}-{_mbit(self.slow_mbit[1])} while "
                f"sending, the pairs without it at {_mbit(self.others_mbit[0])}-"
                f"{_mbit(self.others_mbit[1])} (at least {_mbit(self.bound_mbit)} with "
                f"{NOISE_DEVIATIONS:g} mean deviations of their time per byte, the margin "
                f"TCP's own retransmission timer allows its round trips); round trips "
                f"{_ms(self.slow_ms[0])}-{_ms(self.slow_ms[1])} against "
                f"{_ms(self.others_ms[0])}-{_ms(self.others_ms[1])}")
        return said + (
            f"measure a TCP round trip of "
            f"{_ms(self.slow_ms[0])}-{_ms(self.slow_ms[1])}, the pairs without it "
            f"{_ms(self.others_ms[0])}-{_ms(self.others_ms[1])} (at most "
            f"{_ms(self.bound_ms)} with {NOISE_DEVIATIONS:g} RTT mean deviations, the "
            "margin TCP's own retransmission timer allows)")


def _ms(value: float) -> str:
    return f"{value:.3g} ms"


def _mbit(value: float) -> str:
    return f"{value:.3g} Mbit/s"


def _rate(ms_per_mb: float) -> float:
    """Milliseconds per megabyte as megabits per second."""
    return 8e3 / ms_per_mb


Pair = tuple[str, str]


def slow_node(pairs: dict[Pair, Rtt], spreads: dict[Pair, Spread] | None = None
              ) -> SlowLink | None:
    """The node whose link is slow by the module's rule, else None. ``pairs``:
    (local node, remote node) -> the figures the local node's connections measure;
    ``spreads``: each pair's time per byte sent, smoothed, and its noise (none: the round
    trips alone are judged)."""
    pairs = collective(pairs)
    spreads = spreads or {}
    nodes = sorted({n for pair in pairs for n in pair})
    for node in nodes:
        mine = {k: v for k, v in pairs.items() if node in k}
        others = {k: v for k, v in pairs.items() if node not in k}
        if not others:
            continue
        bound = max(v.rtt_ms + NOISE_DEVIATIONS * v.rttvar_ms for v in others.values())
        noise = [spreads[k] for k in others if k in spreads]
        per_mb = max((s.bound for s in noise), default=None)
        by_rate = {k: v for k, v in mine.items()
                   if per_mb is not None and (t := v.ms_per_mb) is not None and t > per_mb}
        slow = {k: v for k, v in mine.items() if v.rtt_ms > bound or k in by_rate}
        peers = sorted({b if a == node else a for a, b in slow})
        if len(peers) < 2 or 2 * len(slow) < len(mine):
            continue
        rtts = [v.rtt_ms for v in slow.values()]
        found = SlowLink(node, tuple(peers), (min(rtts), max(rtts)),
                         (min(v.rtt_ms for v in others.values()),
                          max(v.rtt_ms for v in others.values())),
                         bound, len(slow), len(mine))
        if by_rate and per_mb is not None:
            theirs = [_rate(t) for v in others.values() if (t := v.ms_per_mb) is not None]
            rates = [_rate(v.ms_per_mb) for v in by_rate.values() if v.ms_per_mb]
            found = replace(found, slow_mbit=(min(rates), max(rates)),
                            others_mbit=(min(theirs), max(theirs)) if theirs else
                            (_rate(per_mb), _rate(per_mb)),
                            bound_mbit=_rate(per_mb))
        return found
    return None


def collective(pairs: dict[tuple[str, str], Rtt]) -> dict[tuple[str, str], Rtt]:
    """The pairs that carry the job's collective: those that moved at least
    ``1 / BULK_SHARE`` of what the busiest pair moved (all, when no pair says)."""
    top = max((v.bytes for v in pairs.values()), default=0)
    return {k: v for k, v in pairs.items() if v.bytes * BULK_SHARE >= top}


@dataclass(slots=True)
class LinkJudge:
    """The latest figures of each pair of one run's nodes, and the streak of the node they
    name (module docstring). No I/O: the leader feeds it what each node's sidecar sends."""

    hold_seconds: float
    max_age_seconds: float
    # (local node, remote node) -> (its figures, when they arrived)
    pairs: dict[Pair, tuple[Rtt, float]] = field(default_factory=dict)
    spreads: dict[Pair, Spread] = field(default_factory=dict)  # each pair's time per byte
    streak: tuple[str, float] | None = None  # (node, since when it is judged slow)
    counted: tuple[str, float] | None = None  # the streak last counted an episode
    episodes: dict[str, int] = field(default_factory=dict)  # node -> episodes held

    def observe(self, local: str, figures: dict[str, Rtt], now: float) -> None:
        """``local``'s sample: its figures to each peer node (they replace its earlier
        ones: a pair it no longer measures is not kept)."""
        self.pairs = {k: v for k, v in self.pairs.items() if k[0] != local}
        for remote, rtt in figures.items():
            if remote != local:
                self.pairs[(local, remote)] = (rtt, now)
                sample, pair = rtt.ms_per_mb, (local, remote)
                if sample is not None:
                    was = self.spreads.get(pair)
                    self.spreads[pair] = Spread.first(sample) if was is None else \
                        was.then(sample)
        self.spreads = {k: v for k, v in self.spreads.items() if k in self.pairs}

    def judge(self, now: float) -> tuple[SlowLink, bool] | None:
        """The node whose link has been slow at every judgement for ``hold_seconds``, and
        whether it is sick (slow for twice that, or in a later episode); None while no
        node's is, or not yet for that long."""
        fresh = {k: r for k, (r, at) in self.pairs.items() if now - at <= self.max_age_seconds}
        found = slow_node(fresh, self.spreads)
        if found is None:
            self.streak = None
            return None
        if self.streak is None or self.streak[0] != found.node:
            self.streak = (found.node, now)
        held = now - self.streak[1]
        if held < self.hold_seconds:
            return None
        if self.counted != self.streak:  # this episode held a window: count it once
            self.counted = self.streak
            self.episodes[found.node] = self.episodes.get(found.node, 0) + 1
        return found, held >= 2 * self.hold_seconds or self.episodes[found.node] >= 2
