"""``hang``: where a stuck run is stuck, rank by rank, and which rank's process is gone.

The client's watchdog (client/monitor_client/_watchdog.py) sends one ``hang`` record when
no step completes within its limit: the Python stacks of its threads and what it was last
doing. This detector gathers those reports and judges the run on the clock (``tick``):

- **hung** ranks: a hang report newer than the rank's last step. The stuck frame is the
  innermost frame of its training thread, named with its line; "called from" the
  innermost frame of the script's own code below it (frames the client marked ``user``,
  ``<string>`` ones included for a script run as ``python -c`` or through ``exec``).
- **gone** ranks: no step and no hang report for ``gone_factor`` x the limit its watchdog
  would have reported at. That limit is known only when the run declares a watchdog (the
  run record's ``watchdog``: ``max(floor_seconds, factor x`` the rank's median step
  interval``)``) or when peers reported hangs (the largest ``limit_seconds`` they sent). A
  live watchdog reports by its limit plus a wake-up (1 s) and the delivery; twice the
  limit is the margin for the rank's own interval being noisier than its median says. So
  silence with no report is a process that can no longer report: killed or crashed.
  Sooner when its peers have reported (``_waited_on``): a rank at their pace (its own
  median gives it no longer a limit) has their watchdog's limit, measured, not estimated;
  and their reports showed how long a report takes to reach this detector. A
  live rank's report would have come by that limit (plus the peers' spread of limits), as
  late past it as theirs came (a wake-up at least) and that delay; the margin is
  ``gone_factor`` x the lateness and the delay, not x the limit (a SIGSTOPped rank under a
  10 s limit: about 14 s, not 20 s).

One finding per run while hung (``fingerprint: []`` in the rule), first emitted once every
known rank is hung or gone, or ``hang_settle_seconds`` after the first report unless a
silent rank is still to be judged: past its watchdog's limit, or not stepped past where the
hung ranks are stuck (so the page reads the whole picture, not the first rank to time out),
and repeated every
``hang_repeat_seconds`` while it lasts, which keeps the alert open; a step from every
reported rank ends it and the rule's ``resolve_after`` resolves it.

Four ranks; rank 2 sleeps, ranks 0, 1 and 3 wait in all_reduce::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> for s in range(1, 4):
    ...     for r in range(4):
    ...         _ = suite.update(parse_record({"kind": "step", "run_id": "g", "step": s,
    ...                                        "time": float(s), "rank": r}))
    >>> def hang(rank, file, fn, line):
    ...     frames = [{"file": "train.py", "line": 88, "function": "main", "user": True},
    ...               {"file": file, "line": line, "function": fn, "user": file == "train.py"}]
    ...     return parse_record({"kind": "hang", "run_id": "g", "step": 3, "time": 40.0,
    ...         "rank": rank, "stuck_seconds": 37.0, "limit_seconds": 30.0, "phase": "backward",
    ...         "threads": [{"name": "MainThread", "training": True, "frames": frames}]})
    >>> for r in (0, 1, 3):
    ...     _ = suite.update(hang(r, "torch/distributed/distributed_c10d.py", "all_reduce", 3252))
    >>> _ = suite.update(hang(2, "train.py", "slow_loader", 40))
    >>> [f.message for f in suite.tick(now=41.0) if f.type == "hang"]
    ['rank 2 stuck 37 s in train.py:slow_loader at line 40, called from train.py:88; ranks 0-1,3 wait in torch/distributed/distributed_c10d.py:all_reduce at line 3252 (last completed step 3)']
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.context import DetectorContext
from monitor_agent.detectors.support.liveness import Liveness
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window
from monitor_agent.records.types import Finding, HangRecord, Record, RunRecord, Severity, StepRecord

WAKE_SECONDS = 1.0  # the client's watchdog checks once a second (_watchdog.WAKE_SECONDS)

HUNG = (
    "Read the stuck frame of the odd rank out: it is where the job stopped; the others "
    "wait for it in the collective.",
    "py-spy dump --pid <pid> on that rank's host shows native frames too; with "
    "TORCH_NCCL_TRACE_BUFFER_SIZE set, the NCCL flight recorder's dump names the collective.",
    "Set a collective timeout (init_process_group(timeout=...)) so a hang fails fast.",
)
GONE = (
    "The process of the named rank is gone: check its host's kernel log (OOM killer), "
    "the scheduler's events (preemption, node failure) and its own log's last lines.",
    "Its peers will wait in the collective until their timeout: restart from the last "
    "checkpoint.",
)


class HangSettings(SharedSettings):
    """The knobs of ``hang`` (``detectors:`` in the sidecar's config)."""

    hang_settle_seconds: float = Field(
        default=15.0, ge=0,
        description="After the first hang report, wait this long for the other ranks' "
                    "reports before paging (unless every rank is accounted for sooner).")
    hang_repeat_seconds: float = Field(
        default=60.0, gt=0,
        description="While the run is hung the finding repeats this often (keeps the alert "
                    "open; the rule's resolve_after must exceed it).")
    gone_factor: float = Field(
        default=2.0, gt=1,
        description="A rank silent this many times its watchdog's limit, with no hang "
                    "report, is a process that is gone; when its peers reported, this many "
                    "times their lateness and delivery past their measured limit.")


@dataclass(slots=True)
class RankHang(Liveness):
    hang_time: float = 0.0       # when it was sent (the run's clock)
    stuck_seconds: float = 0.0
    limit_seconds: float = 0.0
    phase: str = "unknown"
    stuck_in: str = ""           # "file:function" of the training thread's innermost frame
    stuck_line: int = 0          # and its line (0: not known)
    called_from: str = ""        # "file:line" of the script's innermost frame below it
    nccl_trace: str = ""
    seen: float | None = None    # when a tick first saw its report (the sidecar's clock)


@dataclass(slots=True)
class RunHang:
    floor_seconds: float = 0.0   # the run's declared watchdog (0: none declared)
    factor: float = 0.0
    first_report: float | None = None
    last_emit: float | None = None
    picture: list[str] = field(default_factory=list)  # hung and gone ranks, last emitted


class HangDetector(DetectorBase[HangSettings]):
    """Critical when ranks report a hang or their process is gone (module docstring)."""

    type = "hang"
    severity = Severity.CRITICAL
    settings_model = HangSettings
    scope = "run"

    def __init__(self, settings: HangSettings, ctx: DetectorContext) -> None:
        super().__init__(settings, ctx)
        self.run = RunHang()

    def new_rank(self) -> RankHang:
        return RankHang(intervals=Window.of(self.settings.baseline_window))

    def update(self, record: Record) -> list[Finding]:
        if isinstance(record, HangRecord):
            self._on_hang(record, self._rank(record.rank))
        elif isinstance(record, RunRecord) and record.watchdog is not None:
            self.run.floor_seconds = record.watchdog.floor_seconds
            self.run.factor = record.watchdog.factor
        return super().update(record)

    def on_step(self, rec: StepRecord, st: RankHang) -> list[Finding]:
        st.saw_step(rec)
        return []

    def _on_hang(self, rec: HangRecord, st: RankHang) -> None:
        if not st.saw_hang(rec):
            return  # a report older than a step we already have: it moved on since
        frames = rec.training_frames()
        st.hang_time, st.seen = rec.time, None
        st.stuck_seconds, st.limit_seconds = rec.stuck_seconds, rec.limit_seconds or 0.0
        st.phase, st.nccl_trace = rec.phase, rec.nccl_trace or ""
        st.stuck_in, st.called_from = stuck_frame(frames)
        st.stuck_line = int(frames[-1].get("line") or 0) if frames else 0
        if self.run.first_report is None:
            self.run.first_report = rec.time

    # -- the clock ------------------------------------------------------------------------

    def tick(self, now: float) -> list[Finding]:
        if self.ctx.state.ended or not self.ranks:
            return []
        hung = {r: st for r, st in self.ranks.items() if st.hang_step >= 0}
        for st in hung.values():
            if st.seen is None:
                st.seen = now
        peer_limit = max((st.limit_seconds for st in hung.values()), default=0.0)
        # A run leader that cannot hear a node (its sidecar is away) does not know whether
        # that node's ranks run: unreachable, never "gone" (monitor_agent/cluster).
        unheard = sorted(r for r in self.ranks if r not in hung and r in self.ctx.unreachable)
        waited = self._waited_on(hung)
        gone = {r: st for r, st in self.ranks.items()
                if r not in hung and r not in unheard and self._gone(st, now, peer_limit, waited)}
        if not hung and not gone:
            self.run.first_report, self.run.picture = None, []
            return []
        picture = sorted(f"{'h' if r in hung else 'g'}{r}" for r in (*hung, *gone))
        # A silent rank not yet judged is waited for (at most until it is judged gone), so
        # the page names it: one past the limit its watchdog would report at, or one that
        # has not stepped past where the hung ranks are stuck (in a collective, the rank the
        # others wait for; its own limit can be longer than theirs).
        stuck_at = max((st.hang_step for st in hung.values()), default=-1)
        pending = [r for r, st in self.ranks.items() if r not in hung and r not in gone
                   and r not in unheard and (last := self._heard(st)) is not None
                   and (limit := self.expected_limit(st, peer_limit)) is not None
                   and (now - last > limit or st.last_step <= stuck_at)]
        settled = len(hung) + len(gone) + len(unheard) == len(self.ranks) or not hung or (
            not pending and self.run.first_report is not None
            and now - self.run.first_report >= self.settings.hang_settle_seconds)
        if not settled:
            return []
        last = self.run.last_emit
        if (picture == self.run.picture and last is not None
                and now - last < self.settings.hang_repeat_seconds):
            return []
        self.run.picture, self.run.last_emit = picture, now
        return [self._finding(hung, gone, now, unheard)]

    def expected_limit(self, st: RankHang, peer_limit: float) -> float | None:
        """When this rank's watchdog would have reported, if it is alive (None: unknown)."""
        declared = None
        if self.run.floor_seconds > 0:
            median = st.intervals.median() if len(st.intervals) else 0.0
            declared = max(self.run.floor_seconds, self.run.factor * median)
        known = [x for x in (declared, peer_limit or None) if x]
        return max(known) if known else None

    def _heard(self, st: RankHang) -> float | None:
        """When the rank was last heard, for its silence: no earlier than the run's current
        attempt began (a relaunched job's rank not heard yet is starting, not gone: its
        records of the job before are not its new process's)."""
        began = self.ctx.attempt_began
        if st.last_time is None or began is None:
            return st.last_time
        return max(st.last_time, began)

    def _waited_on(self, hung: dict[int, RankHang]) -> float | None:
        """The silence past which a rank at the reporting peers' pace would have reported
        if alive (module docstring): their largest limit, plus their limits' spread, plus
        ``gone_factor`` x how late past it they reported (a wake-up at least) and their
        reports' largest delay. None: no reports."""
        if not hung:
            return None
        limits = [st.limit_seconds for st in hung.values()]
        if min(limits) <= 0:
            return None  # a report without its limit: nothing measured
        # How late past its limit a live watchdog reported (a wake-up at least), and how
        # long its report took to be seen here: both measured on the peers' reports.
        late = max(WAKE_SECONDS, *(st.stuck_seconds - st.limit_seconds for st in hung.values()))
        delay = max(max(0.0, (st.seen or st.hang_time) - st.hang_time) for st in hung.values())
        after = 2 * max(limits) - min(limits) + self.settings.gone_factor * (late + delay)
        return after

    def _gone(self, st: RankHang, now: float, peer_limit: float,
              waited: float | None = None) -> bool:
        last = self._heard(st)
        if last is None:
            return False
        # At the peers' pace (its own median says no longer a limit than theirs; a rank
        # slower than they are has a limit of its own, judged below) it has their limit.
        if waited is not None and now - last > waited:
            declared = self.expected_limit(st, 0.0)
            if declared is None or declared <= peer_limit:
                return True
        # No rank's limit is below the declared floor or the peers' limit: a rank heard
        # within gone_factor x that is not gone, without its median interval (a leader
        # of 16,384 ranks asks every second, for each of them).
        least = max(self.run.floor_seconds, peer_limit)
        if least > 0 and now - last <= self.settings.gone_factor * least:
            return False
        limit = self.expected_limit(st, peer_limit)
        if limit is None:
            return False
        return now - last > self.settings.gone_factor * limit

    def _finding(self, hung: dict[int, RankHang], gone: dict[int, RankHang],
                 now: float, unheard: list[int] | None = None) -> Finding:
        by_frame = Counter(st.stuck_in for st in hung.values())
        common = by_frame.most_common(1)[0][0] if hung else ""
        odd = {r: st for r, st in hung.items() if st.stuck_in != common}
        waiting = sorted(r for r, st in hung.items() if r not in odd)
        parts = []
        for r, st in sorted(gone.items()):
            silent = now - (st.last_time or now)
            parts.append(f"rank {r} sent nothing for {silent:.0f} s and no hang report: its "
                         "process is gone (killed or crashed)")
        if len(by_frame) == 1 and hung:
            st = next(iter(hung.values()))
            who = _ranks(sorted(hung))
            verb = "wait" if gone else "stuck"
            parts.append(f"{who} {verb} {max(s.stuck_seconds for s in hung.values()):.0f} s in "
                         f"{_where(st, hung.values())}" + (f", called from {st.called_from}"
                                                           if st.called_from else ""))
        else:
            for r, st in sorted(odd.items()):
                parts.append(f"rank {r} stuck {st.stuck_seconds:.0f} s in {_where(st)}"
                             + (f", called from {st.called_from}" if st.called_from else ""))
            if waiting:
                parts.append(f"{_ranks(waiting)} wait in "
                             f"{_where(hung[waiting[0]], [hung[r] for r in waiting])}")
        if unheard:
            parts.append(f"{_ranks(unheard)} not heard from: their node's sidecar is away, "
                         "so whether they run is not known")
        steps = sorted({st.hang_step for st in hung.values()} | {st.last_step
                                                                 for st in gone.values()})
        message = "; ".join(parts) + f" (last completed step {_ranks(steps, word='')})"
        ranks_table = {str(r): _row(st, "hung" if r in hung else "gone" if r in gone
                                    else "running", now)
                       for r, st in sorted(self.ranks.items())}
        named = gone or odd or hung  # the rank the page is about: gone, else the odd one out
        first = min(named)
        head = named[first]
        return Finding(
            type=self.type, severity=self.severity, run_id=head.run_id,
            step=max(st.last_step for st in self.ranks.values()), rank=first,
            value=float(len(hung) + len(gone)), threshold=None, message=message,
            evidence={"hung_ranks": sorted(hung), "gone_ranks": sorted(gone),
                      "unreachable_ranks": list(unheard or ()),
                      "stuck_in": head.stuck_in, "called_from": head.called_from,
                      "ranks": ranks_table},
            suggestions=GONE + HUNG if gone else HUNG, time=now,
        )

    def snapshot_extra(self) -> dict[str, Any]:
        return {"floor_seconds": self.run.floor_seconds, "factor": self.run.factor,
                "first_report": self.run.first_report, "last_emit": self.run.last_emit,
                "picture": list(self.run.picture)}

    def restore_extra(self, data: dict[str, Any]) -> None:
        self.run = RunHang(float(data.get("floor_seconds") or 0.0),
                           float(data.get("factor") or 0.0), data.get("first_report"),
                           data.get("last_emit"), list(data.get("picture") or []))


def stuck_frame(frames: list[dict[str, Any]]) -> tuple[str, str]:
    """The innermost frame as "file:function", and the innermost of the script's own frames
    below it as "file:line" ("" when there is none)::

        >>> stuck_frame([{"file": "train.py", "line": 88, "function": "main", "user": True},
        ...              {"file": "torch/nn/modules/module.py", "line": 1, "function": "_call"}])
        ('torch/nn/modules/module.py:_call', 'train.py:88')
    """
    if not frames:
        return "an unknown frame (no Python stack)", ""
    inner = frames[-1]
    below = [f for f in frames[:-1] if f.get("user")]
    caller = f"{below[-1]['file']}:{below[-1]['line']}" if below else ""
    return f"{inner['file']}:{inner['function']}", caller


def _where(st: RankHang, alike: Any = ()) -> str:
    """The stuck frame as the page says it: "file:function at line N", the line left out
    when unknown or when the ranks stuck in that function are at different lines."""
    lines = {other.stuck_line for other in alike} | {st.stuck_line}
    if len(lines) > 1 or not st.stuck_line:
        return st.stuck_in
    return f"{st.stuck_in} at line {st.stuck_line}"


def _row(st: RankHang, state: str, now: float) -> dict[str, Any]:
    row: dict[str, Any] = {"state": state, "last_step": st.last_step}
    if state == "hung":
        row.update(stuck_seconds=st.stuck_seconds, phase=st.phase, stuck_in=st.stuck_in,
                   stuck_line=st.stuck_line, called_from=st.called_from)
        if st.nccl_trace:
            row["nccl_trace"] = st.nccl_trace
    elif state == "gone" and st.last_time is not None:
        row["silent_seconds"] = round(now - st.last_time, 1)
    return row


def _ranks(ranks: list[int], word: str = "rank") -> str:
    """``[0, 1, 3]`` -> "ranks 0-1,3"; ``[5]`` -> "rank 5" (``word`` "" : bare numbers)."""
    spans: list[str] = []
    start = prev = None
    for r in ranks:
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = r
    if start is not None:
        spans.append(f"{start}" if start == prev else f"{start}-{prev}")
    text = ",".join(spans)
    if not word:
        return text
    return f"{word}s {text}" if len(ranks) > 1 else f"{word} {text}"
