"""What the step guard (issue 22) costs a training step, on the 124M GPT-2-shaped CPU model
bench/client_overhead.py uses.

Whole steps (forward + backward + AdamW + zero_grad + log_step, the client in its default
configuration with grad_clip=1.0) with and without the guard, interleaved round by round in
one process so drift and the other load on the machine fall on both alike; for a fused
AdamW (the guard skips on device) and a foreach AdamW (the guard reads its flag on the
host, free on CPU). Also the guard's own hooks timed alone (the decision over its 128-norm
window, and the restore after the step), which is the guard's cost free of step noise.

    python -m bench.guard_overhead                  # CPU, ~3 minutes on 2 cores
    python -m bench.guard_overhead --rounds 10 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch

from bench.harness import (
    build,
    forward_backward,
    interleaved,
    model_arguments,
    monitored_step,
    start_sink,
    timed,
)
from monitor_client import Monitor, MonitorSettings, WatchSettings
from monitor_client._guard import StepGuard


def rounds(model, opt, batch, device, n, url, label) -> dict[str, float]:
    mon = Monitor(url=url, run_id=f"bench-guard-{label}",
                  settings=MonitorSettings(install_hooks=False, linger=0.2,
                                           watch=WatchSettings(guard=True)))
    mon.watch(model, opt, grad_clip=1.0)
    guard = mon._step_guard
    assert isinstance(guard, StepGuard)
    one = monitored_step(mon, model, opt, batch)

    def guarded(on: bool) -> Callable[[], Callable[[], None]]:
        def arm() -> Callable[[], None]:
            guard.detach()
            if on:
                guard.attach()
            return one
        return arm

    times = interleaved({"unguarded": guarded(False), "guarded": guarded(True)}, n, device,
                        alternate=True)
    guard.attach()
    forward_backward(model, batch)  # gradients present, as in the pre-hook
    mon._stats.before_step()

    def hooks():
        guard.before_step()
        guard.after_step()

    hook_s = timed(hooks, device, 200)
    opt.zero_grad(set_to_none=False)
    mon._stats.take()
    mon.close(timeout=30)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [g / u for g, u in zip(times["guarded"], times["unguarded"], strict=True)]
    return {**med, "ratio_of_medians": med["guarded"] / med["unguarded"],
            "median_paired_ratio": statistics.median(ratios), "hooks_s": hook_s,
            "rounds": n, "fused": guard.fused, "host_sync": guard.syncs}


def main() -> None:
    p = argparse.ArgumentParser(description="step guard cost on a 124M GPT-2-shaped model")
    model_arguments(p)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)  # build()'s argument; unused here
    args = p.parse_args()
    device = torch.device(args.device)
    url = start_sink()
    model, _, batch = build(args, device)
    print(f"124M GPT-2 shape, batch {args.batch} x seq {args.seq}, {device}, "
          f"{torch.get_num_threads()} threads, {args.rounds} interleaved rounds")
    for label, kw in (("fused", {"fused": True}), ("foreach", {"foreach": True})):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
        forward_backward(model, batch)
        opt.step()  # allocates the optimizer state outside the timed rounds
        opt.zero_grad(set_to_none=False)
        f = rounds(model, opt, batch, device, args.rounds, url, label)
        print(f"AdamW {label:8s} (guard skips {'on device' if f['fused'] else 'via host read'}"
              f"{', one sync/step' if f['host_sync'] else ''}): "
              f"step unguarded {f['unguarded'] * 1e3:8.1f} ms, guarded "
              f"{f['guarded'] * 1e3:8.1f} ms, ratio of medians {f['ratio_of_medians']:.4f}, "
              f"median paired ratio {f['median_paired_ratio']:.4f}; the guard's hooks alone "
              f"{f['hooks_s'] * 1e6:.0f} us = {f['hooks_s'] / f['unguarded']:.4%} of a step")


if __name__ == "__main__":
    main()
