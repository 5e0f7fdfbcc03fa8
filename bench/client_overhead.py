"""What monitoring costs a training step: the figures issue 5 asks for.

A GPT-2-small-shaped model (124M parameters, transformers' GPT2 built from its config, no
download) trains with AdamW and clip_grad_norm_(1.0). We time:

  bare step            forward + backward + clip_grad_norm_ + AdamW + zero_grad
  foreach floor        one torch._foreach_norm over all gradients (memory-bandwidth floor)
  global-only stats    the client's pre-step hook on a normal step (norm + clip)
  per-layer stats      the client's hooks on a monitored step (grad moments, param and
                       update norms, parameter snapshot), excluding the optimizer itself
  naive per-layer      a Python loop with .item() per parameter and statistic
  monitored steps      the whole step with the client: global-only, per-layer every step,
                       and the default configuration (per-layer every N steps)
  log_step             enqueue latency p50/p99 (the training thread's cost per call)
  distributions        gradient + weight quantiles/histograms on a hist step (hooks with
                       hist_every=1 minus without), and amortised over DEFAULT_HIST_EVERY
  activations          activation statistics on a monitored step (forward hooks on the 12
                       GELU modules), the unmonitored step's post-hook, amortised over the
                       default interval; whole steps bare / monitored / unmonitored

  watchdog             (issue 23) whole steps in the default configuration with the hang
                       watchdog on (its thread, the phase hooks, the per-step beat) and
                       off, interleaved round by round; and the size of a hang record for a
                       process with 60 threads (``--only-watchdog``)

  tiny steps           (issue 45) a 1 ms and a 10 ms CPU step (small MLPs): the whole
                       step's cost of each configuration against the bare loop, each knob
                       on/off, and the training thread's share timed per call
                       (``--only-tiny``; tiny_steps.py says how)

  origin               (issue 17) whole steps in the default configuration with and
                       without the forward finite sums (one per leaf module), interleaved;
                       the per-parameter norms' share of the sender thread's one host copy;
                       and the bytes a step costs on the wire when the gate sends them

and count host transfers made on the training thread by the hooks and log_step.

    python -m bench.client_overhead                # CPU, about 3-4 minutes on 2 cores
    python -m bench.client_overhead --device cuda  # the same on a GPU
    python -m bench.client_overhead --only-distributions   # bare step + distributions
    python -m bench.client_overhead --only-activations     # bare step + activation hooks
    python -m bench.client_overhead --only-origin          # bare step + origin figures
    python -m bench.client_overhead --only-timings         # the all-reduce-wait hooks
    python -m bench.client_overhead --only-watchdog        # watchdog on/off + record size
    python -m bench.client_overhead --only-tiny            # 1 ms and 10 ms steps, per knob
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable

import torch

from bench import tiny_steps
from bench.harness import (
    bare_step,
    build,
    forward_backward,
    interleaved,
    model_arguments,
    monitored_step,
    start_sink,
    sync,
    timed,
)
from monitor_client import Monitor, MonitorSettings, WatchSettings
from monitor_client._stats import GradStats
from monitor_client.settings import DEFAULT_HIST_EVERY, DEFAULT_LAYER_STATS_EVERY


def naive_stats(model, snapshot):
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        out[name] = (g.norm().item(), g.mean().item(), g.std().item(), g.abs().max().item(),
                     (g == 0).float().mean().item(), p.norm().item(),
                     (p.detach() - snapshot[name]).norm().item())
    return out


def hook_costs(model, opt, batch, device, reps):
    """Time the client's hooks alone, around a real optimizer step."""
    stats = GradStats(model, opt, grad_clip=1.0, layer_stats_every=1)
    glob = GradStats(model, opt, grad_clip=1.0, layer_stats_every=10**9)
    forward_backward(model, batch)
    grads = [p.grad for p in model.parameters()]
    floor = timed(lambda: torch.stack(torch._foreach_norm(grads)), device, reps * 3)
    clip = timed(lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9), device, reps)
    glob._steps = 1
    global_only = timed(lambda: (glob.before_step(), glob._reset()), device, reps * 3)

    def per_layer():
        stats._steps = 0
        stats.before_step()
        stats.after_step()  # without opt.step(): same work, update norm of zero
        stats.take().vector()

    per = timed(per_layer, device, reps)
    snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
    naive = timed(lambda: naive_stats(model, snapshot), device, max(2, reps // 2))
    opt.zero_grad(set_to_none=False)
    return {"foreach_norm_floor_s": floor, "clip_grad_norm_s": clip,
            "global_only_hook_s": global_only, "per_layer_hooks_s": per, "naive_s": naive}


def distribution_costs(model, opt, batch, device, reps):
    """The hooks of a hist step with and without the distributions, interleaved run by run
    (no layer statistics, no clipping, so the difference is the distributions alone)."""
    runs = {every: GradStats(model, opt, layer_stats_every=10**9, hist_every=every)
            for every in (1, 0)}
    forward_backward(model, batch)

    def hooks(stats):
        stats._steps = 1  # not a layer-statistics step; every step is one with hist_every=1
        stats.before_step()
        stats.after_step()
        stats.take().vector()  # includes the host copy of the (P, 8 + 16) rows

    sync(device)
    start = time.perf_counter()
    hooks(runs[1])  # first call: draws and caches the sample indices
    sync(device)
    first = time.perf_counter() - start
    times = {1: [], 0: []}
    for _ in range(reps * 4):
        for every, stats in runs.items():
            times[every].append(timed(lambda s=stats: hooks(s), device, 1))
    opt.zero_grad(set_to_none=False)
    with_d, without = statistics.median(times[1]), statistics.median(times[0])
    return {"hist_step_s": max(with_d - without, 0.0), "hist_first_call_s": first - without,
            "hist_every": DEFAULT_HIST_EVERY, "hist_params": len(runs[1].params)}


def monitored_steps(model, opt, batch, device, reps, url):
    """Whole steps, interleaved round by round so a noisy machine affects all alike."""
    mon = Monitor(url=url, run_id="bench-steps",
                  settings=MonitorSettings(install_hooks=False, linger=0.2))
    mon.watch(model, opt, grad_clip=1.0, settings=WatchSettings(layer_stats_every=1))
    stats = mon._stats  # toggled between configurations instead of building three models
    times = {"bare": [], "global_only": [], "per_layer": []}

    def monitored(every, step):
        stats.layer_stats_every, stats._steps = every, 0 if every == 1 else 1
        forward_backward(model, batch)
        opt.step()  # the hooks measure (and clip) here
        opt.zero_grad(set_to_none=False)
        mon.log_step(step, loss=1.0, tokens=batch.numel())

    for step in range(reps + 1):
        for name in times:
            stats.detach()
            if name != "bare":
                stats.attach()
            fn = (lambda: bare_step(model, opt, batch)) if name == "bare" else (
                lambda n=name, s=step: monitored(1 if n == "per_layer" else 10**9, s))
            t = timed(fn, device, 1)
            if step:  # round 0 warms the snapshot buffers up
                times[name].append(t)
    mon.close(timeout=30)
    return {name: statistics.median(ts) for name, ts in times.items()}


def transfer_count(model, opt, batch):
    """Host transfers on the training thread during the hooks and log_step of a step."""
    mon = Monitor(url="http://127.0.0.1:9", run_id="bench-sync",
                  settings=MonitorSettings(install_hooks=False))
    mon.watch(model, opt, grad_clip=1.0, settings=WatchSettings(layer_stats_every=1, pre_hook=False))
    forward_backward(model, batch)
    calls = []
    originals = {n: getattr(torch.Tensor, n) for n in ("item", "tolist", "__float__", "cpu")}

    def spy(name):
        return lambda self, *a, **k: (calls.append(name), originals[name](self, *a, **k))[1]

    for name in originals:
        setattr(torch.Tensor, name, spy(name))
    try:
        mon.before_optimizer_step()
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)
        opt.step()
        for name in originals:
            setattr(torch.Tensor, name, spy(name))
        mon.log_step(0, loss=torch.tensor(1.0, device=batch.device))
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)
    opt.zero_grad(set_to_none=False)
    mon.close(timeout=0.1)
    return len(calls)


