"""What a newcomer's mistakes cost at the end of a script: close() time, log lines, spool.

Each case runs a tiny Monitor (50 steps, then ``close()``) in a fresh subprocess against a
real sidecar started with a token, and prints how long ``close()`` took, how many
``monitor_client`` log lines the script printed and how many spool files it left:

- ``ok``            right URL and token (the baseline)
- ``wrong_token``   401
- ``no_token``      401
- ``wrong_path``    URL with a path: 404
- ``no_scheme``     "127.0.0.1:PORT"
- ``down``          nothing listening (transient: retried, spooled)
- ``hung``          a port that accepts and never answers

    python -m bench.client_mistakes [--client DIR]

``--client`` points at another checkout's ``client/`` to measure it the same way (before
and after a change, in one run: ``--client /path/to/other/client``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.sidecar_process import SidecarProcess

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, logging, os, sys, time
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
import monitor_client
mon = monitor_client.Monitor(url=os.environ["URL"], token=os.environ.get("TOKEN") or None,
                             run_id="mistake", settings=monitor_client.MonitorSettings(
                                 spool_dir=os.environ["SPOOL"], linger=0.05))
for step in range(1, 51):
    mon.log_step(step, loss=1.0)
    time.sleep(0.002)
t0 = time.perf_counter()
mon.close()
print(json.dumps({"close_s": time.perf_counter() - t0}))
"""


def run_case(client: Path, url: str, token: str | None, spool: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(client), "URL": url, "TOKEN": token or "",
           "SPOOL": str(spool)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300)
    total = time.perf_counter() - t0
    close_s = json.loads(proc.stdout.strip().splitlines()[-1])["close_s"] if proc.stdout else None
    lines = [ln for ln in proc.stderr.splitlines() if "monitor_client" in ln]
    files = sum(1 for _ in spool.rglob("*.ndjson")) if spool.exists() else 0
    return {"close_s": close_s, "process_s": total, "log_lines": len(lines), "spool_files": files,
            "first_line": lines[0][:160] if lines else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--client", type=Path, default=REPO / "client")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        down_port = free.getsockname()[1]
        free.close()
        sc = SidecarProcess(Path(tmp) / "sidecar", env={"MONITOR_AGENT_TOKEN": "t0ken"}).start()
        try:
            cases = {
                "ok": (sc.url, "t0ken"),
                "wrong_token": (sc.url, "nope"),
                "no_token": (sc.url, None),
                "wrong_path": (sc.url + "/api", "t0ken"),
                "no_scheme": (sc.url.removeprefix("http://"), "t0ken"),
                "down": (f"http://127.0.0.1:{down_port}", "t0ken"),
                "hung": (f"http://127.0.0.1:{hung.getsockname()[1]}", "t0ken"),
            }
            print(f"client: {args.client}")
            print(f"{'case':12} {'close s':>8} {'process s':>10} {'log lines':>10} "
                  f"{'spool files':>12}  first log line")
            for name, (url, token) in cases.items():
                r = run_case(args.client, url, token, Path(tmp) / f"spool-{name}")
                close = f"{r['close_s']:.2f}" if r["close_s"] is not None else "-"
                print(f"{name:12} {close:>8} {r['process_s']:>10.2f} {r['log_lines']:>10} "
                      f"{r['spool_files']:>12}  {r['first_line']}")
        finally:
            sc.stop()


if __name__ == "__main__":
    main()
