"""Web UI speed: the series endpoint and the run page's load at 10k/100k/200k steps.

Each run is written straight into a sidecar's store in bulk (real record bodies, as the
client sends them: 150 layers of stats every ``--layer-every`` steps, gradient quantiles
every ``--hist-every``, activations of 50 modules, an eval with per-category losses every
500 steps), folded into the chart history by the real indexer (timed), then served by a
real sidecar: the endpoints are timed over HTTP and the page in headless Chromium, from
navigation to every chart and heatmap drawn.

Example::

    python -m bench.ui                       # 10k, 100k, 200k steps
    python -m bench.ui --steps 20000 --layer-every 1
"""

from __future__ import annotations

import argparse
import math
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from monitor_agent.history.indexer import HistoryIndexer
from monitor_agent.serving.embedded import EmbeddedServer, free_port
from monitor_agent.settings import load_settings
from monitor_agent.storage.database import Database
from monitor_agent.storage.store import RecordRow, Store

LAYERS = [f"blocks.{i // 6}.{p}" for i, p in
          enumerate(["attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "mlp.fc.weight",
                     "mlp.fc.bias", "mlp.proj.weight"] * 25)]
MODULES = [f"blocks.{i}.mlp.act" for i in range(50)]


def records(run_id: str, steps: int, layer_every: int, hist_every: int):
    rnd = random.Random(0)
    yield {"kind": "run", "run_id": run_id, "time": 0.0,
           "config": {"warmup_steps": 500, "total_steps": steps},
           "model": {"layer_order": LAYERS}, "labels": {"project": "bench"}}
    for s in range(1, steps + 1):
        loss = 2 + 3 * math.exp(-s / (steps / 5)) + rnd.gauss(0, 0.05)
        rec = {"kind": "step", "run_id": run_id, "step": s, "time": float(s), "loss": loss,
               "lr": 3e-4, "grad_norm": abs(rnd.gauss(1, 0.2)), "clip_threshold": 1.0,
               "tokens_per_second": 5e4 + rnd.gauss(0, 1e3), "mfu": 0.4, "step_time": 0.1,
               "memory": {"allocated_bytes": 2e10, "reserved_bytes": 2.2e10,
                          "peak_allocated_bytes": 2.1e10}}
        if s % layer_every == 0:
            rec["param_norm"], rec["update_norm"] = 100.0, 0.05
            rec["layers"] = {n: {"grad_norm": rnd.random(), "param_norm": 10.0,
                                 "update_norm": 0.01 * rnd.random()} for n in LAYERS}
            rec["activations"] = {m: {"mean": 0.1, "std": 1.0, "max_abs": 5 + rnd.random(),
                                      "zero_frac": 0.5} for m in MODULES}
        if s % hist_every == 0:
            rec["grad_hist"] = {n: {"edges": [-1, 0, 1], "counts": [5, 5],
                                    "quantiles": [-1, -.5, -.1, 0, .1, .5, .9, 1]}
                                for n in LAYERS}
        yield rec
        if s % 500 == 0:
            yield {"kind": "eval", "run_id": run_id, "step": s, "time": float(s),
                   "val_loss": loss, "metrics": {f"loss/c{i}": loss + i / 10 for i in range(5)}}


def feed(data: Path, run_id: str, steps: int, layer_every: int, hist_every: int) -> float:
    """Bulk insert into the store; returns the size in bytes."""
    store = Store(data / "monitor.sqlite")
    batch: list[RecordRow] = []
    for rec in records(run_id, steps, layer_every, hist_every):
        batch.append(RecordRow(run_id, 0, rec["kind"], rec.get("step", -1), rec["time"],
                               orjson.dumps(rec)))
        if len(batch) == 5000:
            store.insert_records(batch)
            batch = []
    store.insert_records(batch)
    store.close()
    # A finished run seen long ago: the sidecar serves its history without reloading it.
    db = sqlite3.connect(data / "monitor.sqlite")
    db.execute("UPDATE runs SET status = 'completed', last_seen = 0, first_seen = 0")
    db.commit()
    db.close()
    return (data / "monitor.sqlite").stat().st_size


def index(data: Path) -> float:
    indexer = HistoryIndexer(data / "monitor.sqlite", data / "history.sqlite", 0.99, 0)
    src = Database(data / "monitor.sqlite", (), readonly=True)
    t0 = time.perf_counter()
    while indexer.catch_up(src):
        pass
    elapsed = time.perf_counter() - t0
    src.close()
    indexer.builder.db.close()
    return elapsed


def timed_get(client: httpx.Client, path: str, repeat: int = 5) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = client.get(path)
        times.append(time.perf_counter() - t0)
        res.raise_for_status()
        size = len(res.content)
    return statistics.median(times), size


def page_load(url: str) -> float:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,3000"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service("/usr/bin/chromedriver"))
    try:
        loads = []
        for _ in range(3):
            driver.get(url)
            WebDriverWait(driver, 60, poll_frequency=0.01).until(lambda d: d.execute_script(
                "if (document.body.dataset.loaded === '1' && window.runPage.heats.heat_grad "
                "&& !window.__t) window.__t = performance.now(); return window.__t"))
            loads.append(driver.execute_script("return window.__t") / 1000)
        return statistics.median(loads)
    finally:
        driver.quit()


def bench(steps: int, layer_every: int, hist_every: int, browser: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        data, run_id = Path(tmp), f"bench-{steps}"
        t0 = time.perf_counter()
        size = feed(data, run_id, steps, layer_every, hist_every)
        fed = time.perf_counter() - t0
        indexed = index(data)
        hist = (data / "history.sqlite").stat().st_size
        print(f"\n{steps:,} steps x {len(LAYERS)} layers (layers every {layer_every}, "
              f"quantiles every {hist_every}): store {size / 2**20:.0f} MiB (fed in {fed:.1f} s),"
              f" history {hist / 2**20:.0f} MiB, indexed in {indexed:.1f} s "
              f"({steps / indexed:,.0f} steps/s)")
        settings = load_settings(data_dir=data, port=free_port())
        with EmbeddedServer(settings) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
            base = f"/v1/runs/{run_id}"
            for label, path in [
                ("series, whole run, 1000 points", f"{base}/series?points=1000"),
                ("series, 5% zoom, 1000 points",
                 f"{base}/series?points=1000&start={steps // 2}&end={steps // 2 + steps // 20}"),
                ("grad-norm matrix, 150 x 1000", f"{base}/matrix/grad_norm?points=1000"),
                ("update-ratio matrix, 150 x 1000", f"{base}/matrix/update_ratio?points=1000"),
                ("grad quantiles of one layer", f"{base}/matrix/grad_quantiles?points=1000"),
            ]:
                seconds, nbytes = timed_get(c, path)
                print(f"  {label:34} {seconds * 1000:7.1f} ms  {nbytes / 1024:7.0f} KiB")
            if browser:
                print(f"  {'run page, every chart drawn':34} "
                      f"{page_load(srv.url + '/runs/' + run_id) * 1000:7.1f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, nargs="+", default=[10_000, 100_000, 200_000])
    p.add_argument("--layer-every", type=int, default=25, help="client default: 25")
    p.add_argument("--hist-every", type=int, default=50, help="client default: 50")
    p.add_argument("--no-browser", action="store_true", help="skip the page load timing")
    args = p.parse_args()
    for steps in args.steps:
        bench(steps, args.layer_every, args.hist_every, not args.no_browser)


if __name__ == "__main__":
    main()