def activation_costs(model, opt, batch, device, reps):
    """Activation hooks (default filter: the 12 GELU modules of the GPT-2 MLPs): the
    statistics alone on captured outputs, and whole steps (bare / monitored step with the
    hooks armed, host copy included / unmonitored step, hooks attached but not armed)
    interleaved round by round; plus the optimizer post-hook of an unmonitored step."""
    from monitor_client._activations import ActivationStats, measure, zero_clamping
    from monitor_client._stats import StatsPack

    outs = []
    probe = ActivationStats(model, opt)
    handles = [m.register_forward_hook(lambda m, a, o: outs.append((o.detach(), m)))
               for m in probe.modules]
    with torch.no_grad():
        model(batch)
    for h in handles:
        h.remove()
    stats_s = timed(lambda: [measure(o, zero_clamping(m)) for o, m in outs], device, reps * 4)
    idle = ActivationStats(model, opt, every=10**9)
    idle._steps = 1
    post_hook_s = timed(idle.after_step, device, 200)  # what an unmonitored step pays

    def step(acts):
        bare_step(model, opt, batch)
        if acts is not None:
            pack = StatsPack()
            acts.add_to(pack)
            pack.vector()

    times = {"bare": [], "monitored": [], "unmonitored": []}
    for rnd in range(2 * reps + 1):
        for name in times:
            acts = None
            if name != "bare":
                acts = ActivationStats(model, opt, every=1 if name == "monitored" else 10**9)
                acts._steps = 0 if name == "monitored" else 1
                acts.attach()
            t = timed(lambda a=acts: step(a), device, 1)
            if acts is not None:
                acts.detach()
            if rnd:  # round 0 warms up
                times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"act_modules": len(probe.names), "act_stats_s": stats_s,
            "act_post_hook_s": post_hook_s, "act_whole_steps_s": med,
            "activation_every": DEFAULT_LAYER_STATS_EVERY}


