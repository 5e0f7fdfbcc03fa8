"""What ``Monitor.rollback_plan()`` costs a distributed step: two gloo ranks on loopback call
it ``--calls`` times with no plan pending (the steady state), at ``check_every`` 1 and 10,
and print the mean time per call (most calls only count; every ``check_every``-th does one
all_reduce of one int64). No sidecar is needed: ``enabled=False`` is not used (it skips the
agreement), the Monitor points at a closed port (its run and end records go to a temporary
spool, removed after).

    python -m bench.rollback_agreement --calls 2000
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rank_main(rank: int, calls: int, every: int) -> None:
    import torch.distributed as dist

    from monitor_client import Monitor, MonitorSettings

    dist.init_process_group("gloo", rank=rank, world_size=2)
    spool = tempfile.TemporaryDirectory()
    mon = Monitor(url="http://127.0.0.1:9", run_id="bench-agree", settings=MonitorSettings(
        install_hooks=False, spool_dir=spool.name))
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        mon.rollback_plan(check_every=every)
    took = time.perf_counter() - start
    if rank == 0:
        print(f"check_every={every:>3}: {1e6 * took / calls:8.1f} us per call "
              f"({calls} calls, 2 gloo ranks)", flush=True)
    mon.close(timeout=0.1)
    spool.cleanup()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--every", type=int)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.calls, args.every)
        return
    for every in (1, 10):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--calls",
                                   str(args.calls), "--every", str(every)], env=env,
                                  stderr=subprocess.DEVNULL)
                 for r in (0, 1)]
        for proc in procs:
            proc.wait()


if __name__ == "__main__":
    main()
