"""The hang watchdog: a thread that notices when no step completes, and says where it is.

A hung job (a rank blocked in a collective, a deadlocked loader, a CUDA sync that never
returns) sends no records, so the sidecar alone can only say "silent". The watchdog runs on
its own thread, wakes once a second (``WAKE_SECONDS``) and compares the time since the last
``log_step`` with the run's own step time: the limit is ``max(floor, FACTOR x the median of
the last step times)`` once ``WARMUP_STEPS`` step times are known, and ``2 x floor`` before
(the first steps include compilation and warm-up, whose times say nothing of later ones).

Why x5 (as NVIDIA's NVRx): step times of a healthy run vary by a few percent, and an
occasional longer step (a checkpoint, a logging step) is rarely more than a few medians;
five medians is far outside the step's own noise yet, for a sub-second step, far inside
any collective timeout (NCCL's default is 10 minutes). The median, not the mean, so one
long step does not raise the limit. The floor (``MonitorSettings.watchdog_floor``, default
60 s) covers the legitimately long pauses that are not steps (evals, checkpoints).

Past the limit it sends ONE ``hang`` record per stuck step (docs/format.md): the Python
stacks of the process's threads from ``sys._current_frames()`` (the training thread, the
one that calls ``log_step``, first; each stack its innermost ``MAX_FRAMES`` frames; the
whole at most ``HANG_STACK_BYTES`` of JSON, threads past it counted in
``threads_omitted``), the phase the training thread is in (``_phase.py``: from its stack,
else the last one the client saw begin), the
last completed step, how long it has been stuck, and the NCCL flight recorder's dump path
when ``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0. Frames keep the path below their
``site-packages`` or standard-library root (``torch/distributed/distributed_c10d.py``) and
mark the script's own ones ``user``: files outside those roots, and code with no file of
its own that runs in the script's namespace or one of no library's (``python -c``,
``exec()`` of a script's text, a notebook cell: ``<string>``, ``<stdin>``), so the page
can name the script's frame of a run started that way too. It works while the training thread is blocked in C
code: that thread has released the GIL, and this one holds it only to copy the frames
(microseconds per thread). It never raises. A step completing later resets it; the sidecar
sees the step and clears the hang.

A process whose only step was long ago (a floor of 0.05 s), stacks read while the training
thread sleeps in ``blocked()``; ``check`` is what the thread (not started here) calls
each second::

    >>> import threading, time
    >>> sent = []
    >>> dog = Watchdog(floor=0.05, send=sent.append, header={"run_id": "r", "rank": 0},
    ...                threaded=False)
    >>> dog.beat(7)
    >>> def blocked():
    ...     time.sleep(0.3)
    >>> worker = threading.Thread(target=blocked, name="trainer")
    >>> worker.start(); time.sleep(0.05)
    >>> dog.training_ident = worker.ident
    >>> dog.check(time.monotonic() + 1.0)
    True
    >>> worker.join()
    >>> rec = sent[0]
    >>> rec["kind"], rec["step"], rec["threads"][0]["name"], rec["threads"][0]["frames"][-1]["function"]
    ('hang', 7, 'trainer', 'blocked')
    >>> dog.check(time.monotonic() + 2.0)    # once per stuck step
    False
"""

from __future__ import annotations

import contextlib
import json
import os
import site
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from monitor_client._phase import PhaseTracker, on_stack

FACTOR = 5.0
WARMUP_STEPS = 5
WAKE_SECONDS = 1.0
MAX_FRAMES = 48             # innermost frames kept per thread
HANG_STACK_BYTES = 64 * 1024  # the threads' JSON in one hang record (sidecar: 128 KiB)
_STEP_TIMES = 64            # the median is over the last this many step times
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


