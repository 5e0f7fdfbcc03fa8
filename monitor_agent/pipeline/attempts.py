"""Attempts of a run id: which process sent a record, and what its records replace.

A run id is reused all the time: a relaunch after a crash resumes from a checkpoint and
sends steps S, S+1, ... again; a fixed ``run_id="gpt-exp-1"`` run twice starts over. The
client draws a token once per ``Monitor`` (docs/format.md, ``attempt``) and sends it with
every record; records without one (older clients) carry the legacy token ``""``.

An **attempt** is a contiguous segment of a run id's history, begun by a new process: the
records of one or more tokens. A token never seen for the run joins the latest attempt when
that attempt has no process of the token's rank yet (the other ranks of the same launch),
and otherwise begins the next attempt. A retried batch carries the same token and the same
records: it stays an exact duplicate (records are unique per run, rank, kind, step and
attempt).

An attempt is *pending* until its first step or eval record arrives (not an end record: a
process that dies before its first step ends only itself); that record's step ``S``
settles its kind against the run's current history before it (the steps earlier
attempts sent that nothing has replaced yet), first step ``F``, last step ``L``:

- ``first``: attempt 1.
- ``restarted`` when ``S <= F``: it begins where the run began (or earlier), so it cannot
  be continuing it; a new run reusing the id. The whole history before it is kept, as
  the earlier attempts', and leaves the current history (``F..L`` replaced).
- ``resumed`` otherwise: the same run continuing from a checkpoint at ``S``; the history's
  steps ``S..L`` are kept but marked replaced (abandoned), or nothing when ``S > L``. The
  earlier attempts' run and end records are replaced too: the run is running again.

The config is not compared: a resume may legitimately change it (a lower learning rate
after a divergence). A replaced record stays stored, with ``superseded_by`` its attempt;
reads default to the current history. Settling a resumed or restarted attempt rebuilds the
run in memory at its start step: the newest detector snapshot below it, plus the kept
records after that snapshot (registry.py ``RunRegistry.rebuild``).

A token is also the writer's identity (one bearer token is shared by every job): a
``checkpoint`` record never begins or joins an attempt, and is taken only under a token
already placed, from a rank that sent step records in that attempt (``writer``). Records
without a token share the legacy token: a run of old clients works as before, and a
token-less checkpoint cannot land in an attempt begun by token-carrying ones. A replaced
attempt that keeps sending is a second live job on the run id: the engine judges and pages
it apart (``Detection.rival``, detectors/two_jobs.py); it does not take the history back.

**A new attempt supersedes a live job only when that job stopped** (docs/format.md, "Who
may write what"). A token joins or begins an attempt as above, but the record that would
*settle* a new attempt (replace the history) is refused as a whole request with 409, which
a client retries with its records kept, while the run's current attempt still holds it
(``holds_history``): it sent a record within ``quiet`` seconds (``attempt_quiet_seconds``,
or ``QUIET_STEPS`` of its own step intervals if longer), it has not ended, it is not
silent, and no action asks for a relaunch (a rollback or stop pending: the lifecycle's
``expects_new_attempt``). A relaunch comes after its job stopped, so it waits at most that
long; one record from a stranger does not make a job that keeps sending stop. A digest a
node sidecar forwards settles as it settled there (that sidecar applied the rule to its
own ranks). Until it settles, a new attempt's records (its run record, an end record from
a process that died before its first step) are held: stored, not applied to the run, and
replayed when it settles (``owner``). The attempt that owns the run's history also owns
its placement in a multi-node job (pipeline/placement.py ``Placement.place``).

A closed-loop rollback to step S (the same processes reload a checkpoint and send S, S+1,
... again) is a resumed attempt too: open the next attempt settled at S
(``settle``/``settled``, ``Store.settle_attempt``) and point the run's current tokens at
it (``tokens``; ``attempt_tokens`` in the store); the rest follows from here.

Three attempts of ``gpt-exp-1``: the first ran steps 1..1500, the second resumed from a
checkpoint at 1200, the third starts over at step 1::

    >>> settle(1, start=1, history=(None, None))
    Settled(kind='first', superseded_from=None, superseded_to=None)
    >>> settle(2, start=1200, history=(1, 1500))
    Settled(kind='resumed', superseded_from=1200, superseded_to=1500)
    >>> settle(3, start=1, history=(1, 1800))
    Settled(kind='restarted', superseded_from=1, superseded_to=1800)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from monitor_agent.errors import MonitorAgentError
from monitor_agent.records.types import CheckpointRecord, EvalRecord, Record, StepRecord
from monitor_agent.storage.store import Store, StoredAttempt

LEGACY_TOKEN = ""  # records without an ``attempt`` field: one implicit attempt
QUIET_STEPS = 5.0
"""A job that stepped every T seconds and has sent nothing for this many T (or for
``attempt_quiet_seconds``, whichever is longer) has stopped, or paused (an evaluation, a
save): a new attempt may replace it."""


class AttemptWaits(MonitorAgentError):
    """A record would settle a new attempt of a run whose current attempt still holds
    its history (``holds_history``): refused as a whole request, to be sent again."""

    def __init__(self, reason: str, attempt: int) -> None:
        super().__init__(reason)
        self.reason, self.attempt = reason, attempt


def holds_history(run_id: str, current: int, relaunch_expected: bool, silent_for: float,
                  step_interval: float | None, quiet_floor: float) -> str | None:
    """Why attempt ``current`` of ``run_id`` still holds the run's history against a new
    attempt, or None when a new one may replace it: the run ended, went silent or awaits a
    relaunch (``relaunch_expected``), or nothing of ``current`` arrived for ``quiet`` s.

        >>> holds_history("r", 1, False, silent_for=30.0, step_interval=0.5, quiet_floor=10)
        >>> print(holds_history("r", 1, False, silent_for=0.4, step_interval=0.5,
        ...                     quiet_floor=10))
        attempt: run r's attempt 1 is live (its last record arrived 0.4 s ago): a new process begins the next attempt once attempt 1 ends, sends nothing for 10 s or is asked to relaunch (a rollback, a stop); a second job needs a run id of its own. Retry later.
        >>> holds_history("r", 1, True, silent_for=0.4, step_interval=0.5, quiet_floor=10)
    """
    if relaunch_expected:
        return None
    quiet = max(quiet_floor, QUIET_STEPS * (step_interval or 0.0))
    if silent_for >= quiet:
        return None
    return (f"attempt: run {run_id}'s attempt {current} is live (its last record arrived "
            f"{silent_for:.1f} s ago): a new process begins the next attempt once attempt "
            f"{current} ends, sends nothing for {quiet:.0f} s or is asked to relaunch (a "
            "rollback, a stop); a second job needs a run id of its own. Retry later.")


@dataclass(frozen=True, slots=True)
class Settled:
    """A pending attempt's kind and the range of earlier history it replaced."""

    kind: str
    superseded_from: int | None
    superseded_to: int | None


