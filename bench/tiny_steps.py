"""What the client costs a tiny CPU step, knob by knob: ``client_overhead.py --only-tiny``.

A step of a few milliseconds is common on CPU and in RL, and there the client's fixed cost
per step (Python work on the training thread, and the sender thread's work competing for
the GIL and the cores) is what shows, not its statistics' arithmetic. Two small MLPs (one
torch thread, AdamW, MSE), one whose bare step takes about 1 ms and one about 10 ms, are
trained as a plain loop and under the client in several configurations ("arms"):

  bare          the loop without the client
  log_step      a Monitor and ``log_step(loss=tensor, samples=...)`` only, no ``watch()``
  default       ``watch(model, opt)`` with the default settings
  -finite       the default without the forward finite check (``finite_flags=False``)
  -layers       the default without per-layer statistics (``layer_stats_every`` huge)
  -hist         the default without distributions (``hist_every=0``)
  -watchdog     the default without the hang watchdog and its phase hooks
  +clip         the default with ``grad_clip=1.0``, against ``bare+clip`` (the bare loop
                calling ``clip_grad_norm_(1.0)``), which it replaces
  +full_finite, +activations, +guard: the default with that optional knob on

Each arm has its own copy of the model and its own Monitor (sending to a loopback sink
that accepts everything), built once; every round runs each arm in turn for a block of
``--tiny-block`` seconds (at least two of the sender's 0.5 s lingers, so most of an arm's
sender work lands in its own block; the order reversed every other round) and keeps the
median step time of each block, so the machine's other load falls on every arm alike. An
arm's cost is the median over rounds of its block median minus the bare arm's of the same
round (``+clip`` against ``bare+clip``): the whole step, the sender thread's share
included. A knob's cost is the default's minus the arm without it (or the arm with it
minus the default). On a shared, loaded machine these differences carry its noise; the two
direct figures below do not depend on the load the same way:

* the training thread's own share, timed per call around the client's entry points
  (``log_step``, the optimizer hooks, the forward hooks) on every arm: each step's calls
  summed, the median over the cycles of each position in a ``CYCLE``-step cycle (so a
  preempted call does not count, and a layer-statistics step or a distributions step
  counts at its own price), averaged over the cycle: the amortised microseconds a step
  pays. A knob's training-thread price is the default arm's figure minus the figure of
  the arm without it (or the arm with it minus the default's);
* the sender thread's work per step record, on its own core when there is one: the
  median time to turn one of the default arm's pending records into its JSON line (the
  host copy, naming the numbers, the probes, the encoding).
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from monitor_client import GuardSettings, Monitor, MonitorSettings, WatchSettings

# Bare step about 1 ms and about 10 ms with one torch thread on a 2-core x86 machine.
SIZES = {"1ms": (64, 64), "10ms": (384, 256)}  # (width, batch)
KNOB_ARMS = ("-finite", "-layers", "-hist", "-watchdog")
OPTIONAL_ARMS = ("+full_finite", "+activations", "+guard")
# Steps in one cycle of the default's periodic work: layer statistics every 25 steps,
# distributions every 50 (WatchSettings); the training thread's figure is a cycle's mean.
CYCLE = 50


@dataclass
class Arm:
    name: str
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    mon: Monitor | None
    clip: bool = False           # the bare loop clips itself (the bare+clip arm)
    times: list[float] = field(default_factory=list)


def _mlp(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 1))


def _arm(name: str, width: int, url: str, spool: str) -> Arm:
    model = _mlp(width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if name in ("bare", "bare+clip"):
        return Arm(name, model, opt, None, clip=name == "bare+clip")
    watch = WatchSettings(
        finite_flags=False if name == "-finite" else "full" if name == "+full_finite"
        else "sampled",
        layer_stats_every=10**9 if name == "-layers" else WatchSettings().layer_stats_every,
        hist_every=0 if name == "-hist" else WatchSettings().hist_every,
        activations=name == "+activations",
        guard=GuardSettings() if name == "+guard" else None)
    mon = Monitor(url=url, run_id=f"tiny-{width}-{name}", settings=MonitorSettings(
        install_hooks=False, spool_dir=spool, watchdog=name != "-watchdog", watch=watch))
    if name != "log_step":
        mon.watch(model, opt, grad_clip=1.0 if name == "+clip" else None)
    return Arm(name, model, opt, mon)


def _steps(arm: Arm, x: torch.Tensor, y: torch.Tensor, n: int, first: int,
           seconds: float = 0.0) -> list[float]:
    """``n`` steps from step ``first``, or as many more as fill ``seconds``."""
    model, opt, mon = arm.model, arm.opt, arm.mon
    times: list[float] = []
    end = time.perf_counter() + seconds
    step = first
    while len(times) < n or time.perf_counter() < end:
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if arm.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if mon is not None:
            mon.log_step(step, loss=loss, samples=x.shape[0])
        times.append(time.perf_counter() - start)
        step += 1
    return times


@dataclass
class SizeResult:
    size: str
    width: int
    batch: int
    rounds: int
    bare_s: float
    cost_s: dict[str, float]      # arm -> median paired whole-step cost (s)
    parts_s: dict[str, float]     # training-thread part -> s per step (default arm)
    thread_s: dict[str, float]    # arm -> its training thread's s per step, amortised
    sender_s: float               # the sender thread's work per step record (default arm)


def measure(size: str, url: str, rounds: int, block: float, optional: bool,
            steps: int = 100) -> SizeResult:
    width, batch = SIZES[size]
    torch.manual_seed(1)
    x, y = torch.randn(batch, 32), torch.randn(batch, 1)
    names = ["bare", "log_step", "default", *KNOB_ARMS, "bare+clip", "+clip"]
    if optional:
        names += OPTIONAL_ARMS
    with tempfile.TemporaryDirectory(prefix="tiny-spool-") as spool:
        arms = [_arm(name, width, url, spool) for name in names]
        for arm in arms:  # warm-up: optimizer state, the first monitored step, pre-flight
            _steps(arm, x, y, 30, 1)
        step = {arm.name: 31 for arm in arms}
        for rnd in range(rounds):
            order = arms if rnd % 2 == 0 else arms[::-1]
            for arm in order:
                times = _steps(arm, x, y, 1, step[arm.name], block)
                step[arm.name] += len(times)
                arm.times.append(statistics.median(times))
        default = next(a for a in arms if a.name == "default")
        timed = [arm for arm in arms if arm.mon is not None]
        for arm in timed:  # each from a cycle's start
            step[arm.name] += (-step[arm.name]) % CYCLE
        got = _parts(timed, x, y, max(steps * 4 // CYCLE, 1), step)
        thread = {name: sum(parts.values()) for name, parts in got.items()}
        parts = got["default"]
        sender = _sender_work(default, x, y, steps * 4, step["default"])
        for arm in arms:
            if arm.mon is not None:
                arm.mon.close(timeout=5)
    by = {a.name: a.times for a in arms}
    cost = {}
    for arm in arms:
        if arm.name in ("bare", "bare+clip"):
            continue
        base = by["bare+clip"] if arm.name == "+clip" else by["bare"]
        cost[arm.name] = statistics.median(a - b for a, b in zip(arm.times, base, strict=True))
    return SizeResult(size, width, batch, rounds, statistics.median(by["bare"]), cost, parts,
                      thread, sender)


def _parts(arms: list[Arm], x: torch.Tensor, y: torch.Tensor, cycles: int,
           step: dict[str, int]) -> dict[str, dict[str, float]]:
    """Each arm's training-thread time by entry point, per step, amortised over the
    ``CYCLE``-step cycle (module docstring): every client callback of every arm wrapped in
    a clock, ``cycles`` cycles of each arm in turn (interleaved, as the rounds), then
    unwrapped. ``step``: each arm's next step, a cycle's first; advanced."""
    # arm -> label -> step index (from 0) -> seconds that step's calls took
    spent: dict[str, dict[str, dict[int, float]]] = {
        arm.name: defaultdict(lambda: defaultdict(float)) for arm in arms}
    at = dict.fromkeys(spent, 0)
    patched: list[tuple[object, str, object]] = []

    def clocked(arm: str, label: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[arm][label][at[arm]] += time.perf_counter() - start
                if label == "log_step":  # the step's last call
                    at[arm] += 1
        return run

    for arm in arms:
        assert arm.mon is not None
        for owner, attr, label in (*_hook_functions(arm.model, arm.opt),
                                   (arm.mon, "log_step", "log_step")):
            fn = getattr(owner, attr)
            patched.append((owner, attr, fn))
            setattr(owner, attr, clocked(arm.name, label, fn))
    for _ in range(cycles):
        for arm in arms:
            _steps(arm, x, y, CYCLE, step[arm.name])
            step[arm.name] += CYCLE
    for owner, attr, fn in reversed(patched):
        setattr(owner, attr, fn)
    # Per position in the cycle, the median over the cycles (a call the machine preempted
    # is an outlier, not the client's cost); the cycle's mean of those.
    return {arm: {label: statistics.fmean(
                      statistics.median(steps.get(c * CYCLE + pos, 0.0) for c in range(cycles))
                      for pos in range(CYCLE))
                  for label, steps in labels.items()}
            for arm, labels in spent.items()}


def _sender_work(arm: Arm, x: torch.Tensor, y: torch.Tensor, n: int, first: int) -> float:
    """The median time to turn one of the arm's step records into its line: what its
    sender thread does per step (the records are kept from it for the measurement)."""
    from monitor_client._encode import dumps_line

    mon = arm.mon
    assert mon is not None
    kept: list = []
    submit = mon._submit
    mon._submit = lambda item, urgent=False: kept.append(item)  # type: ignore[method-assign]
    try:
        _steps(arm, x, y, n, first)
    finally:
        mon._submit = submit  # type: ignore[method-assign]
    times = []
    for item in kept:
        start = time.perf_counter()
        dumps_line(item.materialize() if hasattr(item, "materialize") else item)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _hook_functions(model: torch.nn.Module, opt: torch.optim.Optimizer):
    """(dict, key, label) for every hook the client put on ``model``'s modules and on
    ``opt``: torch keeps them in ordered dicts, so each can be wrapped in place."""
    for module in model.modules():
        for kind in ("_forward_pre_hooks", "_forward_hooks"):
            hooks = getattr(module, kind)
            for key in list(hooks):
                yield _DictSlot(hooks, key), "fn", f"forward hooks ({kind.strip('_')})"
    for kind in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"):
        hooks = getattr(opt, kind)
        for key in list(hooks):
            yield _DictSlot(hooks, key), "fn", f"optimizer {kind.split('_')[3]}-hooks"


class _DictSlot:
    """One entry of a hook dict, wrapped as an object with an ``fn`` attribute."""

    def __init__(self, hooks: dict, key: object) -> None:
        self.hooks, self.key = hooks, key

    @property
    def fn(self):
        return self.hooks[self.key]

    @fn.setter
    def fn(self, value) -> None:
        self.hooks[self.key] = value


def report(results: list[SizeResult]) -> None:
    for r in results:
        bare, cost = r.bare_s, r.cost_s
        print(f"tiny step {r.size}: MLP width {r.width} batch {r.batch}, one torch thread, "
              f"{r.rounds} interleaved rounds: bare step {bare * 1e6:.0f} us")
        for name, value in cost.items():
            what = ("vs bare+clip, which it replaces" if name == "+clip" else "vs bare")
            print(f"  {name:13s} {value * 1e6:+8.1f} us a step = {value / bare * 100:+6.2f}% "
                  f"of the bare step ({what})")
        default = cost["default"]
        for name in (*KNOB_ARMS, *OPTIONAL_ARMS):
            if name in cost:
                knob = default - cost[name] if name.startswith("-") else cost[name] - default
                print(f"  knob {name[1:]:12s} {knob * 1e6:+8.1f} us a step = "
                      f"{knob / bare * 100:+6.2f}%")
        total = sum(r.parts_s.values())
        print(f"  training thread, timed per call, amortised over {CYCLE} steps (default): "
              f"{total * 1e6:.1f} us a step = {total / bare * 100:.2f}% of the bare step")
        for label, value in sorted(r.parts_s.items(), key=lambda kv: -kv[1]):
            print(f"    {label:36s} {value * 1e6:8.1f} us")
        thread = r.thread_s
        print("  training thread by arm, amortised: "
              + ", ".join(f"{name} {value * 1e6:.1f} us" for name, value in thread.items()))
        for name in (*KNOB_ARMS, *OPTIONAL_ARMS):
            if name in thread:
                knob = (thread["default"] - thread[name] if name.startswith("-")
                        else thread[name] - thread["default"])
                print(f"  knob {name[1:]:12s} training thread {knob * 1e6:+8.1f} us a step = "
                      f"{knob / bare * 100:+6.2f}%")
        print(f"  sender thread, per step record (default): {r.sender_s * 1e6:.1f} us = "
              f"{r.sender_s / bare * 100:.2f}% of the bare step, on another core when free")
