"""One command for a device (issue 34): what the client costs and measures on a CUDA GPU.

On a machine with a CUDA GPU it runs in a few minutes (well under 5 on one H100) and
prints, in one run and side by side with their targets:

  overhead   the client's cost on a GPT-2-small-sized model (124M parameters, bf16
             autocast, fused AdamW): whole steps monitored (the default configuration,
             grad_clip=1.0) vs plain (clip_grad_norm_ + step), interleaved round by round
             on the same device; target: monitored / plain <= 1.01
  syncs      host-device syncs per step on the training thread (torch.cuda's sync debug
             mode, every synchronizing call counted with where it came from, the client's
             own background threads left out): the default configuration, the step guard
             on a fused AdamW and on a foreach (non-fused) one, and the default
             configuration of a distributed run (CUDA-event timings on); target: 0, except
             the guard on a non-fused optimizer (1 a step: its documented price)
  memory     the step record's ``memory`` fields against torch.cuda.max_memory_allocated
             and friends; target: the peak equal
  split      the CUDA-event compute / all-reduce-wait split of a distributed run (one GPU
             standing in for a rank: its "all-reduce" is a side stream sleeping on the device,
             which the training stream waits for, as NCCL makes it wait) against a reference
             timed with torch.cuda.synchronize() at the same boundaries; target: both within
             5% of the reference
  nvml       the NVML fields the probe read (and which groups the driver does not give),
             with the GPU's identity and the time a reading takes
  nan        a NaN loss paged end to end: the client, a real sidecar on loopback (its own
             HTTP server, detectors, alert rules and outbox) and a webhook receiver; the
             time from ``log_step`` to the page arriving

Three more sections run only when named (``--sections ablation,profile,shapes``):

  ablation   whole steps with one part of the client off at a time (the finite check, or
             its full form; the GPU probe; the watchdog), interleaved with plain steps
  profile    torch.profiler over plain and monitored steps: the device time and kernel
             count of each, the kernels the client adds by name, and the host's time to
             issue a step from an idle queue (host- or GPU-bound)
  shapes     the client's training-shape tests (float64 and half models, GANs, fused and
             foreach optimizers, the step guard) in a pytest of their own, with the GPU as
             the default device (bench/on_cuda.py); needs the repository's tests/

On a machine without a CUDA GPU it runs too (CI runs it: tests/test_gpu_check.py): every
section that needs a GPU prints that it is skipped and why, and ``nan`` runs on the CPU with
a tiny model.

    python -m bench.gpu_check                     # all sections
    python -m bench.gpu_check --quick             # smaller model and fewer steps
    python -m bench.gpu_check --sections nan --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling
from torch import nn

from bench.harness import sync
from monitor_client import Monitor, MonitorSettings, WatchSettings

SECTIONS = ("overhead", "syncs", "memory", "split", "nvml", "nan")
EXTRA_SECTIONS = ("ablation", "profile", "host", "shapes")  # not run unless named
# The client's training-shape tests (dtypes, GANs, several models, sparse, LBFGS, hand-made
# loops), run with the GPU as the default device (bench/on_cuda.py): ``shapes``.
SHAPE_TESTS = ("tests/client/test_training_shapes.py", "tests/client/test_several_models.py",
               "tests/client/test_client_stats.py", "tests/client/test_finite_held.py",
               "tests/client/test_guard.py")
CLIENT_THREADS = ("monitor-client-sender", "monitor-client-gpu", "monitor_client-watchdog")
TARGETS = {"overhead": 1.01, "split": 0.05}


# -- a GPT-2-small-shaped model, no download ---------------------------------------------------


@dataclass(frozen=True)
class Shape:
    vocab: int = 50257
    ctx: int = 1024
    layers: int = 12
    d: int = 768
    heads: int = 12


GPT2_SMALL = Shape()
TINY = Shape(vocab=256, ctx=64, layers=2, d=64, heads=4)


class Block(nn.Module):
    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.heads = s.heads
        self.ln1, self.ln2 = nn.LayerNorm(s.d), nn.LayerNorm(s.d)
        self.qkv, self.proj = nn.Linear(s.d, 3 * s.d), nn.Linear(s.d, s.d)
        self.fc, self.act, self.out = nn.Linear(s.d, 4 * s.d), nn.GELU(approximate="tanh"), \
            nn.Linear(4 * s.d, s.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """GPT-2's shape (tied head): 124M parameters at ``GPT2_SMALL``."""

    def __init__(self, s: Shape) -> None:
        super().__init__()
        self.n_layer, self.n_embd = s.layers, s.d  # what the client's FLOPs estimate reads
        self.wte, self.wpe = nn.Embedding(s.vocab, s.d), nn.Embedding(s.ctx, s.d)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.ln_f = nn.LayerNorm(s.d)
        self.head = nn.Linear(s.d, s.vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@dataclass
class Rig:
    device: torch.device
    shape: Shape
    batch: int
    seq: int

    def model(self, seed: int = 0) -> GPT:
        torch.manual_seed(seed)
        return GPT(self.shape).to(self.device)

    def optimizer(self, model: nn.Module, fused: bool) -> torch.optim.Optimizer:
        kind = {"fused": True} if fused else {"foreach": True}
        return torch.optim.AdamW(model.parameters(), lr=1e-4, **kind)

    def batches(self, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator(device="cpu").manual_seed(1)
        out = []
        for _ in range(n):
            idx = torch.randint(0, self.shape.vocab, (self.batch, self.seq + 1), generator=g)
            idx = idx.to(self.device)
            out.append((idx[:, :-1], idx[:, 1:]))
        return out

    def loss(self, model: nn.Module, xy: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16,
                            enabled=self.device.type == "cuda"):
            return model(*xy)

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def step(self, model: nn.Module, opt: torch.optim.Optimizer,
             xy: tuple[torch.Tensor, torch.Tensor], mon: Monitor | None = None,
             n: int = 0) -> None:
        """One whole step: plain (``clip_grad_norm_``, then the optimizer) or, with ``mon``,
        monitored (the client clips in the optimizer's pre-hook; ``log_step(n)``)."""
        loss = self.loss(model, xy)
        loss.backward()
        if mon is None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if mon is not None:
            mon.log_step(n, loss=loss.detach(), tokens=self.tokens)


# -- a loopback sink that keeps what the client sends -------------------------------------------


class Sink:
    """Accepts the client's POSTs like the sidecar (the network is not what we measure) and
    keeps the records as their raw lines, decoded when asked: a list of decoded records
    (a layer-statistics step holds over a thousand objects) would grow the garbage
    collector's work in the very process being timed, where the sidecar's are in another."""

    def __init__(self) -> None:
        import gzip

        lines: list[bytes] = []
        self.lines = lines

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                lines.extend(line for line in body.splitlines() if line.strip())
                reply = b'{"accepted": 0, "duplicates": 0, "rejected": []}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        tag = run_id.encode()
        found = {}
        for line in list(self.lines):
            if tag in line:
                r = json.loads(line)
                if r.get("kind") == "step" and r.get("run_id") == run_id:
                    found[r["step"]] = r
        return [found[s] for s in sorted(found)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def monitor(url: str, run_id: str, spool: str, **settings: Any) -> Monitor:
    return Monitor(url=url, run_id=run_id, settings=MonitorSettings(
        install_hooks=False, spool_dir=spool, linger=0.2, **settings))


# -- sections ------------------------------------------------------------------------------------


def _interleaved(device: torch.device, arms: dict[str, Any], rounds: int, per_round: int,
                 around: Any = None) -> dict[str, list[float]]:
    """Seconds a step of each arm, a figure per round: ``per_round`` steps of each arm in
    turn between two syncs, the order reversed every other round; ``around(name, on)``
    is told as an arm's block begins (True) and ends (False)."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(rounds):
        for name in list(arms) if r % 2 else list(reversed(arms)):
            if around is not None:
                around(name, True)
            sync(device)
            start = time.perf_counter()
            for _ in range(per_round):
                arms[name]()
            sync(device)
            times[name].append((time.perf_counter() - start) / per_round)
            if around is not None:
                around(name, False)
    return times


def overhead(rig: Rig, sink: Sink, spool: str, rounds: int, per_round: int) -> dict[str, Any]:
    plain_model, mon_model = rig.model(), rig.model()
    plain_opt, mon_opt = rig.optimizer(plain_model, True), rig.optimizer(mon_model, True)
    mon = monitor(sink.url, "gpu-check-overhead", spool)
    mon.watch(mon_model, mon_opt, grad_clip=1.0)
    data = rig.batches()
    step = 0

    def plain() -> None:
        rig.step(plain_model, plain_opt, data[0])

    def monitored() -> None:
        nonlocal step
        step += 1
        rig.step(mon_model, mon_opt, data[0], mon, step)

    for fn in (plain, monitored, plain, monitored):  # warm-up: kernels, allocator, hooks
        for _ in range(3):
            fn()
    times = _interleaved(rig.device, {"plain": plain, "monitored": monitored}, rounds,
                         per_round)
    mon.flush(30)
    memory = _memory(sink, "gpu-check-overhead", rig.device)
    mon.close(timeout=30)
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = [m / p for m, p in zip(times["monitored"], times["plain"], strict=True)]
    return {"plain_s": med["plain"], "monitored_s": med["monitored"],
            "ratio": med["monitored"] / med["plain"],
            "paired_ratio_median": statistics.median(paired),
            "paired_ratio_range": [min(paired), max(paired)], "rounds": rounds,
            "steps_per_round": per_round, "tokens_per_step": rig.tokens,
            "model_params": sum(p.numel() for p in mon_model.parameters()),
            "memory": memory, "_model": mon_model}


ABLATIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("default", {}),
    ("finite_full", {"watch": WatchSettings(finite_flags="full")}),
    ("no_finite_flags", {"watch": WatchSettings(finite_flags=False)}),
    ("no_gpu_probe", {"gpu_probe": None}),
    ("no_watchdog", {"watchdog": False}),
    ("no_layer_stats", {"watch": WatchSettings(layer_stats_every=1 << 30)}),
    ("none_of_these", {"watch": WatchSettings(finite_flags=False), "gpu_probe": None,
                       "watchdog": False}),
    ("bare", {"watch": WatchSettings(finite_flags=False, layer_stats_every=1 << 30),
              "gpu_probe": None, "watchdog": False}),
)


def ablation(rig: Rig, sink: Sink, spool: str, rounds: int, per_round: int) -> dict[str, Any]:
    """What each part of the client costs: whole steps with one part off at a time, each
    variant a fresh Monitor per round (its threads alive only in its own round), rounds
    interleaved with plain steps; and whether a plain step is bound by the host's kernel
    launches or by the GPU (the host's time to issue one step vs the step's wall time)."""
    model = rig.model()
    opt = rig.optimizer(model, True)
    data = rig.batches()

    def step(mon: Monitor | None, n: int) -> None:
        rig.step(model, opt, data[0], mon, n)

    for n in range(3):
        step(None, n)
    sync(rig.device)
    start = time.perf_counter()
    step(None, 0)
    issued = time.perf_counter() - start
    sync(rig.device)
    whole = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name, _ in (("plain", {}), *ABLATIONS)}
    for r in range(rounds):
        names = list(times) if r % 2 else list(reversed(times))
        for name in names:
            extra = dict(ABLATIONS).get(name)
            mon = None
            if extra is not None:
                mon = monitor(sink.url, f"gpu-check-ablation-{name}-{r}", spool, **extra)
                mon.watch(model, opt, grad_clip=1.0)
                for n in (1, 2):
                    step(mon, n)
            sync(rig.device)
            start = time.perf_counter()
            for n in range(3, per_round + 3):
                step(mon, n)
            sync(rig.device)
            times[name].append((time.perf_counter() - start) / per_round)
            if mon is not None:
                mon.close(timeout=30)
    plain = statistics.median(times["plain"])
    return {"host_issue_s": issued, "step_s": whole, "batch": rig.batch, "seq": rig.seq,
            "plain_s": plain, "rounds": rounds, "steps_per_round": per_round,
            "ratio": {k: statistics.median(v) / plain for k, v in times.items()}}


def profile(rig: Rig, sink: Sink, spool: str, steps: int) -> dict[str, Any]:
    """Where a monitored step's extra time goes: the device time and kernel count of a plain
    and a monitored step (torch.profiler, per step), the kernels the client adds, by name,
    and the host's time to issue one step from an idle queue (which, against the device
    time, says whether the step is bound by the host's launches or by the GPU)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    plain_model, mon_model = rig.model(), rig.model()
    opts = {False: rig.optimizer(plain_model, True), True: rig.optimizer(mon_model, True)}
    models = {False: plain_model, True: mon_model}
    data = rig.batches()
    mon = monitor(sink.url, "gpu-check-profile", spool)
    mon.watch(mon_model, opts[True], grad_clip=1.0)
    n = 0

    def step(monitored: bool) -> None:
        nonlocal n
        n += monitored
        rig.step(models[monitored], opts[monitored], data[0], mon if monitored else None, n)

    out: dict[str, Any] = {"steps": steps}
    kernels: dict[str, dict[str, float]] = {}
    for monitored in (False, True):
        name = "monitored" if monitored else "plain"
        issue = []
        for _ in range(5):
            step(monitored)
            sync(rig.device)
            start = time.perf_counter()
            step(monitored)
            issue.append(time.perf_counter() - start)
            sync(rig.device)
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step(monitored)
            sync(rig.device)
        by_name: dict[str, float] = {}
        launches = 0
        for e in prof.key_averages():
            # A user annotation on the device (``Optimizer.step#AdamW.step``) spans the
            # kernels launched inside it: counting it too would count them twice.
            if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
                continue
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = e.self_cuda_time_total
            by_name[e.key] = by_name.get(e.key, 0.0) + us / steps
            launches += e.count
        kernels[name] = by_name
        out[name] = {"device_ms": sum(by_name.values()) / 1e3, "kernels": launches / steps,
                     "host_issue_ms": statistics.median(issue) * 1e3}
    mon.close(timeout=30)
    added = {k: kernels["monitored"].get(k, 0.0) - kernels["plain"].get(k, 0.0)
             for k in set(kernels["monitored"]) | set(kernels["plain"])}
    out["added_us"] = dict(sorted(added.items(), key=lambda kv: -kv[1])[:12])
    return out


HOST_DELAYS_US = (300, 1000, 3000)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def host(rig: Rig, sink: Sink, spool: str, rounds: int, per_round: int) -> dict[str, Any]:
    """Whether host time is on the step: plain steps with a busy wait added on the training
    thread after each (``HOST_DELAYS_US``), plain steps beside a thread that holds the GIL
    for 1 ms in every step's time, and the monitored step, interleaved in rounds. A step
    whose host runs ahead of the device hides the added host time (ratio 1.0); a step bound
    by its host pays it whole. So where the client's cost on a step lies: in host work
    (worth moving off the training thread) or on the device (worth fewer kernels)."""
    model = rig.model()
    opt = rig.optimizer(model, True)
    data = rig.batches()
    stop = threading.Event()
    burning = threading.Event()

    def burner() -> None:
        while not stop.is_set():
            burning.wait(0.1)
            if burning.is_set():
                _spin(1e-3)
                time.sleep(0.039)

    threading.Thread(target=burner, name="gpu-check-gil", daemon=True).start()
    mon = monitor(sink.url, "gpu-check-host", spool)
    step = 0

    def plain(extra_us: float = 0.0) -> Any:
        def run() -> None:
            rig.step(model, opt, data[0])
            if extra_us:
                _spin(extra_us / 1e6)
        return run

    def monitored() -> None:
        nonlocal step
        step += 1
        rig.step(model, opt, data[0], mon, step)

    arms: dict[str, Any] = {"plain": plain(), **{f"host_{us}us": plain(us)
                                                 for us in HOST_DELAYS_US},
                            "gil_thread": plain(), "monitored": monitored}
    try:
        mon.watch(model, opt, grad_clip=1.0)
        for fn in arms.values():  # warm-up
            for _ in range(2):
                fn()
        times = _interleaved(rig.device, arms, rounds, per_round, lambda name, on: (
            burning.set() if on and name == "gil_thread" else burning.clear()))
    finally:
        stop.set()
        burning.set()
        mon.close(timeout=30)
    plain_s = statistics.median(times["plain"])
    return {"plain_s": plain_s, "rounds": rounds, "steps_per_round": per_round,
            "ratio": {k: statistics.median(v) / plain_s for k, v in times.items()
                      if k != "plain"}}


def _memory(sink: Sink, run_id: str, device: torch.device) -> dict[str, Any]:
    steps = sink.steps(run_id)
    sent = steps[-1].get("memory") if steps else None
    return {"record": sent, "torch": {
        "allocated_bytes": torch.cuda.memory_allocated(device),
        "reserved_bytes": torch.cuda.memory_reserved(device),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "total_bytes": torch.cuda.mem_get_info(device)[1]}}


class SyncCounter:
    """Counts synchronizing CUDA calls (``torch.cuda.set_sync_debug_mode("warn")``) by thread,
    with the innermost frame of our code (or the script's) that made each."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self._saved: Any = None

    def __enter__(self) -> SyncCounter:
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._seen
        torch.cuda.set_sync_debug_mode("warn")
        self.events.clear()  # what setting the mode itself reported is not the loop's
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.set_sync_debug_mode("default")
        self._catch.__exit__(*exc)

    def _seen(self, message: Any, category: Any, filename: str, lineno: int,
              file: Any = None, line: Any = None) -> None:
        if "synchroniz" not in str(message):
            return
        where = "?"
        for frame in reversed(traceback.extract_stack()[:-1]):
            if "monitor_client" in frame.filename or frame.filename == __file__:
                where = f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"
                break
        self.events.append((threading.current_thread().name, where))

    def training(self) -> list[str]:
        """Where each sync on a thread other than the client's own background ones was."""
        return [where for thread, where in self.events if thread not in CLIENT_THREADS]


def syncs(rig: Rig, sink: Sink, spool: str, model: nn.Module, warm: int,
          counted: int) -> dict[str, Any]:
    data = rig.batches()
    out: dict[str, Any] = {}
    configs = (("default", False, None, {}), ("guard_fused", True, True, {}),
               ("guard_foreach", False, True, {}),
               ("default_distributed", False, None, {"world_size": 2, "rank": 0}))
    for name, fused, guard, extra in configs:
        opt = rig.optimizer(model, fused)
        mon = monitor(sink.url, f"gpu-check-syncs-{name}", spool, **extra)
        mon.watch(model, opt, grad_clip=1.0, guard=guard)
        counter = SyncCounter()
        for step in range(1, warm + counted + 1):
            if step == warm + 1:
                sync(rig.device)
                counter.__enter__()
            loss = rig.loss(model, data[step % len(data)])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.log_step(step, loss=loss.detach(), tokens=rig.tokens)
        sync(rig.device)
        counter.__exit__(None, None, None)
        mon.close(timeout=30)
        found = counter.training()
        out[name] = {"per_step": len(found) / counted, "steps": counted,
                     "where": dict(Counter(found).most_common(5)),
                     "background_thread_syncs": len(counter.events) - len(found)}
    return out


def _sleep_cycles_per_ms(device: torch.device) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / start.elapsed_time(end)


def split(rig: Rig, sink: Sink, spool: str, model: nn.Module, wait_ms: float,
          steps: int) -> dict[str, Any]:
    """The event split of a distributed run vs a synchronize-timed reference (see top).

    The reference syncs at each boundary, so its host issues each phase's kernels while
    the GPU waits for them; the monitored loop never syncs, so its host issues the next
    step's kernels while the stream sleeps in the "all-reduce". The two time the same
    work only when the GPU, not the host's launches, sets the pace: ``rig`` has a batch
    large enough for that (three times the overhead's; ``ablation`` prints which bound a
    step is)."""
    cycles = int(wait_ms * _sleep_cycles_per_ms(rig.device))
    comm = torch.cuda.Stream(rig.device)
    data = rig.batches()

    def all_reduce() -> None:  # what NCCL does to the training stream: make it wait
        here = torch.cuda.current_stream(rig.device)
        comm.wait_stream(here)
        with torch.cuda.stream(comm):
            torch.cuda._sleep(cycles)
        here.wait_stream(comm)

    opt = rig.optimizer(model, True)
    ref_wait, ref_compute = [], []
    for step in range(steps):  # the reference: a sync at each boundary, host clock
        sync(rig.device)
        t0 = time.perf_counter()
        loss = rig.loss(model, data[step % len(data)])
        loss.backward()
        sync(rig.device)
        t_grad = time.perf_counter()
        all_reduce()
        sync(rig.device)
        t_reduced = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(rig.device)
        t_end = time.perf_counter()
        if step >= 3:
            ref_wait.append(t_reduced - t_grad)
            ref_compute.append(t_end - t0 - (t_reduced - t_grad))
    run_id = "gpu-check-split"
    mon = monitor(sink.url, run_id, spool, world_size=2, rank=0)
    mon.watch(model, opt, grad_clip=1.0)
    for step in range(1, steps + 1):  # monitored: no sync anywhere on the training thread
        loss = rig.loss(model, data[step % len(data)])
        loss.backward()
        all_reduce()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.log_step(step, loss=loss.detach(), tokens=rig.tokens)
    sync(rig.device)
    mon.flush(30)
    mon.close(timeout=30)
    recs = [r for r in sink.steps(run_id) if r["step"] > 3]
    waits = [r["sync_wait_time"] for r in recs if r.get("sync_wait_time") is not None]
    computes = [r["compute_time"] for r in recs if r.get("compute_time") is not None]
    ev_wait, ev_compute = _median(waits), _median(computes)
    rw, rc = statistics.median(ref_wait), statistics.median(ref_compute)
    return {"simulated_all_reduce_ms": wait_ms, "steps": steps, "split_steps": len(waits),
            "event_wait_s": ev_wait, "reference_wait_s": rw,
            "event_compute_s": ev_compute, "reference_compute_s": rc,
            "wait_error": abs(ev_wait - rw) / rw if ev_wait == ev_wait else math.nan,
            "compute_error": abs(ev_compute - rc) / rc if ev_compute == ev_compute else math.nan}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def shapes(tests: tuple[str, ...] = SHAPE_TESTS) -> dict[str, Any]:
    """The client's training-shape tests with every tensor on the GPU (bench/on_cuda.py), in
    a pytest of their own: how many passed, and which failed with their last lines."""
    import os
    import re
    import subprocess

    root = Path(__file__).resolve().parent.parent
    here = [t for t in tests if (root / t).exists()]
    if not here:
        return {"error": "the tests are not in this checkout"}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root), str(root / "client"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "bench.on_cuda", "-p",
         "no:cacheprovider", "--timeout", "120", "--tb=short",
         # (tests of the CPU's own path: a GPU has none of it)
         "-k", "not cpu and not sharded", *here],
        cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout + done.stderr
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)", out)}
    failed = [ln[len("FAILED "):] for ln in out.splitlines() if ln.startswith("FAILED ")]
    return {"tests": here, "passed": counts.get("passed", 0),
            "failed": counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0),
            "skipped": counts.get("skipped", 0), "failures": failed, "output": out}