def report_activations(f: dict, n_params: int, device) -> None:
    bare, every, w = f["bare_step_s"], f["activation_every"], f["act_whole_steps_s"]
    stats, post = f["act_stats_s"], f["act_post_hook_s"]
    amortised = stats / every + post
    print(f"activations ({f['act_modules']} modules, {n_params / 1e6:.1f}M params on {device}): "
          f"statistics on a monitored step {stats * 1e3:.2f} ms = {stats / bare * 100:.2f}% of "
          f"the bare step ({bare * 1e3:.1f} ms); unmonitored step: post-hook "
          f"{post * 1e6:.1f} us, no forward hook; amortised at activation_every={every}: "
          f"+{amortised * 1e3:.3f} ms = {amortised / bare * 100:.3f}%")
    print(f"activations, whole steps (interleaved medians): bare {w['bare'] * 1e3:.1f} ms, "
          f"monitored {w['monitored'] * 1e3:.1f} ms ({(w['monitored'] / w['bare'] - 1) * 100:+.1f}%),"
          f" unmonitored {w['unmonitored'] * 1e3:.1f} ms "
          f"({(w['unmonitored'] / w['bare'] - 1) * 100:+.1f}%, noise)")


def enqueue_latency(url, device, n=2000):
    """log_step's own time on the training thread, with a watched small model stepping
    back to back (the sender thread and the sink share the GIL with it)."""
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    mon = Monitor(url=url, run_id="bench-enqueue",
                  settings=MonitorSettings(install_hooks=False, max_queue=100_000))
    mon.watch(model, opt, settings=WatchSettings(layer_stats_every=10**9))
    x = torch.randn(4, 64, device=device)
    lat = []
    for i in range(n):
        model(x).sum().backward()
        opt.step()
        start = time.perf_counter()
        mon.log_step(i, loss=0.5, tokens=256)
        lat.append(time.perf_counter() - start)
    mon.close(timeout=30)
    lat.sort()
    return lat[len(lat) // 2], lat[int(len(lat) * 0.99)]


def origin_costs(model, opt, batch, device, reps, url) -> dict:
    """Default configuration, finite sums on vs off, interleaved round by round; the
    per-parameter norms in the host copy; their bytes on the wire when sent."""
    import gzip

    from monitor_client._stats import StatsPack

    mon = Monitor(url=url, run_id="bench-origin",
                  settings=MonitorSettings(install_hooks=False, linger=0.2))
    mon.watch(model, opt, grad_clip=1.0)  # defaults: layer stats every 25, finite sums on
    flags, stats = mon._finite, mon._stats
    monitored = monitored_step(mon, model, opt, batch)

    def configured(with_stats: bool, with_finite: bool) -> Callable[[], Callable[[], None]]:
        def arm() -> Callable[[], None]:
            stats.detach()
            flags.detach()
            if with_stats:
                stats.attach()
            if with_finite:
                flags.attach()
            return monitored if with_stats else lambda: bare_step(model, opt, batch)
        return arm

    times = interleaved({"bare": configured(False, False),
                         "default_no_finite": configured(True, False),
                         "default": configured(True, True)}, reps * 5, device)
    fwd = forward_finite_costs(model, batch, device, reps, flags)
    mon.flush(30)
    mon.close(timeout=30)
    # The sender thread's one host copy, with and without the per-parameter norms.
    forward_backward(model, batch)
    grads = [p.grad for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    norms = torch.stack(torch._foreach_norm(grads))

    def copy(with_norms):
        pack = StatsPack()
        pack.add("grad_norm", torch.linalg.vector_norm(norms))
        pack.add("loss", norms[0])
        if with_norms:
            pack.add("param_grad_norm", norms, layers=names)
        return pack.decode(pack.vector().tolist())

    copy_without = timed(lambda: copy(False), device, reps * 20)
    copy_with = timed(lambda: copy(True), device, reps * 20)
    from monitor_agent.records import wire

    decoded = copy(True)["grad_norms"]
    body = wire.dumps({"grad_norms": decoded})
    return {**fwd, "origin_step_s": {k: statistics.median(v) for k, v in times.items()},
            "origin_rounds": len(times["bare"]), "finite_modules": len(flags.names),
            "copy_without_norms_s": copy_without, "copy_with_norms_s": copy_with,
            "grad_norms_params": len(decoded), "grad_norms_bytes": len(body),
            "grad_norms_gzip_bytes": len(gzip.compress(body))}


def watchdog_costs(model, opt, batch, device, reps, url) -> dict:
    """Default configuration, watchdog on vs off, interleaved round by round (``reps``
    steps a round, ``reps * 4`` rounds); the paired per-round ratio's spread is the noise
    the cost is judged against. Then a hang record of a process with 60 more threads."""
    from monitor_client._watchdog import HANG_STACK_BYTES, Watchdog

    mon = Monitor(url=url, run_id="bench-watchdog",
                  settings=MonitorSettings(install_hooks=False, linger=0.2, watchdog=False))
    mon.watch(model, opt, grad_clip=1.0)
    monitored = monitored_step(mon, model, opt, batch)

    def arm(on: bool) -> None:
        if mon._watchdog is not None:
            mon._watchdog.stop()
            mon._phase.detach()
            mon._watchdog = None
        if on:  # as Monitor._start builds it: a fresh thread, started by the next beat
            mon._watchdog = Watchdog(60.0, mon._send_hang, {"run_id": mon.run_id, "rank": 0},
                                     mon._phase, 0)
            mon._phase.attach([opt])

    def armed(on: bool) -> Callable[[], Callable[[], None]]:
        def setup() -> Callable[[], None]:
            arm(on)
            return monitored
        return setup

    times = interleaved({"off": armed(False), "on": armed(True)}, reps * 4, device,
                        alternate=True, reps=reps)
    arm(False)
    mon.flush(30)
    mon.close(timeout=30)
    ratios = sorted(on / off for on, off in zip(times["on"], times["off"], strict=True))
    q = statistics.quantiles(ratios, n=4)
    # A process with 60 more threads, each 30 frames deep, as loader workers' feeders are.
    stop, ready = threading.Event(), threading.Barrier(61)

    def deep(depth: int) -> None:
        if depth:
            deep(depth - 1)
            return
        ready.wait()
        stop.wait()

    pool = [threading.Thread(target=deep, args=(30,), daemon=True) for _ in range(60)]
    for t in pool:
        t.start()
    ready.wait()
    dog = Watchdog(60.0, lambda r: None, {"run_id": "bench-watchdog", "rank": 0},
                   threaded=False)
    dog.beat(1)
    made: list[dict] = []
    reader = threading.Thread(target=lambda: made.append(dog.record(70.0, 60.0, 0.0)))
    t0 = time.perf_counter()
    reader.start()
    reader.join()
    capture_s = time.perf_counter() - t0
    stop.set()
    record = made[0]
    # What the watchdog adds to a step, timed directly: on the training thread the beat
    # and the phase's calls (two optimizer hooks, log_step's; forward and backward are read
    # from the stack at a hang); on its own thread one wake-up (at most one a second).
    probe = Watchdog(60.0, lambda r: None, {"run_id": "bench-watchdog", "rank": 0},
                     threaded=False)
    n = 200_000
    t0 = time.perf_counter()
    for i in range(n):
        probe.phase.enter("optimizer")
        probe.phase.enter("data")
        probe.phase.enter("data")
        probe.beat(i)
    per_step_s = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n // 10):
        probe.check(time.monotonic())
    per_wake_s = (time.perf_counter() - t0) / (n // 10)
    bare = statistics.median(times["off"])
    return {"watchdog_training_thread_s": per_step_s, "watchdog_wake_s": per_wake_s,
            "watchdog_direct_ratio": (per_step_s + per_wake_s * max(bare, 1.0)) / bare,
            "watchdog_step_s": {k: statistics.median(v) for k, v in times.items()},
            "watchdog_rounds": len(times["on"]), "watchdog_ratio_median": statistics.median(
                ratios), "watchdog_ratio_q1": q[0], "watchdog_ratio_q3": q[2],
            "hang_threads": len(record["threads"]), "hang_threads_omitted":
                record["threads_omitted"], "hang_stack_bytes": len(json.dumps(record["threads"])),
            "hang_record_bytes": len(json.dumps(record)), "hang_stack_cap": HANG_STACK_BYTES,
            "hang_capture_s": capture_s}


def report_watchdog(f: dict) -> None:
    s = f["watchdog_step_s"]
    print(f"watchdog (issue 23), default config, {f['watchdog_rounds']} interleaved rounds:")
    print(f"  step off {s['off']:.4f} s   on {s['on']:.4f} s   on/off per round: median "
          f"{f['watchdog_ratio_median']:.4f} (quartiles {f['watchdog_ratio_q1']:.4f} .. "
          f"{f['watchdog_ratio_q3']:.4f}) -> cost {100 * (f['watchdog_ratio_median'] - 1):+.2f}%")
    print(f"  timed directly: {1e6 * f['watchdog_training_thread_s']:.2f} us per step on the "
          f"training thread (beat + 3 phase calls), {1e6 * f['watchdog_wake_s']:.2f} us per "
          f"wake-up (1/s) -> {100 * f['watchdog_direct_ratio']:.5f}% of the step")
    print(f"  hang record, 60 extra threads 30 frames deep: {f['hang_threads']} threads kept, "
          f"{f['hang_threads_omitted']} omitted, stacks {f['hang_stack_bytes']} B (cap "
          f"{f['hang_stack_cap']} B), record {f['hang_record_bytes']} B, made in "
          f"{1e3 * f['hang_capture_s']:.1f} ms")


@torch.no_grad()
def forward_finite_costs(model, batch, device, reps, flags) -> dict:
    """Forward passes with and without the finite hooks, interleaved; and the sums alone
    (the kernels, replayed on the outputs the hooks saw, without Python hook dispatch)."""
    times = {"forward": [], "forward_finite": []}
    for rnd in range(reps * 10 + 1):
        for name in times:
            flags.detach()
            if name == "forward_finite":
                flags.attach()
            t = timed(lambda: model(batch, labels=batch), device, 1)
            flags._sums, flags._fired = [], []
            if rnd:
                times[name].append(t)
    flags.detach()
    outs = []
    handles = [m.register_forward_hook(lambda m, a, o: outs.append(
        (o[0] if isinstance(o, tuple) else o).detach())) for m in flags.modules]
    model(batch, labels=batch)
    for h in handles:
        h.remove()
    sums = timed(lambda: [o.sum(dtype=torch.float32) for o in outs], device, reps * 10)
    # The hooks' own time, measured inside them (on CPU the sum runs synchronously).
    spent = [0.0]

    def clocked(hook):
        def run(*args):
            start = time.perf_counter()
            hook(*args)
            spent[0] += time.perf_counter() - start
        return run

    handles = [m.register_forward_hook(clocked(flags._hook(i)))
               for i, m in enumerate(flags.modules)]
    for _ in range(reps * 3):
        model(batch, labels=batch)
    for h in handles:
        h.remove()
    flags._sums, flags._fired = [], []
    flags.attach()
    return {"finite_hooks_inside_s": spent[0] / (reps * 3),"forward_s": statistics.median(times["forward"]),
            "forward_finite_s": statistics.median(times["forward_finite"]),
            "forward_rounds": len(times["forward"]), "finite_sums_only_s": sums,
            "finite_elements": sum(o.numel() for o in outs)}


def report_origin(f: dict) -> None:
    s, bare = f["origin_step_s"], f["origin_step_s"]["bare"]
    off, on = s["default_no_finite"], s["default"]
    print(f"origin (issue 17), {f['origin_rounds']} interleaved rounds, medians: bare "
          f"{bare * 1e3:.1f} ms; default config without finite sums {off * 1e3:.1f} ms "
          f"({(off / bare - 1) * 100:+.2f}%); default config {on * 1e3:.1f} ms "
          f"({(on / bare - 1) * 100:+.2f}%): the {f['finite_modules']} forward finite sums "
          f"{(on / off - 1) * 100:+.2f}%")
    fwd, fin = f["forward_s"], f["forward_finite_s"]
    print(f"forward only, {f['forward_rounds']} interleaved rounds, medians: {fwd * 1e3:.1f} ms "
          f"bare, {fin * 1e3:.1f} ms with the finite hooks ({(fin / fwd - 1) * 100:+.2f}%); "
          f"the {f['finite_modules']} sums alone ({f['finite_elements'] / 1e6:.1f}M elements) "
          f"{f['finite_sums_only_s'] * 1e3:.2f} ms = {f['finite_sums_only_s'] / bare * 100:.2f}% "
          f"of the bare step; measured inside the hooks (dispatch + sum) "
          f"{f['finite_hooks_inside_s'] * 1e3:.2f} ms = "
          f"{f['finite_hooks_inside_s'] / bare * 100:.2f}% of the bare step")
    print(f"per-parameter grad norms ({f['grad_norms_params']} params): in the sender's host "
          f"copy {f['copy_with_norms_s'] * 1e6:.0f} us vs {f['copy_without_norms_s'] * 1e6:.0f} "
          f"us without (off the training thread; on it: one list append); on the wire "
          f"{f['grad_norms_bytes']} B JSON ({f['grad_norms_gzip_bytes']} B gzip) on a step the "
          f"gate sends them (non-finite or > 2x the median global norm), 0 B otherwise")


def timings_costs(model, opt, batch, device, reps, url) -> dict:
    """A distributed run's default configuration, with the step-timing hooks attached and
    detached in turn, interleaved round by round (the same Monitor: only the hooks differ).
    The hooks' own cost is timed alone too: a whole-step difference under 1% is inside a
    shared machine's noise, while the hooks' calls can be counted and clocked exactly."""
    mon = Monitor(url=url, run_id="bench-timings",
                  settings=MonitorSettings(install_hooks=False, linger=0.2, world_size=2))
    mon.watch(model, opt, grad_clip=1.0)
    timings, stats = mon._timings, mon._stats
    monitored = monitored_step(mon, model, opt, batch)

    def hooked(with_timings: bool) -> Callable[[], Callable[[], None]]:
        def arm() -> Callable[[], None]:
            timings.detach()
            stats.detach()
            if with_timings:
                timings.attach()  # first, as watch() does: its pre-hook runs first
            stats.attach()
            return monitored
        return arm

    times = interleaved({"without": hooked(False), "with": hooked(True)}, reps * 5, device)
    mon.flush(30)
    mon.close(timeout=30)
    params = timings.params
    calls = 2000
    start = time.perf_counter()
    for _ in range(calls):
        for i, p in enumerate(params):  # as attach() registers it: index, parameter
            timings._gradient_done(i, p)
        timings._optimizer_step()
        timings.take()
    per_step = (time.perf_counter() - start) / calls
    return {"timings_rounds": reps * 5, "timings_params": len(params),
            "timings_without_s": statistics.median(times["without"]),
            "timings_with_s": statistics.median(times["with"]),
            "timings_pairs": [b / a for a, b in zip(times["without"], times["with"],
                                                     strict=True)],
            "timings_hooks_s": per_step}


def report_timings(f: dict) -> None:
    a, b = f["timings_without_s"], f["timings_with_s"]
    pairs = sorted(f["timings_pairs"])
    print(f"timings (issue 23), {f['timings_rounds']} interleaved rounds, medians: without "
          f"the wait hooks {a * 1e3:.1f} ms, with {b * 1e3:.1f} ms (ratio {b / a:.4f}; "
          f"paired ratios p25 {pairs[len(pairs) // 4]:.4f} p50 {pairs[len(pairs) // 2]:.4f} "
          f"p75 {pairs[3 * len(pairs) // 4]:.4f})")
    hooks = f["timings_hooks_s"]
    print(f"  the hooks alone: {hooks * 1e6:.1f} us per step ({f['timings_params']} gradient "
          f"hooks + the optimizer pre-hook + take), {hooks / a:.5%} of the step")


def main() -> None:
    p = argparse.ArgumentParser(description="client overhead on a 124M GPT-2-shaped model")
    model_arguments(p)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", action="store_true", help="also print the figures as JSON")
    p.add_argument("--only-activations", action="store_true",
                   help="measure only the bare step and the activation statistics")
    p.add_argument("--only-distributions", action="store_true",
                   help="measure only the bare step and the distribution statistics")
    p.add_argument("--only-watchdog", action="store_true",
                   help="measure only the watchdog on/off steps and a hang record's size")
    p.add_argument("--only-origin", action="store_true",
                   help="measure only the bare step and the origin figures (issue 17)")
    p.add_argument("--only-timings", action="store_true",
                   help="measure only the all-reduce-wait hooks (issue 23)")
    p.add_argument("--only-tiny", action="store_true",
                   help="measure only the 1 ms and 10 ms CPU steps, knob by knob (issue 45)")
    p.add_argument("--tiny-rounds", type=int, default=8, help="interleaved rounds (tiny)")
    p.add_argument("--tiny-block", type=float, default=1.0,
                   help="seconds each arm runs per round (tiny)")
    p.add_argument("--tiny-sizes", nargs="+", default=list(tiny_steps.SIZES),
                   choices=list(tiny_steps.SIZES))
    p.add_argument("--tiny-optional", action="store_true",
                   help="also the knobs the default leaves off (full finite, activations, "
                        "guard)")
    args = p.parse_args()
    device = torch.device(args.device)
    url = start_sink()
    if args.only_tiny:
        torch.set_num_threads(1)
        tiny_steps.report([tiny_steps.measure(size, url, args.tiny_rounds, args.tiny_block,
                                              args.tiny_optional)
                           for size in args.tiny_sizes])
        return
    model, opt, batch = build(args, device)
    n_params = sum(p.numel() for p in model.parameters())
    bare_step(model, opt, batch)  # warm-up: allocates optimizer state and grads
    if args.only_timings:
        report_timings(timings_costs(model, opt, batch, device, args.reps, url))
        return
    bare = timed(lambda: bare_step(model, opt, batch), device, args.reps)
    if args.only_watchdog:
        report_watchdog(watchdog_costs(model, opt, batch, device, args.reps, url))
        return
    origin = origin_costs(model, opt, batch, device, args.reps, url)
    if args.only_origin:
        report_origin(origin)
        return
    acts = activation_costs(model, opt, batch, device, args.reps)
    if args.only_activations:
        report_activations({"bare_step_s": bare, **acts}, n_params, device)
        return
    dist = distribution_costs(model, opt, batch, device, args.reps)
    if args.only_distributions:
        report_distributions({"bare_step_s": bare, **dist}, n_params, device)
        return
    hooks = hook_costs(model, opt, batch, device, args.reps)
    steps = monitored_steps(model, opt, batch, device, args.reps, url)
    p50, p99 = enqueue_latency(url, device)
    figures = {"device": str(device), "n_params": n_params, "batch": args.batch,
               "seq": args.seq, "threads": torch.get_num_threads(), "bare_step_s": bare,
               "layer_stats_every": DEFAULT_LAYER_STATS_EVERY,
               **hooks, **dist, **acts, **origin, "monitored_step_s": steps, "log_step_p50_us": p50 * 1e6,
               "log_step_p99_us": p99 * 1e6,
               "host_transfers_on_training_thread": transfer_count(model, opt, batch)}
    report(figures)
    report_distributions(figures, n_params, device)
    report_activations(figures, n_params, device)
    report_origin(figures)
    if args.json:
        print(json.dumps(figures, indent=2))


def report(f: dict) -> None:
    floor, bare, every = f["foreach_norm_floor_s"], f["bare_step_s"], f["layer_stats_every"]
    steps, clip = f["monitored_step_s"], f["clip_grad_norm_s"]
    per, glob = f["per_layer_hooks_s"], f["global_only_hook_s"]
    print(f"model {f['n_params'] / 1e6:.1f}M params on {f['device']} ({f['threads']} threads), "
          f"batch {f['batch']} x seq {f['seq']}")
    print(f"bare step (fwd+bwd+clip+AdamW)     {bare * 1e3:9.1f} ms")
    print(f"_foreach_norm floor (all grads)    {floor * 1e3:9.2f} ms  = 1.00x floor")
    print(f"clip_grad_norm_ (torch)            {clip * 1e3:9.2f} ms  = {clip / floor:.2f}x floor")
    print(f"global-only hook (norm + clip)     {glob * 1e3:9.2f} ms  = {glob / floor:.2f}x floor"
          " (replaces clip_grad_norm_)")
    print(f"per-layer hooks (7 stats/param)    {per * 1e3:9.2f} ms  = {per / floor:.2f}x floor;"
          f" amortised over {every} steps {per / every / floor:.2f}x floor")
    print(f"naive per-layer (.item() loop)     {f['naive_s'] * 1e3:9.2f} ms  = "
          f"{f['naive_s'] / floor:.2f}x floor")
    b = steps["bare"]
    print(f"whole steps, interleaved medians:  bare {b * 1e3:.1f} ms, global-only "
          f"{steps['global_only'] * 1e3:.1f} ms ({(steps['global_only'] / b - 1) * 100:+.1f}%), "
          f"per-layer {steps['per_layer'] * 1e3:.1f} ms ({(steps['per_layer'] / b - 1) * 100:+.1f}%)")
    default = max(glob - clip, 0) + per / every + f["log_step_p50_us"] * 1e-6
    print(f"default configuration (every {every}), from the parts: +{default * 1e3:.2f} ms "
          f"per step = {default / bare * 100:.2f}% of the bare step")
    print(f"log_step enqueue latency           p50 {f['log_step_p50_us']:.1f} us, "
          f"p99 {f['log_step_p99_us']:.1f} us")
    print(f"host transfers on the training thread per monitored step: "
          f"{f['host_transfers_on_training_thread']} (the one copy runs in the sender thread)")


def report_distributions(f: dict, n_params: int, device) -> None:
    bare, hist, every = f["bare_step_s"], f["hist_step_s"], f["hist_every"]
    print(f"distributions ({f['hist_params']} params x 1024-sample, {n_params / 1e6:.1f}M params "
          f"on {device}): bare step {bare * 1e3:.1f} ms; on a hist step +{hist * 1e3:.2f} ms = "
          f"{hist / bare * 100:.2f}% of the bare step; amortised at hist_every={every}: "
          f"+{hist / every * 1e3:.3f} ms = {hist / every / bare * 100:.3f}%; first call (draws "
          f"the sample indices) +{f['hist_first_call_s'] * 1e3:.1f} ms once")


if __name__ == "__main__":
    main()
