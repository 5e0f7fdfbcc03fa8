"""A real CPU training run with the step guard on, for tests/e2e/test_step_guard.py.

A small MLP regresses a fixed linear target with fused AdamW; the batches at the steps
given by ``--spike`` have their labels scaled x1000 (one corrupted batch: a gradient ~1e3x
the usual) and those given by ``--nan`` are NaN (a NaN loss and gradient). Prints, one per line, ``step <n> <param checksum>`` so the test can see the
loop ran to the end.

    python tests/e2e/guard_train.py --url URL --run-id ID --steps 200 --spike 90 130
"""

from __future__ import annotations

import argparse

import torch

from monitor_client import Monitor, MonitorSettings, WatchSettings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--spike", type=int, nargs="*", default=[])
    parser.add_argument("--nan", type=int, nargs="*", default=[])
    parser.add_argument("--spool-dir", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    target = torch.randn(16, 1)
    mon = Monitor(url=args.url, project="guard-e2e", run_id=args.run_id,
                  total_steps=args.steps,
                  settings=MonitorSettings(spool_dir=args.spool_dir, linger=0.05,
                                           install_hooks=False,
                                           watch=WatchSettings(guard=True)))
    mon.watch(model, opt, grad_clip=1.0)
    gen = torch.Generator().manual_seed(1)
    for step in range(1, args.steps + 1):
        x = torch.randn(128, 16, generator=gen)
        y = x @ target + 0.1 * torch.randn(128, 1, generator=gen)
        if step in args.spike:
            y = y * 1000.0
        if step in args.nan:
            y = y * float("nan")
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mon.log_step(step, loss=loss.detach(), samples=128)
    mon.close(timeout=30)
    print("done", flush=True)


if __name__ == "__main__":
    main()