def nvml(device: torch.device) -> dict[str, Any]:
    from monitor_client._monitor import _cuda_uuid
    from monitor_client._nvml import nvml_probe

    uuid = _cuda_uuid(device)
    probe = nvml_probe(device.index or 0, uuid)
    if probe is None:
        return {"skipped": "NVML unavailable (nvidia-ml-py missing, or no driver answered)"}
    start = time.perf_counter()
    first = probe.read()
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    reading = probe.read()
    again_s = time.perf_counter() - start
    return {"reading": reading, "first_read_s": first_s, "read_s": again_s,
            "unsupported": sorted(probe.unsupported), "describe": probe.describe(),
            "torch_uuid": uuid, "first_reading_keys": sorted(first or {})}


class Catcher:
    """A webhook receiver on loopback: what the sidecar's webhook channel delivers."""

    def __init__(self) -> None:
        got: list[tuple[float, dict[str, Any]]] = []
        self.got = got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                got.append((time.perf_counter(), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def nan_paged(rig: Rig, spool: str, steps: int = 12, at: int = 8,
              wait_s: float = 30.0) -> dict[str, Any]:
    try:
        from monitor_agent.serving.embedded import EmbeddedServer, free_port
        from monitor_agent.settings import load_settings
    except ImportError as exc:  # the sidecar's packages are not installed here
        return {"skipped": f"the sidecar cannot run here: {exc}"}
    catcher = Catcher()
    data_dir = tempfile.mkdtemp(prefix="gpu-check-sidecar-")
    settings = load_settings(data_dir=Path(data_dir), host="127.0.0.1", port=free_port(),
                             alerting={"webhook": {"url": catcher.url}})
    model = rig.model(seed=2)
    opt = rig.optimizer(model, rig.device.type == "cuda")
    data = rig.batches()
    run_id = f"gpu-check-nan-{int(time.time())}"
    with EmbeddedServer(settings) as srv:
        mon = Monitor(url=srv.url, run_id=run_id, settings=MonitorSettings(
            install_hooks=False, spool_dir=spool, watchdog=False))
        mon.watch(model, opt, grad_clip=1.0)
        logged_at = None
        for step in range(1, steps + 1):
            loss = rig.loss(model, data[step % len(data)])
            if step == at:
                loss = loss * float("nan")  # the fault, on the device
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.log_step(step, loss=loss.detach(), tokens=rig.tokens)
            if step == at:
                logged_at = time.perf_counter()
        deadline = time.monotonic() + wait_s
        page = None
        while page is None and time.monotonic() < deadline:
            page = next(((t, b) for t, b in list(catcher.got) if any(
                a.get("type") == "nan_inf" for a in b.get("alerts", []))), None)
            time.sleep(0.02)
        mon.close(timeout=10)
    catcher.close()
    if page is None or logged_at is None:
        return {"paged": False, "waited_s": wait_s, "received": len(catcher.got)}
    alert = next(a for a in page[1]["alerts"] if a.get("type") == "nan_inf")
    return {"paged": True, "seconds_after_log_step": page[0] - logged_at, "nan_step": at,
            "alertname": alert.get("alertname"), "severity": alert.get("severity"),
            "message": alert.get("summary") or alert.get("message"), "device": str(rig.device)}


# -- the report ----------------------------------------------------------------------------------


def _mb(n: Any) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f} MiB"


def report(res: dict[str, Any], cuda: bool) -> list[str]:
    lines = [f"{name:<9}: ERROR {got['error']}" for name, got in res.items()
             if isinstance(got, dict) and "error" in got]
    if "overhead" in res and "error" in res["overhead"]:
        lines.append(f"memory   : ERROR {res['overhead']['error']}")
    res = {k: v for k, v in res.items() if not (isinstance(v, dict) and "error" in v)}
    why = "needs a CUDA GPU (torch.cuda.is_available() is False here)"
    ov = res.get("overhead")
    if ov is None or "ratio" not in ov:
        lines.append(f"overhead : skipped: {why}")
    else:
        verdict = "PASS" if ov["ratio"] <= TARGETS["overhead"] else "FAIL"
        lines.append(
            f"overhead : plain {ov['plain_s'] * 1e3:.2f} ms/step, monitored "
            f"{ov['monitored_s'] * 1e3:.2f} ms/step, ratio {ov['ratio']:.4f} (paired rounds: "
            f"median {ov['paired_ratio_median']:.4f}, {ov['paired_ratio_range'][0]:.4f}.."
            f"{ov['paired_ratio_range'][1]:.4f}; {ov['rounds']} rounds x "
            f"{ov['steps_per_round']} steps, {ov['model_params'] / 1e6:.1f}M params, bf16, "
            f"{ov['tokens_per_step']} tokens/step)   target <= {TARGETS['overhead']}  {verdict}")
    sy = res.get("syncs")
    if sy is None:
        lines.append(f"syncs    : skipped: {why}")
    else:
        for name, s in sy.items():
            expect = 1.0 if name == "guard_foreach" else 0.0
            verdict = "PASS" if s["per_step"] <= expect else "FAIL"
            where = ", ".join(f"{k} x{v}" for k, v in s["where"].items()) or "none"
            lines.append(f"syncs    : {name:<20} {s['per_step']:.2f} per step on the training "
                         f"thread over {s['steps']} steps (where: {where}; the client's own "
                         f"threads: {s['background_thread_syncs']})   target {expect:g}  "
                         f"{verdict}")
    mem = (ov or {}).get("memory")
    if mem is None:
        lines.append(f"memory   : skipped: {why}")
    else:
        sent, real = mem["record"] or {}, mem["torch"]
        for key, fn in (("allocated_bytes", "memory_allocated"),
                        ("reserved_bytes", "memory_reserved"),
                        ("peak_allocated_bytes", "max_memory_allocated"),
                        ("total_bytes", "mem_get_info()[1]")):
            lines.append(f"memory   : {key:<21} record {_mb(sent.get(key)):>14}   "
                         f"torch.cuda.{fn} {_mb(real[key]):>14}")
        same = sent.get("peak_allocated_bytes") == real["peak_allocated_bytes"]
        lines.append(f"memory   : peak in the last record == max_memory_allocated: {same}   "
                     f"{'PASS' if same else 'FAIL'}")
    sp = res.get("split")
    if sp is None:
        lines.append(f"split    : skipped: {why}")
    else:
        ok = max(sp["wait_error"], sp["compute_error"]) <= TARGETS["split"]
        lines.append(
            f"split    : sync_wait_time events {sp['event_wait_s'] * 1e3:.2f} ms vs reference "
            f"{sp['reference_wait_s'] * 1e3:.2f} ms ({sp['wait_error']:.1%}); compute_time "
            f"events {sp['event_compute_s'] * 1e3:.2f} ms vs reference "
            f"{sp['reference_compute_s'] * 1e3:.2f} ms ({sp['compute_error']:.1%}); "
            f"{sp['split_steps']} steps split, simulated all-reduce "
            f"{sp['simulated_all_reduce_ms']:g} ms   target <= 5%  {'PASS' if ok else 'FAIL'}")
    sh = res.get("shapes")
    if sh and "error" not in sh:
        lines.append(f"shapes   : the client's training-shape tests on the GPU: {sh['passed']} "
                     f"passed, {sh['failed']} failed, {sh['skipped']} skipped   "
                     f"{'PASS' if not sh['failed'] and sh['passed'] else 'FAIL'}")
        lines.extend(f"shapes   :   {name}" for name in sh["failures"])
    ab = res.get("ablation")
    if ab is not None:
        lines.append(f"ablation : plain step {ab['plain_s'] * 1e3:.2f} ms (batch {ab['batch']}x"
                     f"{ab['seq']}); the host issues one in {ab['host_issue_s'] * 1e3:.2f} ms of "
                     f"its {ab['step_s'] * 1e3:.2f} ms ({'host' if ab['host_issue_s'] > 0.8 * ab['step_s'] else 'GPU'}-bound)")
        lines.append("ablation : ratio to plain: " + ", ".join(
            f"{k} {v:.4f}" for k, v in ab["ratio"].items() if k != "plain"))
    pr = res.get("profile")
    if pr is not None:
        for name in ("plain", "monitored"):
            v = pr[name]
            lines.append(f"profile  : {name:<9} device {v['device_ms']:.2f} ms/step in "
                         f"{v['kernels']:.0f} kernels; the host issues a step in "
                         f"{v['host_issue_ms']:.2f} ms")
        lines.append("profile  : kernels the client adds (us/step): " + ", ".join(
            f"{k[:60]} {v:+.0f}" for k, v in pr["added_us"].items()))
    ho = res.get("host")
    if ho is not None:
        lines.append(f"host     : plain step {ho['plain_s'] * 1e3:.2f} ms; ratio to plain with "
                     "host time added on the training thread each step: " + ", ".join(
                         f"{k.removeprefix('host_')} {v:.4f}" for k, v in ho["ratio"].items())
                     + f" ({ho['rounds']} rounds x {ho['steps_per_round']} steps; 1.0: "
                     "hidden behind the device)")
    nv = res.get("nvml")
    if nv is None:
        lines.append(f"nvml     : skipped: {why}")
    elif "skipped" in nv:
        lines.append(f"nvml     : skipped: {nv['skipped']}")
    else:
        lines.append(f"nvml     : GPU {nv['describe']} (torch's uuid {nv['torch_uuid']}); a "
                     f"reading takes {nv['read_s'] * 1e3:.2f} ms (first "
                     f"{nv['first_read_s'] * 1e3:.2f} ms); not given by this driver/GPU: "
                     f"{', '.join(nv['unsupported']) or 'nothing'}")
        reading = nv["reading"] or {}
        keys = sorted(reading)
        for i in range(0, len(keys), 4):
            lines.append("nvml     :   " + "  ".join(f"{k}={reading[k]:g}" for k in keys[i:i + 4]))
    nan = res.get("nan")
    if nan is None:
        lines.append("nan      : not run")
    elif "skipped" in nan:
        lines.append(f"nan      : skipped: {nan['skipped']}")
    elif nan["paged"]:
        lines.append(f"nan      : paged {nan['seconds_after_log_step']:.2f} s after log_step of "
                     f"the NaN step {nan['nan_step']} (on {nan['device']}): "
                     f"{nan['alertname']} [{nan['severity']}] {nan['message']!r}   PASS")
    else:
        lines.append(f"nan      : NOT paged within {nan['waited_s']:g} s "
                     f"({nan['received']} webhook posts)   FAIL")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated, of {', '.join(SECTIONS)}")
    p.add_argument("--quick", action="store_true", help="a smaller model and fewer steps")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--ablation-rounds", type=int, default=4,
                   help="interleaved rounds of every ablation arm (--sections ablation)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS) - set(EXTRA_SECTIONS))
    if unknown:
        p.error(f"unknown sections {unknown}")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    shape = TINY if args.quick or not cuda else GPT2_SMALL
    big = Rig(device, shape, args.batch if cuda and not args.quick else 4,
              args.seq if cuda and not args.quick else shape.ctx)
    # The split's reference needs a GPU-bound step (see ``split``): three times the batch.
    wide = Rig(device, shape, big.batch * (3 if cuda and not args.quick else 1), big.seq)
    small = Rig(device, shape, 4 if cuda and not args.quick else 2,
                min(512, shape.ctx) if cuda else 32)
    print(f"gpu_check: torch {torch.__version__}, device "
          f"{torch.cuda.get_device_name(device) if cuda else 'cpu (no CUDA GPU)'}, "
          f"model {'GPT-2-small shape' if shape is GPT2_SMALL else 'tiny'}, "
          f"sections {','.join(wanted)}", flush=True)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if cuda else "cpu",
                           "torch": torch.__version__}
    started = time.perf_counter()
    sink = Sink()
    spool = tempfile.mkdtemp(prefix="gpu-check-spool-")
    held: dict[str, Any] = {}

    def model() -> nn.Module:  # one GPT-2 for the sections after the overhead's
        if "model" not in held:
            held["model"] = big.model()
        return held["model"]

    def measure_overhead() -> dict[str, Any]:
        ov = overhead(big, sink, spool, 2 if args.quick else args.rounds,
                      5 if args.quick else 25)
        held["model"] = ov.pop("_model")
        return ov

    plan = (
        ("overhead", {"overhead", "memory"}, measure_overhead),
        ("syncs", {"syncs"}, lambda: syncs(small, sink, spool, model(), 3,
                                           10 if args.quick else 55)),
        ("ablation", {"ablation"}, lambda: ablation(big, sink, spool,
                                                    2 if args.quick else args.ablation_rounds,
                                                    5 if args.quick else 25)),
        ("profile", {"profile"}, lambda: profile(big, sink, spool, 3 if args.quick else 10)),
        ("host", {"host"}, lambda: host(big, sink, spool, 2 if args.quick else args.rounds,
                                        5 if args.quick else 25)),
        ("split", {"split"}, lambda: split(wide, sink, spool, model(),
                                           5.0 if args.quick else 20.0,
                                           12 if args.quick else 40)),
        ("nvml", {"nvml"}, lambda: nvml(device)),
        ("shapes", {"shapes"}, shapes),
        ("nan", {"nan"}, lambda: nan_paged(Rig(
            device, TINY if not cuda or args.quick else shape, 2,
            32 if not cuda or args.quick else 256), spool)),
    )
    try:
        for name, needs, fn in plan:
            if not needs & set(wanted) or (not cuda and name != "nan"):
                continue
            if name == "nan":
                held.clear()  # the GPU's memory back before the sidecar's run
            try:  # one section's failure costs that section, never the report
                res[name] = fn()
            except Exception as exc:  # noqa: BLE001 - reported with its traceback
                traceback.print_exc()
                res[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"  {name} done ({time.perf_counter() - started:.0f} s)", flush=True)
            if args.json:
                args.json.write_text(json.dumps(res, indent=2, default=str))
    finally:
        sink.close()
    lines = [ln for ln in report(res, cuda) if ln.split(":")[0].strip() in wanted]
    print(f"\n== gpu_check on {res['device']} ({time.perf_counter() - started:.0f} s) ==")
    for line in lines:
        print(line)
    res["seconds"] = time.perf_counter() - started
    res["lines"] = lines
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
