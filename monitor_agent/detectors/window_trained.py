"""``window_trained``: after a rollback, the resumed run trained data its plan said to skip.

A rollback plan (alerting/rollback.py) names data positions: the stream resumes after
``resume_position`` and never trains a position inside its ``skip`` windows (which hold
every earlier rollback's windows too). Whether the loop did that is not the sidecar's to
assume: a loop that fast-forwards by steps, a framework that replays its epoch from the
start, a launcher that relaunched without the skipping data wrapper, all train the window
again, and the run then goes on from the very data the rollback was for, while its verdict
would say healthy. So each step's data positions are checked against the newest applied
plan (``DetectorContext.skip_plan``, set by the engine from the run's lifecycle).

What a step trained: its ``data_position`` (docs/format.md) is the position of the last
item it consumed, and it consumed its own count of them, the positions one step takes (the
median over the rank's last 16 consecutive steps: a jump over a skipped window is one odd
delta among them). So a step at position p trained ``p - n + 1 .. p``; a resumed run that
jumped over the window shows a large delta but trained only its last n.

An error, once per plan and rank at the first step that trains inside a window (naming the
positions and the window), and once more when that stretch ends, with every position it
trained there: the page says which batches were trained again. It makes the run's verdict
unhealthy (runs/verdict.py): a rollback whose window was not honoured has not removed
the data it was for. A plan counted in steps (the run reports no data position) cannot be
checked and is not.

A rollback to step 300 (data position 300) skipping 301-330; the loop resumed with its old
recipe, at batch 301::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> def step(s, pos):
    ...     return parse_record({"kind": "step", "run_id": "r", "step": s, "time": float(s),
    ...                          "loss": 2.0, "data_position": pos})
    >>> found = [f for s in range(295, 301) for f in suite.update(step(s, s))]
    >>> suite.ctx.skip_plan = SkipPlan(1, ((301, 330),), 300, 301, "positions")
    >>> found = [f for s in range(301, 336) for f in suite.update(step(s, s))
    ...          if f.type == "window_trained"]
    >>> [(f.step, f.severity.label) for f in found]
    [(301, 'error'), (331, 'error')]
    >>> print(found[0].message)
    step 301 trained batch 301, inside rollback 1's skip window 301-330 (the plan resumed
    the data after batch 300): the data the rollback was meant to skip is being trained again
    >>> print(found[1].message)
    steps 301-330 trained batches 301-330 of rollback 1's skip windows (301-330): the
    rollback did not keep the run off the data it was for
"""

from __future__ import annotations

from dataclasses import dataclass, field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.context import SkipPlan
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.records.types import Finding, Severity, StepRecord

__all__ = ["SkipPlan", "WindowTrainedDetector"]

WINDOW_TRAINED = (
    "Resume the data at the plan's position and skip its windows: in a plain loop, "
    "monitor_client.DataStream(loader) and data.seek(state['position'], skip=plan.skip); "
    "the HF and Lightning callbacks do it when relaunched by python -m "
    "monitor_client.relaunch.",
    "A fast-forward by steps (consumed + plan.skip_batches) lands in the wrong place after "
    "an earlier rollback: step and data position differ.",
    "The weights have now seen the data again: roll back by hand to the plan's checkpoint "
    "if the fault returns.",
)
_DELTAS = 16  # consecutive steps whose median is the positions one step consumes


@dataclass(slots=True)
class WindowState:
    position: int | None = None
    step: int = -1
    deltas: list[int] = field(default_factory=list)
    plan: int = 0          # the plan whose windows the stretch below is about
    told: int = 0          # the plan already paged about on this rank
    first_step: int | None = None  # the stretch of steps training inside a window
    last_step: int | None = None
    trained: list[list[int]] = field(default_factory=list)  # positions trained inside


class WindowTrainedDetector(DetectorBase[SharedSettings]):
    """Error when a resumed run trains a position its rollback plan skips."""

    type = "window_trained"
    severity = Severity.ERROR

    def new_rank(self) -> WindowState:
        return WindowState()

    def on_step(self, rec: StepRecord, st: WindowState) -> list[Finding]:
        pos = rec.data_position
        if pos is None:
            return []
        per_step = sorted(st.deltas)[len(st.deltas) // 2] if st.deltas else 1
        consecutive = st.step == rec.step - 1 and st.position is not None
        delta = pos - st.position if consecutive and st.position is not None else None
        if delta is not None and delta > 0:
            st.deltas = [*st.deltas[1 - _DELTAS:], delta]
        taken = min(delta, per_step) if delta is not None and delta > 0 else per_step
        st.position, st.step = pos, rec.step
        plan = self.ctx.skip_plan
        if plan is None or plan.unit != "positions" or rec.step < plan.start_step:
            return []
        hits = _inside((pos - taken + 1, pos), plan.skip)
        if not hits:
            return self._stretch_ended(rec, st, plan)
        if st.plan != plan.action_id:
            st.plan, st.first_step, st.trained = plan.action_id, None, []
        st.first_step = rec.step if st.first_step is None else st.first_step
        st.last_step = rec.step
        st.trained = _add(st.trained, hits)
        if st.told == plan.action_id:
            return []
        st.told = plan.action_id
        window = next(w for w in plan.skip if w[0] <= hits[0][0] <= w[1])
        after = f"batch {plan.resume_position}" if plan.resume_position is not None else "it"
        msg = (f"step {rec.step} trained {_batches(hits)}, inside rollback {plan.action_id}'s "
               f"skip window {window[0]}-{window[1]} (the plan resumed the data after {after}): "
               "the data the rollback was meant to skip is being trained again")
        return [self.finding(rec, msg, value=hits[0][0], threshold=window[0],
                             evidence={"action_id": plan.action_id,
                                       "positions": [list(h) for h in hits],
                                       "window": list(window),
                                       "resume_position": plan.resume_position,
                                       "skip": [list(w) for w in plan.skip]},
                             suggestions=WINDOW_TRAINED)]

    def _stretch_ended(self, rec: StepRecord, st: WindowState, plan: SkipPlan) -> list[Finding]:
        """The first step past a stretch that trained inside a window: say all of it."""
        if st.first_step is None or st.plan != plan.action_id:
            return []
        first, last, trained = st.first_step, st.last_step, st.trained
        st.first_step, st.last_step, st.trained = None, None, []
        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        windows = ", ".join(f"{a}-{b}" for a, b in plan.skip)
        msg = (f"{steps} trained {_batches(trained)} of rollback {plan.action_id}'s skip "
               f"windows ({windows}): the rollback did not keep the run off the data it "
               "was for")
        count = sum(b - a + 1 for a, b in trained)
        return [self.finding(rec, msg, value=count, threshold=0,
                             evidence={"action_id": plan.action_id, "positions": trained,
                                       "steps": [first, last],
                                       "skip": [list(w) for w in plan.skip]},
                             suggestions=WINDOW_TRAINED)]


def _inside(span: tuple[int, int], windows: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """The parts of ``span`` (inclusive) inside any window."""
    out = []
    for a, b in windows:
        lo, hi = max(a, span[0]), min(b, span[1])
        if lo <= hi:
            out.append([lo, hi])
    return out


def _add(ranges: list[list[int]], new: list[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for a, b in sorted([*ranges, *new]):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _batches(ranges: list[list[int]]) -> str:
    parts = [f"{a}-{b}" if a != b else str(a) for a, b in ranges]
    single = len(ranges) == 1 and ranges[0][0] == ranges[0][1]
    return ("batch " if single else "batches ") + ", ".join(parts)
