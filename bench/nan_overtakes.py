"""How long a NaN step waits behind a backlog once the sidecar is back.

A real sidecar; a client script logs healthy steps, the sidecar is killed, the script keeps
logging ``--backlog`` steps (spooled, each padded to ``--pad`` bytes like a layer-stats
record) and then one step with a NaN loss, the outage lasts ``--outage`` seconds, and the
sidecar is started again on the same port and data. We print the seconds from "sidecar
ready again" to "the NaN step is stored", and to "every record is stored".

    python bench/nan_overtakes.py [--backlog 20000] [--pad 2000] [--outage 20]
                                  [--client DIR]   # another checkout's client/, to compare
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from sidecar_process import SidecarProcess  # noqa: E402

SCRIPT = """
import os, sys, time
import monitor_client
mon = monitor_client.Monitor(url=os.environ["URL"], run_id="nan-overtakes",
                             spool_dir=os.environ["SPOOL"], linger=0.05)
pad = "x" * int(os.environ["PAD"])
for step in range(1, 101):
    mon.log_step(step, loss=1.0, pad=pad)
mon.flush(10)
print("killed?", flush=True); sys.stdin.readline()
backlog = int(os.environ["BACKLOG"])
for step in range(101, 101 + backlog):
    mon.log_step(step, loss=1.0, pad=pad)
mon.log_step(101 + backlog, loss=float("nan"), pad=pad)
print("nan logged", flush=True); sys.stdin.readline()
mon.close(timeout=300)
"""


def _stored(url: str, step: int) -> bool:
    r = httpx.get(f"{url}/v1/runs/nan-overtakes/records",
                  params={"since_step": step, "limit": 1, "kind": "step"}, timeout=10)
    found = r.json()["records"] if r.status_code == 200 else []
    return bool(found) and found[0]["step"] == step  # oldest first from since_step


def measure(client: Path, backlog: int, pad: int, outage: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        sc = SidecarProcess(Path(tmp) / "sidecar").start()
        env = {**os.environ, "PYTHONPATH": str(client), "URL": sc.url, "PAD": str(pad),
               "BACKLOG": str(backlog), "SPOOL": str(Path(tmp) / "spool")}
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            proc.stdout.readline()
            sc.kill()
            t_down = time.monotonic()
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.stdout.readline()
            time.sleep(max(0.0, outage - (time.monotonic() - t_down)))
            sc.start()
            t_up = time.monotonic()
            nan_step = 101 + backlog
            nan_at = everything_at = None
            while everything_at is None and time.monotonic() - t_up < 600:
                if nan_at is None and _stored(sc.url, nan_step):
                    nan_at = time.monotonic() - t_up
                if nan_at is not None and _stored(sc.url, nan_step - 1):
                    everything_at = time.monotonic() - t_up
                time.sleep(0.05)
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(600)
            return nan_at, everything_at
        finally:
            if proc.poll() is None:
                proc.kill()
            sc.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlog", type=int, default=20_000)
    ap.add_argument("--pad", type=int, default=2000)
    ap.add_argument("--outage", type=float, default=20.0)
    ap.add_argument("--client", type=Path, default=REPO / "client")
    args = ap.parse_args()
    nan_s, all_s = measure(args.client, args.backlog, args.pad, args.outage)
    print(f"client {args.client}: backlog {args.backlog} x {args.pad} B, outage "
          f"{args.outage:g} s -> NaN step stored {nan_s:.2f} s after the sidecar was back; "
          f"the whole backlog {all_s:.2f} s")


if __name__ == "__main__":
    main()
