"""The harness the client-cost benchmarks share (client_overhead.py, guard_overhead.py;
gpu_check.py takes its ``sync``): the 124M GPT-2-shaped model, one training step bare or
with the client, a loopback sink the client sends to, and a timer that waits for the
device.

The steps are whole: forward + backward, the optimizer (where the client's hooks measure
and clip), zero_grad and, monitored, ``log_step``; the sink accepts everything, so the
network is not what is measured.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, reps):
    """Median wall seconds of ``fn`` over ``reps`` runs (device work included)."""
    times = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Sink(BaseHTTPRequestHandler):
    """A loopback endpoint that accepts everything (the network is not what we measure)."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"accepted": 0, "duplicates": 0, "rejected": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def start_sink() -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def model_arguments(p: argparse.ArgumentParser) -> None:
    """The options ``build`` reads, and the device the steps run on."""
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)


def build(args, device):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).to(device)  # 124M parameters, tied head
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    batch = torch.randint(0, 50257, (args.batch, args.seq), device=device)
    return model, opt, batch


def forward_backward(model, batch):
    model(batch, labels=batch).loss.backward()


def bare_step(model, opt, batch):
    forward_backward(model, batch)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=False)


def monitored_step(mon, model, opt, batch) -> Callable[[], None]:
    """One whole step with the client ``mon`` watching ``model``; each call logs the next
    step number."""
    step = 0

    def one() -> None:
        nonlocal step
        step += 1
        forward_backward(model, batch)
        opt.step()
        opt.zero_grad(set_to_none=False)
        mon.log_step(step, loss=1.0, tokens=batch.numel())

    return one


def interleaved(arms: dict[str, Callable[[], Callable[[], object]]], rounds: int, device, *,
                alternate: bool = False, reps: int = 1) -> dict[str, list[float]]:
    """Each arm's step timed once a round (the median of ``reps`` runs), the arms in turn,
    for ``rounds`` rounds after a warm-up round whose times are dropped, so drift and the
    machine's other load fall on every arm alike. ``arms[name]()`` sets that arm up and
    returns the step to time; ``alternate`` runs the arms in reverse every other round
    (even ones), so no arm always follows the same one."""
    times: dict[str, list[float]] = {name: [] for name in arms}
    for rnd in range(rounds + 1):
        order = list(arms) if not alternate or rnd % 2 else list(reversed(arms))
        for name in order:
            step = arms[name]()
            t = statistics.median(timed(step, device, 1) for _ in range(reps))
            if rnd:
                times[name].append(t)
    return times
