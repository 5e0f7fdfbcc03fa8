"""How many ranks one node's sidecar holds, and what a 1,024-GPU job costs Prometheus.

Records are the real client's: a ``monitor_client.Monitor`` with its defaults
(``layer_stats_every=25``, ``hist_every=50``) watches a 150-tensor model for 50 steps against
a capture server, and its plain, per-layer and distribution step records become templates.
Then one real sidecar (detectors on, default settings) gets R ranks of one run, each
posting one step a second as a client does (``linger`` 0.5 s: one record per POST, gzip
NDJSON), every rank at the same instant as after an all-reduce, so the per-layer and
distribution steps arrive as the bursts they are in a real job. R doubles until the load
falls behind (``late99``: p99 delay of a send past its second) or ``--max-ranks``; the
answer is the largest R whose p99 ingest latency stays under ``--p99-ms`` (100). Per
level, each on a fresh sidecar: ingest p50/p99 (all records; plain steps alone; the
slowest record of the per-layer and distribution bursts), the sidecar's CPU (cores) and
RSS, /metrics size, series and fetch time as a scrape every ``--scrape`` seconds sees them,
the load generator's own CPU (``gen cpu``), and the service time of one record of each
kind posted alone after the level (a burst of R records waits about R of them).

Last, the sizing of a job of ``--nodes`` nodes x ``--ranks-per-node`` ranks (128 x 8):
per-node CPU, memory and series from the level with that many ranks, and the series at the
central Prometheus with and without the per-layer drop rule of deploy/kubernetes/README.md.

    python -m bench.cluster_load [--seconds 35] [--max-ranks 256]

Latency includes the load generator's own scheduling (same machine, same cores).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from monitor_agent.records import wire
from tests.sidecar_process import SidecarProcess

TOKEN = "bench-token"
HEADERS = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip",
           "Authorization": f"Bearer {TOKEN}"}
PER_LAYER = b"training_layer_"
# Measured steps start here so that a default 35 s level holds the client's per-layer step
# 26 and its per-layer + distribution step 51: the two bursts that set p99.
FIRST_STEP = 20


def capture_client_records(tensors: int = 150, steps: int = 50) -> list[dict[str, Any]]:
    """What the real client sends for ``steps`` steps of a ``tensors``-tensor model."""
    import torch

    from monitor_client import Monitor, MonitorSettings

    got: list[dict[str, Any]] = []

    class Capture(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = gzip.decompress(self.rfile.read(int(self.headers["Content-Length"])))
            got.extend(orjson.loads(line) for line in body.splitlines() if line.strip())
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def do_GET(self) -> None:  # noqa: N802 (the client polls for actions)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"actions": []}')

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    class Wide(torch.nn.Module):  # parallel layers: every tensor gets a healthy gradient
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(tensors // 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return sum(block(x) for block in self.blocks)

    torch.manual_seed(0)
    model = Wide()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tempfile.TemporaryDirectory() as spool:
        mon = Monitor(f"http://127.0.0.1:{server.server_address[1]}", "bench", run_id="capture",
                      settings=MonitorSettings(rank=0, world_size=1, spool_dir=spool,
                                               install_hooks=False))
        mon.watch(model, opt, grad_clip=1.0)
        for step in range(1, steps + 1):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log_step(step, loss=loss, tokens=8 * 16, compute_time=0.2, sync_wait_time=0.01)
        mon.close()
    server.shutdown()
    return got


class Templates:
    """The captured records by kind of step; ``record`` makes rank r's step s from them."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.run = next(r for r in records if r["kind"] == "run")
        steps = [r for r in records if r["kind"] == "step"]
        self.plain = next(r for r in steps if not r.get("layers"))
        self.layers = next(r for r in steps if r.get("layers") and not _has_hist(r))
        self.hist = next((r for r in steps if _has_hist(r)), self.layers)
        self.every = self.run["config"].get("layer_stats_every", 25)
        self.hist_every = self.run["config"].get("hist_every", 50) or 10**9

    def sizes(self) -> dict[str, int]:
        return {k: len(wire.dumps(getattr(self, k))) for k in ("plain", "layers", "hist")}

    def record(self, run_id: str, rank: int, step: int, world: int) -> dict[str, Any]:
        return {**getattr(self, self.kind(step)), "run_id": run_id, "rank": rank, "step": step, "time": time.time(),
                "loss": 2.0 + ((rank * 7 + step) % 11) / 1000}

    def kind(self, step: int) -> str:
        """The client's cadence (steps 1, 26, 51, ...), the same step on every rank."""
        if step % self.hist_every == 1:
            return "hist"
        return "layers" if step % self.every == 1 else "plain"

    def run_record(self, run_id: str, rank: int, world: int) -> dict[str, Any]:
        hardware = {**self.run.get("hardware", {}), "rank": rank, "world_size": world}
        return {**self.run, "run_id": run_id, "rank": rank, "time": time.time(),
                "hardware": hardware}