class Watchdog:
    """See the module docstring. ``send`` takes the record (a dict); ``header`` holds the
    fields every record of the run carries (run_id, rank, attempt)."""

    def __init__(self, floor: float, send: Callable[[dict[str, Any]], None],
                 header: dict[str, Any], phase: PhaseTracker | None = None,
                 rank: int = 0, threaded: bool = True) -> None:
        self.floor = float(floor)
        self.send = send
        self.header = header
        self.phase = phase or PhaseTracker()
        self.rank = rank
        self.training_ident: int | None = None
        self.errors = 0
        self._times: deque[float] = deque(maxlen=_STEP_TIMES)
        self._last: float | None = None  # monotonic time of the last beat (None: unarmed)
        self._step = 0
        self._reported = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._threaded = threaded
        self._roots = _library_roots()
        self._where: dict[str, tuple[str, bool]] = {}

    # -- the training thread -------------------------------------------------------------
    def beat(self, step: int) -> None:
        """A step completed (``log_step``): a few attribute stores, nothing else."""
        now = time.monotonic()
        last = self._last
        if last is not None:
            self._times.append(now - last)
        self._last, self._step, self._reported = now, step, False
        if self.training_ident is None:
            self.training_ident = threading.get_ident()
            self._start()

    def touch(self) -> None:
        """Activity that is not a step (an eval logged): the clock restarts, no step time."""
        if self._last is not None:
            self._last, self._reported = time.monotonic(), False

    @property
    def stuck(self) -> bool:
        """It reported the current step stuck, and no step or activity followed since."""
        return self._reported

    def declaration(self) -> dict[str, Any]:
        """What the run record declares (docs/format.md, ``watchdog``)."""
        return {"floor_seconds": self.floor, "factor": FACTOR, "warmup_steps": WARMUP_STEPS}

    # -- the watchdog thread ----------------------------------------------------------------
    def limit(self) -> float:
        times = list(self._times)
        if len(times) < WARMUP_STEPS:
            return 2.0 * self.floor
        times.sort()
        return max(self.floor, FACTOR * times[len(times) // 2])

    def check(self, now: float) -> bool:
        """Send the hang record if the process is stuck past its limit; True if it did."""
        last = self._last
        if last is None or self._reported:
            return False
        stuck, limit = now - last, self.limit()
        if stuck <= limit:
            return False
        self._reported = True
        self.send(self.record(stuck, limit, now))
        return True

    def record(self, stuck: float, limit: float, now: float) -> dict[str, Any]:
        threads, omitted = self.stacks()
        training: list[dict[str, Any]] = next((t["frames"] for t in threads if t.get("training")), [])
        # A save on the stack, then a model in eval mode, then where the stack is.
        phase = "checkpoint" if _saving(threads) else self.phase.evaluating() or (
            on_stack(training) or self.phase.phase)
        rec: dict[str, Any] = {
            "kind": "hang", **self.header, "step": self._step, "time": time.time(),
            "stuck_seconds": round(stuck, 3), "limit_seconds": round(limit, 3),
            "phase": phase, "phase_seconds": round(self.phase.seconds(now), 3),
            "threads": threads, "threads_omitted": omitted,
        }
        trace = nccl_trace_path(self.rank)
        if trace is not None:
            rec["nccl_trace"] = trace
        return rec

    def stacks(self, budget: int = HANG_STACK_BYTES) -> tuple[list[dict[str, Any]], int]:
        """Every thread's stack but this one's, the training thread first, within ``budget``
        bytes of JSON; and how many threads did not fit."""
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        own = threading.get_ident()
        order = sorted((i for i in frames if i != own),
                       key=lambda i: (i != self.training_ident, names.get(i, "")))
        threads: list[dict[str, Any]] = []
        used, omitted = 2, 0
        for ident in order:
            entry: dict[str, Any] = {"name": names.get(ident, f"thread-{ident}")[:200],
                                     "frames": self._frames(frames[ident])}
            if ident == self.training_ident:
                entry["training"] = True
            size = len(json.dumps(entry)) + 1
            if used + size > budget:
                omitted += 1
                continue
            threads.append(entry)
            used += size
        del frames  # frame objects keep their locals alive
        return threads, omitted

    def _frames(self, frame: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while frame is not None and len(out) < MAX_FRAMES:
            code = frame.f_code
            where, user = self._place(code.co_filename)
            if not user and where.startswith("<"):
                user = self._users_namespace(frame)
            out.append({"file": where, "line": frame.f_lineno or 0,
                        "function": code.co_name[:200], "user": user})
            frame = frame.f_back
        out.reverse()  # outermost first, like a traceback
        return out

    def _users_namespace(self, frame: Any) -> bool:
        """Code without a file (``<string>``, ``<stdin>``): the script's own when it runs in
        the ``__main__`` namespace or in one no imported module owns (``exec`` into a dict
        of its own), not when a library made it (a dataclass's ``__init__`` runs in its
        module's namespace, whose file says whose it is; importlib's frozen frames)."""
        if frame.f_code.co_filename.startswith("<frozen "):
            return False
        name = frame.f_globals.get("__name__")
        if name is None or name == "__main__":
            return True
        module = sys.modules.get(name)
        if module is None or getattr(module, "__dict__", None) is not frame.f_globals:
            return True
        path = getattr(module, "__file__", None)
        return path is None or self._place(path)[1]

    def _place(self, filename: str) -> tuple[str, bool]:
        found = self._where.get(filename)
        if found is None:
            found = _place(filename, self._roots)
            if len(self._where) < 4096:
                self._where[filename] = found
        return found

    def _start(self) -> None:
        if self._thread is None and self._threaded:
            self._thread = threading.Thread(target=self._run, name="monitor_client-watchdog",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WAKE_SECONDS):
            try:
                self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - a watchdog bug must never reach training
                self.errors += 1

    def stop(self) -> None:
        self._stop.set()


def _saving(threads: list[dict[str, Any]]) -> bool:
    """Whether the training thread is inside a checkpoint save (``torch.save``,
    ``torch.distributed.checkpoint``): a long save is a phase, not a hang.

        >>> frames = [{"file": "train.py", "function": "main"},
        ...           {"file": "torch/serialization.py", "function": "save"}]
        >>> _saving([{"training": True, "frames": frames}])
        True
    """
    for thread in threads:
        if thread.get("training"):
            return any((f["file"] == "torch/serialization.py" and f["function"] in (
                "save", "_save")) or f["file"].startswith("torch/distributed/checkpoint/")
                for f in thread["frames"])
    return False


def nccl_trace_path(rank: int) -> str | None:
    """Where PyTorch's NCCL flight recorder dumps this rank's trace, when it is enabled."""
    try:
        size = int(os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0") or 0)
    except ValueError:
        return None
    if size <= 0:
        return None
    prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or "/tmp/nccl_trace_rank_"
    return f"{prefix}{rank}"


def _library_roots() -> list[str]:
    roots = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(os.path.abspath(paths[key]))
    with contextlib.suppress(AttributeError):  # an old virtualenv's site module lacks it
        roots.update(os.path.abspath(p) for p in site.getsitepackages())
    roots.add(os.path.dirname(_PACKAGE))  # monitor_client itself, wherever it lies
    return sorted(roots, key=len, reverse=True)


def _place(filename: str, roots: list[str]) -> tuple[str, bool]:
    """A frame's file as the page shows it, and whether it is the script's own code::

        >>> _place("/venv/lib/python3.11/site-packages/torch/nn/module.py",
        ...        ["/venv/lib/python3.11/site-packages"])
        ('torch/nn/module.py', False)
    """
    if filename.startswith("<"):
        return filename[:200], False
    path = os.path.abspath(filename)
    for root in roots:
        if path.startswith(root + os.sep):
            return path[len(root) + 1:][-200:], False
    cwd = os.getcwd()
    if path.startswith(cwd + os.sep):
        return path[len(cwd) + 1:][-200:], True
    return path[-200:], True
