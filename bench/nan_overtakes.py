"""How long a NaN page waits behind a backlog once the sidecar is back.

A real sidecar paging a local PagerDuty receiver; a client script logs healthy steps, the
sidecar is killed, the script keeps logging ``--backlog`` steps (spooled, each padded to
``--pad`` bytes like a layer-stats record) and then one step with a NaN loss, the outage
lasts ``--outage`` seconds, and the sidecar is started again on the same port and data.
We print the seconds from "sidecar ready again" to "the page is at the receiver" (what a
person waits for), to "the NaN step is stored", and to "every record is stored", and
how many steps were stored after a later one (late: the detectors only look forward).

    python -m bench.nan_overtakes [--backlog 20000] [--pad 2000] [--outage 20]
                                  [--max-queue 10000]
                                  [--client DIR]   # another checkout's client/, to compare

To compare with another version of the sidecar too, run this file from that checkout
(``git archive <rev> | tar -x -C DIR``, copy this file to DIR/bench/, run it there).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.receivers import Receiver
from tests.sidecar_process import SidecarProcess

REPO = Path(__file__).resolve().parents[1]

RUN = "nan-overtakes"

SCRIPT = """
import os, sys, time
import monitor_client
mon = monitor_client.Monitor(url=os.environ["URL"], run_id="nan-overtakes",
                             settings=monitor_client.MonitorSettings(
                                 spool_dir=os.environ["SPOOL"], linger=0.05,
                                 max_queue=int(os.environ["MAXQ"])))
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
    r = httpx.get(f"{url}/v1/runs/{RUN}/records",
                  params={"since_step": step, "limit": 1, "kind": "step"}, timeout=10)
    found = r.json()["records"] if r.status_code == 200 else []
    return bool(found) and found[0]["step"] == step  # oldest first from since_step


@dataclass
class Timings:
    """Seconds after the sidecar was ready again."""

    page: float | None
    nan_stored: float | None
    all_stored: float | None
    overtaken: int


def _paged(pd: Receiver) -> bool:
    return any(r.json.get("event_action") == "trigger"
               and r.json["payload"]["custom_details"]["run_id"] == RUN for r in pd.accepted())


def _overtaken(data_dir: Path) -> int:
    """Steps stored after a later step of the run (row ids increase with arrival): what the
    sidecar counted late and its detectors never saw."""
    with sqlite3.connect(data_dir / "monitor.sqlite") as db:
        steps = [s for (s,) in db.execute("SELECT step FROM records WHERE run_id = ? AND "
                                          "kind = 'step' ORDER BY id", (RUN,))]
    latest, late = -1, 0
    for step in steps:
        late += step < latest
        latest = max(latest, step)
    return late


def _config(tmp: Path, pd: Receiver) -> Path:
    config = tmp / "config.yaml"
    config.write_text("alerting:\n  group_wait_seconds: 0.05\n"
                      "  pagerduty: {routing_key: k-0123456789abcdef0123456789abcd, "
                      f"url: '{pd.url}/v2/enqueue'}}\n")
    return config


def measure(client: Path, backlog: int, pad: int, outage: float,
            max_queue: int = 10_000) -> Timings:
    with tempfile.TemporaryDirectory() as tmp, Receiver("pagerduty") as pd:
        sc = SidecarProcess(Path(tmp) / "sidecar", config=_config(Path(tmp), pd)).start()
        env = {**os.environ, "PYTHONPATH": str(client), "URL": sc.url, "PAD": str(pad),
               "BACKLOG": str(backlog), "MAXQ": str(max_queue), "SPOOL": str(Path(tmp) / "spool")}
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
            page_at = nan_at = everything_at = None
            while None in (page_at, everything_at) and time.monotonic() - t_up < 600:
                if page_at is None and _paged(pd):
                    page_at = time.monotonic() - t_up
                if nan_at is None and _stored(sc.url, nan_step):
                    nan_at = time.monotonic() - t_up
                if everything_at is None and nan_at is not None and _stored(sc.url,
                                                                             nan_step - 1):
                    everything_at = time.monotonic() - t_up
                time.sleep(0.02)
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(600)
            return Timings(page_at, nan_at, everything_at, _overtaken(sc.data_dir))
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
    ap.add_argument("--max-queue", type=int, default=10_000,
                    help="the client's max_queue (a backlog logged faster than the sender "
                         "spools it waits in an overflow as long again, see _sender.py)")
    args = ap.parse_args()
    t = measure(args.client, args.backlog, args.pad, args.outage, args.max_queue)
    print(f"client {args.client}, sidecar {REPO}: backlog {args.backlog} x {args.pad} B, "
          f"max_queue {args.max_queue}, outage {args.outage:g} s -> after the sidecar was back: page at the receiver "
          f"{_s(t.page)}, NaN step stored {_s(t.nan_stored)}, whole backlog stored "
          f"{_s(t.all_stored)}; steps stored after a later step (late, never analysed): "
          f"{t.overtaken}")


def _s(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.2f} s"


if __name__ == "__main__":
    main()
