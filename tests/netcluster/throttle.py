"""A node's CPU cut by a cgroup quota so its work runs ``factor`` times slower, and, with a
job to watch, held there.

Open loop (no job): the quota becomes the CPU the node's processes used over a short
window, divided by ``factor``: bound by it, work that needed that CPU takes ``factor``
times as long. That holds on a quiet machine. On a shared one the node's share of the CPU
swings with everyone else's load, and so does what a window measures: on a 2-core machine
at load 17 an open-loop 1.1 ran the job 2-5 times slower (bench/netcluster_check.py).

Held (``job`` given): a controller thread compares, every ``interval`` seconds, the compute
of the node's ranks with the other ranks' in the same steps (the same work, the same
moment: the machine's load cancels out) and moves the quota until the ratio is
``factor``: multiplicatively, a bounded step at a time, only on steps run under the
quota it set. A rank's compute is its forward and backward up to the all-reduce
(``compute_seconds`` in elastic_train.py's log): no collective inside.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.netcluster.cgroups import NodeCgroup
    from tests.netcluster.elastic import ElasticJob

GAIN = 0.8          # how much of the measured error one update corrects (log scale)
MAX_STEP = 1.6      # the most one update multiplies or divides the quota by
MIN_STEPS = 4       # steps each side needs under the current quota before an update


@dataclass
class Throttle:
    """A node's throttle: what it started from and, when held, what it measures."""

    node: int
    factor: float
    used_cores: float          # what the node used over the window before
    quota_cores: float         # the quota now
    history: list[tuple[float, float, float]] = field(default_factory=list)
    # (time, quota cores, measured slowdown) per controller update

    @property
    def achieved(self) -> float | None:
        """The node's compute slowdown against its peers at the last measurement."""
        return self.history[-1][2] if self.history else None


def measure_usage(group: NodeCgroup, window: float) -> float:
    """CPUs the group's processes used over the next ``window`` seconds, uncapped."""
    group.set_quota(None)
    before, t0 = group.usage_seconds(), time.monotonic()
    time.sleep(window)
    return (group.usage_seconds() - before) / (time.monotonic() - t0)


class Controller(threading.Thread):
    """Holds ``throttle`` on ``group`` against ``job``'s ranks (see the module)."""

    def __init__(self, throttle: Throttle, group: NodeCgroup, job: ElasticJob,
                 interval: float = 2.0) -> None:
        super().__init__(name=f"netcluster-throttle-node{throttle.node}", daemon=True)
        self.throttle, self.group, self.job = throttle, group, job
        self.interval = interval
        self.stopped = threading.Event()
        self._since = self._newest_step()  # steps after this one ran under our quota

    def _newest_step(self) -> int:
        steps = [e["step"] for e in self.job.recent("step")]
        return max(steps, default=0)

    def slowdown(self) -> float | None:
        """Median compute time of the node's ranks over the others', on the steps since
        the last change; None until each side has ``MIN_STEPS`` of them."""
        mine, peers = [], []
        for e in self.job.recent("step"):
            if e["step"] > self._since + 1:  # one step of settling after a change
                (mine if e["node"] == self.throttle.node else peers).append(
                    e["compute_seconds"])
        if len(mine) < MIN_STEPS or len(peers) < MIN_STEPS:
            return None
        return statistics.median(mine) / statistics.median(peers)

    def run(self) -> None:
        t = self.throttle
        while not self.stopped.wait(self.interval):
            ratio = self.slowdown()
            if ratio is None or ratio <= 0:
                continue
            # slowdown ~ 1 / cores while the quota binds: too slow, more CPU; too fast, less
            change = (ratio / t.factor) ** GAIN
            change = min(MAX_STEP, max(1 / MAX_STEP, change))
            cores = min(float(os.cpu_count() or 1), t.quota_cores * change)
            if self.stopped.is_set():
                return
            self.group.set_quota(cores)
            quota, period = self.group.quota()
            t.quota_cores = quota / period
            t.history.append((time.time(), t.quota_cores, ratio))
            self._since = self._newest_step()

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)