def settle(number: int, start: int, history: tuple[int | None, int | None]) -> Settled:
    """Classify attempt ``number`` whose first step is ``start``, given the first and last
    step of the current history before it (the module docstring states the rule)."""
    first, last = history
    if number == 1 or first is None or last is None:
        return Settled("first" if number == 1 else "resumed", None, None)
    if start <= first:
        return Settled("restarted", first, last)
    if start <= last:
        return Settled("resumed", start, last)
    return Settled("resumed", None, None)


@dataclass(slots=True)
class RunAttempts:
    """The attempts of one run as the engine tracks them (loaded with the run)."""

    attempts: list[StoredAttempt]
    tokens: dict[str, tuple[int, int]]  # token -> (attempt number, rank that first sent it)
    # (attempt number, rank) of the ranks that sent step records in each attempt: the
    # processes that train there, the only ones a checkpoint is taken from (``writer``).
    stepped: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    # attempt number -> the ranks that first sent a token in it (``tokens`` by attempt:
    # ``place`` asks it for every unseen token, and a 16,384-rank job's new attempt brings
    # one from each rank, so scanning ``tokens`` there was quadratic in the ranks).
    ranks_of: dict[int, set[int]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for number, rank in self.tokens.values():
            self.ranks_of.setdefault(number, set()).add(rank)

    @classmethod
    def load(cls, store: Store, run_id: str) -> RunAttempts:
        return cls(store.attempts(run_id),
                   {token: (number, rank) for token, rank, number in
                    store.attempt_tokens(run_id)},
                   {(number, rank) for number, rank in store.attempt_ranks(run_id)})

    @property
    def current(self) -> int:
        """The latest attempt's number (0 before the run's first record)."""
        return self.attempts[-1].number if self.attempts else 0

    @property
    def owner(self) -> int:
        """The attempt whose records are the run's history now: the newest settled one
        (attempt 1 before its first step; 0 before the run's first record). A later one,
        still pending, owns nothing yet: its records are held."""
        for attempt in reversed(self.attempts):
            if attempt.kind != "pending":
                return attempt.number
        return 1 if self.attempts else 0

    def get(self, number: int) -> StoredAttempt:
        return self.attempts[number - 1]

    def place(self, token: str, rank: int, moved: bool = False) -> tuple[int, bool]:
        """The attempt an unseen token belongs to, and whether it is a new one. ``moved``:
        its process says its node sits elsewhere in the job than this sidecar's ranks of
        the latest attempt did (a re-rendezvous renumbered the nodes: this machine's ranks
        are others now, unseen here, yet a new launch, not more ranks of the old one)."""
        if not self.attempts:
            return 1, True
        if rank not in self.ranks_of.get(self.current, ()) and not moved:
            return self.current, False  # another rank of the same launch
        return self.current + 1, True

    def replace(self, attempt: StoredAttempt) -> None:
        self.attempts[attempt.number - 1] = attempt

    def place_record(self, store: Store, record: Record, now: float, limit: int,
                     held: str | None = None, moved: bool = False
                     ) -> tuple[str, int, StoredAttempt | None] | str:
        """(token, attempt number, the attempt if the record just settled it) for one
        arriving record, stored as decided (a new token at once, so a retry finds it); or
        why it may not begin an attempt (``limit``: ``max_attempts_per_run``). ``held``:
        why the run's current attempt still holds its history (``holds_history``): a
        record that would settle a later attempt raises ``AttemptWaits`` with it.
        ``moved``: as ``place`` says."""
        token = record.attempt or LEGACY_TOKEN
        known = self.tokens.get(token)
        if known is not None:
            number = known[0]
        else:
            number, new = self.place(token, record.rank, moved)
            if new and number > limit:
                return (f"attempt: run {record.run_id} has {number - 1} attempts "
                        f"(max_attempts_per_run={limit}); use a new run id")
            if new:
                store.add_attempt(record.run_id, number, token, record.rank, now)
                self.attempts.append(StoredAttempt(number, "pending", None, now, None, None))
            else:
                store.add_attempt_token(record.run_id, token, record.rank, number)
            self.tokens[token] = (number, record.rank)
            self.ranks_of.setdefault(number, set()).add(record.rank)
        pending = self.get(number)
        # Not on an end record: a process that fails before its first step ends only itself.
        if pending.kind != "pending" or not isinstance(record, StepRecord | EvalRecord):
            return token, number, None
        if held is not None and number > self.owner:
            raise AttemptWaits(held, number)
        found = settle(number, record.step, store.history_span(record.run_id, number))
        done = settled(pending, record.step, found)
        store.settle_attempt(record.run_id, done)
        self.replace(done)
        return token, number, done

    def writer(self, record: CheckpointRecord,
               batch: Collection[tuple[str, int, int]] = ()) -> str | None:
        """Why ``record``, a checkpoint, does not come from a process that trains in its
        attempt, or None. Its token must be one the run already placed (a checkpoint never
        begins or joins an attempt), and its rank must have sent a step record in that
        attempt (stored, or earlier in this ``batch``: (run id, attempt, rank)). A
        checkpoint becomes a rollback target that every rank reloads: one from a process
        that never trained in the attempt is not one to reload."""
        token = record.attempt or LEGACY_TOKEN
        known = self.tokens.get(token)
        if known is None:
            sent = f"attempt token {token!r}" if token else "no attempt token"
            return (f"attempt: a checkpoint of run {record.run_id} with {sent} that none of "
                    "its records carried before: a checkpoint is taken only from a process "
                    "that sent steps in its attempt")
        number = known[0]
        if (number, record.rank) in self.stepped or \
                (record.run_id, number, record.rank) in batch:
            return None
        return (f"rank: rank {record.rank} sent no step in attempt {number} of run "
                f"{record.run_id}: a checkpoint is taken only from a rank that trains in "
                "its attempt")

    def superseded_by(self, number: int, kind: str, step: int) -> int | None:
        """The later attempt that replaced a record of attempt ``number`` (one that
        arrives after that attempt began: a spool delivered late), or None."""
        for later in self.attempts[number:]:
            if later.kind == "restarted":
                return later.number
            if later.kind == "resumed" and later.start_step is not None and (
                    kind in ("run", "end") or step >= later.start_step):
                return later.number
        return None


def settled(attempt: StoredAttempt, start: int, found: Settled) -> StoredAttempt:
    """``attempt`` (pending) with its start and what ``settle`` found."""
    return dataclasses.replace(attempt, kind=found.kind, start_step=start,
                               superseded_from=found.superseded_from,
                               superseded_to=found.superseded_to)
