"""Ingest throughput and latency: the sidecar vs Prometheus Pushgateway, same samples, same run.

Payload: a GPT-2-small-shaped run (~150 parameter tensors x 7 layer stats per step plus
the scalars), batches of 10 steps (gzip NDJSON, as the client sends them), from 1 and 8
concurrent clients. Pushgateway gets the very same samples in its text format, one push per
step (it keeps one value per series, so a step is the natural push). Prints records/s,
samples/s, p50/p99 latency and the ratio.

    python -m bench.ingest [--seconds 10] [--clients 1 8]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

from monitor_agent.records import wire
from tests.sidecar_process import SidecarProcess, free_port

N_TENSORS = 148  # GPT-2 small: wte, wpe, 12 blocks x 12 tensors, ln_f weight/bias
LAYER_STATS = ("grad_norm", "grad_mean", "grad_std", "grad_max_abs", "grad_zero_frac",
               "param_norm", "update_norm")
SCALARS = ("loss", "lr", "grad_norm", "clip_threshold", "param_norm", "update_norm", "tokens",
           "samples", "step_time", "data_time", "tokens_per_second", "mfu")
BATCH = 10


def layer_names() -> list[str]:
    names = ["wte.weight", "wpe.weight"]
    for b in range(12):
        for t in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"):
            names.append(f"h.{b}.{t}")
    return names + ["ln_f.weight", "ln_f.bias"][: N_TENSORS - len(names)]


NAMES = layer_names()
SAMPLES_PER_STEP = len(NAMES) * len(LAYER_STATS) + len(SCALARS)


LAYERS = {n: {s: 0.001 * (i + 1) + j * 1e-5 for j, s in enumerate(LAYER_STATS)}
          for i, n in enumerate(NAMES)}


def step_record(run_id: str, step: int) -> dict:
    layers = LAYERS
    rec = {"kind": "step", "run_id": run_id, "step": step, "time": time.time(), "layers": layers}
    rec.update({s: 1.0 + step * 1e-3 for s in SCALARS})
    return rec


def sidecar_bodies(client: int, count: int) -> list[bytes]:
    bodies = []
    for i in range(count):
        recs = [step_record(f"bench-{client}", i * BATCH + k) for k in range(BATCH)]
        bodies.append(gzip.compress(b"\n".join(wire.dumps(r) for r in recs), 1))
    return bodies


def pushgateway_bodies(client: int, count: int) -> list[bytes]:
    bodies = []
    for step in range(count):
        lines = [f"training_{s} {1.0 + step * 1e-3}" for s in SCALARS]
        for i, n in enumerate(NAMES):
            lines += [f'training_layer_{s}{{layer="{n}"}} {0.001 * (i + 1)}' for s in LAYER_STATS]
        bodies.append(("\n".join(lines) + "\n").encode())
    return bodies


def drive(url_for, bodies_per_client, headers, seconds: float, per_body_records: int):
    """Each client thread posts its own bodies back to back for ``seconds``."""
    latencies: list[float] = []
    done = [0] * len(bodies_per_client)
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def worker(idx: int) -> None:
        local = []
        with httpx.Client(timeout=30) as http:
            for body in bodies_per_client[idx]:
                if time.perf_counter() >= stop_at:
                    break
                t0 = time.perf_counter()
                r = http.request("PUT" if "job" in url_for(idx, 0) else "POST",
                                 url_for(idx, done[idx]), content=body, headers=headers)
                local.append(time.perf_counter() - t0)
                if r.status_code >= 300:
                    raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
                done[idx] += 1
        with lock:
            latencies.extend(local)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(bodies_per_client))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    records = sum(done) * per_body_records
    lat = sorted(latencies)
    return {
        "records_s": records / elapsed,
        "samples_s": records * SAMPLES_PER_STEP / elapsed,
        "p50_ms": 1e3 * statistics.median(lat),
        "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "requests": len(lat),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    pg_port = free_port()
    pg = None
    if shutil.which("prometheus-pushgateway"):
        pg = subprocess.Popen(["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{pg_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sc = SidecarProcess(tmp / "data", env={"MONITOR_AGENT_LOG_LEVEL": "warning"}).start()
    print(f"payload: {len(NAMES)} tensors x {len(LAYER_STATS)} stats + {len(SCALARS)} scalars "
          f"= {SAMPLES_PER_STEP} samples/step; sidecar batches of {BATCH} steps (gzip ndjson)")
    print(f"{'target':12} {'clients':>7} {'records/s':>10} {'samples/s':>11} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'requests':>8}")
    try:
        time.sleep(1.0)
        for clients in args.clients:
            per = int(args.seconds * 1000 / BATCH / clients) + 10
            bodies = [sidecar_bodies(c + 100 * clients, per) for c in range(clients)]
            ours = drive(lambda i, k: sc.url + "/v1/records", bodies,
                         {"content-type": "application/x-ndjson", "content-encoding": "gzip"},
                         args.seconds, BATCH)
            _row("sidecar", clients, ours)
            if pg is not None:
                pbodies = [pushgateway_bodies(c, int(args.seconds * 2000 / clients) + 10)
                           for c in range(clients)]
                theirs = drive(
                    lambda i, k: f"http://127.0.0.1:{pg_port}/metrics/job/train/instance/run{i}",
                    pbodies, {"content-type": "text/plain; version=0.0.4"}, args.seconds, 1)
                _row("pushgateway", clients, theirs)
                print(f"{'ratio':12} {clients:>7} samples/s sidecar/pushgateway = "
                      f"{ours['samples_s'] / theirs['samples_s']:.2f}x")
    finally:
        sc.stop()
        if pg is not None:
            pg.terminate()
            pg.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)


def _row(name: str, clients: int, r: dict) -> None:
    print(f"{name:12} {clients:>7} {r['records_s']:>10.0f} {r['samples_s']:>11.0f} "
          f"{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['requests']:>8}")


if __name__ == "__main__":
    main()