def _has_hist(rec: dict[str, Any]) -> bool:
    return "grad_hist" in rec or "param_hist" in rec


def body(records: list[dict[str, Any]]) -> bytes:
    return gzip.compress(b"\n".join(wire.dumps(r) for r in records) + b"\n", 1)


async def level(url: str, tpl: Templates, ranks: int, seconds: float, scrape_every: float,
                proc: psutil.Process) -> dict[str, Any]:
    run_id = f"job-{ranks}"
    latencies: list[tuple[str, float]] = []
    lateness: list[float] = []
    scrapes: list[tuple[float, int, int, int]] = []
    failures = 0
    limits = httpx.Limits(max_connections=ranks + 4, max_keepalive_connections=ranks + 4)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        # Warm-up, untimed: every rank's run record and one per-layer + distribution step,
        # so /metrics holds every series a steady job exposes.
        await asyncio.gather(*(http.post(url + "/v1/records", headers=HEADERS, content=body(
            [tpl.run_record(run_id, r, ranks), {**tpl.record(run_id, r, 1, ranks),
                                                **_with(tpl.hist)}])) for r in range(ranks)))
        await asyncio.sleep(2.0)  # let the warm-up's distribution records settle
        me = psutil.Process()
        cpu0, gen0, t0 = proc.cpu_times(), me.cpu_times(), time.perf_counter()

        async def rank_loop(rank: int) -> None:
            # One step a second, every rank at once as after an all-reduce; lateness says
            # whether the load generator kept up.
            nonlocal failures
            for step in range(FIRST_STEP, FIRST_STEP + int(seconds)):
                due = t0 + (step - FIRST_STEP)
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                start = time.perf_counter()
                lateness.append(start - due)
                ok = await _post(http, url, body([tpl.record(run_id, rank, step, ranks)]))
                latencies.append((tpl.kind(step), time.perf_counter() - start))
                failures += not ok

        async def scraper() -> None:
            while time.perf_counter() < t0 + seconds:
                start = time.perf_counter()
                text = (await http.get(url + "/metrics")).content
                took = time.perf_counter() - start
                series = [ln for ln in text.split(b"\n") if ln and not ln.startswith(b"#")]
                scrapes.append((took, len(text), len(series),
                                sum(ln.startswith(PER_LAYER) for ln in series)))
                await asyncio.sleep(min(scrape_every, max(0.0, t0 + seconds - time.perf_counter())))

        await asyncio.gather(scraper(), *(rank_loop(r) for r in range(ranks)))
        wall = time.perf_counter() - t0
        cpu1, gen1 = proc.cpu_times(), me.cpu_times()
        after = FIRST_STEP + int(seconds)
        service = {kind: await _service_ms(http, url, tpl, run_id, kind, after + 10 * i)
                   for i, kind in enumerate(("plain", "layers", "hist"))}
    lat = sorted(t for _, t in latencies)
    plain = sorted(t for kind, t in latencies if kind == "plain")
    burst = [t for kind, t in latencies if kind != "plain"]
    return {
        "plain_p99_ms": 1e3 * plain[int(0.99 * (len(plain) - 1))],
        "burst_max_ms": 1e3 * max(burst, default=0.0),
        "ranks": ranks, "steps_s": len(lat) / seconds, "service": service, "failures": failures,
        "late_ms": 1e3 * sorted(lateness)[int(0.99 * (len(lateness) - 1))],
        "gen_cpu": (gen1.user + gen1.system - gen0.user - gen0.system) / wall,
        "p50_ms": 1e3 * statistics.median(lat), "p99_ms": 1e3 * lat[int(0.99 * (len(lat) - 1))],
        "cpu": (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall,
        "rss_mb": proc.memory_info().rss / 2**20,
        "scrape_ms": 1e3 * max(s[0] for s in scrapes), "metrics_kb": scrapes[-1][1] / 1024,
        "series": scrapes[-1][2], "layer_series": scrapes[-1][3],
    }


async def _post(http: httpx.AsyncClient, url: str, content: bytes) -> bool:
    """POST once more after a dropped keep-alive connection, as the client's sender does."""
    for attempt in (1, 2):
        try:
            resp = await http.post(url + "/v1/records", headers=HEADERS, content=content)
            return resp.status_code == 200
        except httpx.TransportError:
            if attempt == 2:
                return False
    return False


async def _service_ms(http: httpx.AsyncClient, url: str, tpl: Templates, run_id: str,
                      kind: str, step: int, repeat: int = 5) -> float:
    """Median latency of one ``kind`` record of rank 0 posted alone: the service time."""
    took = []
    for k in range(repeat):
        rec = {**getattr(tpl, kind), "run_id": run_id, "rank": 0, "step": step + k,
               "time": time.time()}
        start = time.perf_counter()
        await http.post(url + "/v1/records", headers=HEADERS, content=body([rec]))
        took.append(time.perf_counter() - start)
    return 1e3 * statistics.median(took)


def _with(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k in ("layers", "grad_hist", "param_hist")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=35.0, help="measured time per level")
    ap.add_argument("--start-ranks", type=int, default=8)
    ap.add_argument("--max-ranks", type=int, default=256)
    ap.add_argument("--p99-ms", type=float, default=100.0)
    ap.add_argument("--scrape", type=float, default=15.0,
                    help="seconds between /metrics reads (the deploy configs' scrape interval)")
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    args = ap.parse_args()

    tpl = Templates(capture_client_records())
    layers = len(tpl.layers["layers"])
    print(f"client records (150-tensor model, client defaults: layer stats every {tpl.every}, "
          f"distributions every {tpl.hist_every} steps): {layers} layers; bytes per record "
          + ", ".join(f"{k} {v}" for k, v in tpl.sizes().items()))
    print(f"machine: {psutil.cpu_count()} cores, load average "
          + " ".join(f"{x:.1f}" for x in psutil.getloadavg()))
    print(f"{'ranks':>5} {'steps/s':>8} {'late99':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'plain99':>7} {'burst':>7} {'cpu':>5} {'rss MB':>7} {'/metrics KB':>11} "
          f"{'series':>7} {'layer':>7} {'scrape ms':>9} {'gen cpu':>7}  service ms")
    rows = []
    ranks = args.start_ranks
    while ranks <= args.max_ranks:
        row = one_level(tpl, ranks, args)
        rows.append(row)
        print(f"{row['ranks']:>5} {row['steps_s']:>8.1f} {row['late_ms']:>7.0f} "
              f"{row['p50_ms']:>7.1f} {row['p99_ms']:>7.1f} {row['plain_p99_ms']:>7.1f} "
              f"{row['burst_max_ms']:>7.1f} {row['cpu']:>5.2f} "
              f"{row['rss_mb']:>7.0f} {row['metrics_kb']:>11.0f} {row['series']:>7} "
              f"{row['layer_series']:>7} {row['scrape_ms']:>9.1f} {row['gen_cpu']:>7.2f}  "
              + " ".join(f"{k} {v:.0f}" for k, v in row["service"].items()), flush=True)
        if row["late_ms"] > 1000 or row["failures"]:
            break  # the sidecar (or this machine) no longer keeps 1 step/s
        ranks *= 2
    held = [r for r in rows if r["p99_ms"] <= args.p99_ms and r["late_ms"] <= 1000
            and not r["failures"]]
    print(f"\nheld at 1 step/s per rank with p99 <= {args.p99_ms:.0f} ms: "
          f"{held[-1]['ranks'] if held else 0} ranks x {layers} layers")
    median = [r for r in rows if r["p50_ms"] <= args.p99_ms and r["late_ms"] <= 1000]
    print(f"with p50 <= {args.p99_ms:.0f} ms: {median[-1]['ranks'] if median else 0} ranks")
    sizing(rows, args.nodes, args.ranks_per_node, layers)


def one_level(tpl: Templates, ranks: int, args: argparse.Namespace) -> dict[str, Any]:
    """A fresh sidecar per level, so memory and series are that level's alone."""
    with tempfile.TemporaryDirectory() as tmp:
        sidecar = SidecarProcess(Path(tmp) / "data", env={"MONITOR_AGENT_TOKEN": TOKEN,
                                                          "MONITOR_AGENT_LOG_LEVEL": "warning"})
        sidecar.start()
        try:
            proc = psutil.Process(sidecar.proc.pid)
            return asyncio.run(level(sidecar.url, tpl, ranks, args.seconds, args.scrape, proc))
        finally:
            sidecar.stop()


def sizing(rows: list[dict[str, Any]], nodes: int, per_node: int, layers: int) -> None:
    node = next((r for r in rows if r["ranks"] == per_node), None)
    if node is None:
        print(f"no level with {per_node} ranks: run with --start-ranks {per_node}")
        return
    total, layer = node["series"], node["layer_series"]
    print(f"\n{nodes} nodes x {per_node} ranks = {nodes * per_node} GPUs, {layers} layers:")
    print(f"  per node: sidecar {node['cpu']:.2f} cores, {node['rss_mb']:.0f} MB RSS, "
          f"{total} series ({layer} per-layer), /metrics {node['metrics_kb']:.0f} KB")
    print(f"  central Prometheus: {nodes * total:,} series; with the per-layer drop rule "
          f"{nodes * (total - layer):,}")


if __name__ == "__main__":
    main()
