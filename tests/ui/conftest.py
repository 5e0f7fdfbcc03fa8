"""Browser fixtures: one headless Chromium for the whole session, and a sidecar fed with a
real trace (left running: no end record, so its alerts still fire and live steps land).

Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them); the driver path
is passed explicitly so Selenium Manager never downloads anything.
"""

from __future__ import annotations

import copy
import gzip
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests" / "traces" / "activation_blowup_gpt.jsonl.gz"
TOKEN = "ui-test-token"


def read_json(url: str, headers: dict[str, str]) -> dict:
    """GET as a client should: the browser's own reads may hold every large-read slot, and
    the sidecar sheds this one with 503 + Retry-After, which the pages honour too."""
    for _ in range(10):
        res = httpx.get(url, headers=headers, timeout=30)
        if res.status_code != 503 or "Retry-After" not in res.headers:
            break
        time.sleep(float(res.headers["Retry-After"]))
    res.raise_for_status()
    return res.json()



@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("needs Debian's chromium and chromium-driver on PATH (.ci/run installs "
                    "them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,3000", "--hide-scrollbars"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@dataclass
class FedRun:
    url: str
    run_id: str
    last_step: int
    headers: dict[str, str]

    def get(self, path: str) -> dict:
        return read_json(self.url + path, self.headers)

    def post_records(self, records: list[dict]) -> None:
        body = b"\n".join(orjson.dumps(r) for r in records)
        res = httpx.post(self.url + "/v1/records", content=body, timeout=60,
                         headers={**self.headers, "content-type": "application/x-ndjson"})
        assert res.status_code < 300, res.text


def trace_records() -> list[dict]:
    with gzip.open(TRACE, "rb") as fh:
        return [orjson.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="session")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FedRun]:
    """A sidecar (token required for writes) holding the trace plus a second, slower rank."""
    data = tmp_path_factory.mktemp("ui-sidecar")
    settings = load_settings(data_dir=data, token=TOKEN)
    records = [r for r in trace_records() if r["kind"] != "end"]
    steps = [r for r in records if r["kind"] == "step"]
    rank1 = []
    for r in steps:
        twin = copy.deepcopy({k: r[k] for k in ("kind", "run_id", "step", "time", "loss",
                                                 "step_time") if k in r})
        twin["rank"] = 1
        twin["step_time"] = (r.get("step_time") or 0.02) * 1.3
        rank1.append(twin)
    with LiveServer(settings) as srv:
        run = FedRun(srv.url, records[0]["run_id"], steps[-1]["step"],
                     {"Authorization": f"Bearer {TOKEN}"})
        for i in range(0, len(records), 40):
            run.post_records(records[i:i + 40])
        run.post_records(rank1)
        _wait_indexed(run)
        yield run


def _wait_indexed(run: FedRun) -> None:
    def caught_up() -> None:
        res = httpx.get(f"{run.url}/v1/runs/{run.run_id}/series?points=10&rank=1", timeout=10)
        assert res.status_code == 200 and res.json()["range"][1] == run.last_step, res.text[:200]

    eventually(caught_up, timeout=30, interval=0.1,
               what="the chart history caught up with the fed records")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where a test leaves its screenshots (kept with pytest's tmp dirs)."""
    path = tmp_path / "screenshots"
    path.mkdir()
    return path


LAYERS_27 = [f"h.{i // 3}.{p}" for i, p in enumerate(["attn.weight", "mlp.weight", "ln.weight"] * 9)]


def lr_run_records(run_id: str, *, jump_at: int | None = None, noise: float = 0.05,
                   steps: int = 600, seed: int = 0) -> list[dict]:
    """A nanoGPT-like run: config/model/hardware maps, loss, lr, grad norm, update norm,
    tokens/s (every 100th step an eval step at a tenth of the rate), MFU, memory, the
    script's own scalars (``metrics``: accuracy, perplexity) and evals with a metric. With
    ``jump_at`` the learning rate goes x100 there and the loss diverges to NaN."""
    import math
    import random

    rnd = random.Random(seed)
    out: list[dict] = [{
        "kind": "run", "run_id": run_id, "time": 1.0, "labels": {"project": "lr-study"},
        "config": {"learning_rate": 6e-4, "batch_size": 12, "warmup_steps": 20,
                   "total_steps": steps, "optimizer": {"name": "adamw", "betas": [0.9, 0.95]},
                   "note": "<script>alert('x')</script>"},
        "model": {"n_layer": 9, "n_embd": 384, "layer_order": LAYERS_27},
        "hardware": {"gpu": "NVIDIA H100 80GB HBM3", "gpus": 1}}]
    loss = 10.0
    for s in range(1, steps + 1):
        lr = 6e-4 * min(1.0, s / 20) * (100 if jump_at and s >= jump_at else 1)
        if jump_at and s >= jump_at + 9:
            loss = loss * 1.6 if math.isfinite(loss) and loss < 1e6 else float("nan")
        else:
            loss = 2.0 + 8.0 * math.exp(-s / 120) + rnd.gauss(0, noise)
        slow = s % 100 == 0
        rec = {"kind": "step", "run_id": run_id, "step": s, "time": 1.0 + s, "loss": loss,
               "lr": lr, "grad_norm": abs(rnd.gauss(1.0, 0.1)) * (50 if jump_at and s > jump_at else 1),
               "param_norm": 100.0, "update_norm": 0.02 * (1 + rnd.random() / 5),
               "tokens_per_second": (4.5e3 if slow else 4.5e4) * (1 + rnd.gauss(0, 0.01)),
               "mfu": 0.38, "step_time": 0.2, "metrics": {
                   "accuracy": min(1.0, s / steps + rnd.gauss(0, .01)),
                   "perplexity": math.exp(min(loss, 20)) if math.isfinite(loss) else loss},
               "memory": {"allocated_bytes": 2.1e10, "reserved_bytes": 2.4e10}}
        if not math.isfinite(loss):  # spelled out: JSON has no NaN
            rec["loss"] = rec["metrics"]["perplexity"] = "NaN"
        if s % 10 == 0:
            rec["layers"] = {n: {"grad_norm": rnd.random(), "param_norm": 10.0,
                                 "update_norm": 0.01 * rnd.random()} for n in LAYERS_27}
        out.append(rec)
        if s % 100 == 0:
            out.append({"kind": "eval", "run_id": run_id, "step": s, "time": 1.0 + s,
                        "val_loss": rec["loss"], "metrics": {"bleu": s / 30}})
    return out


@dataclass
class LrRuns:
    url: str
    run_ids: list[str]
    headers: dict[str, str]

    def get(self, path: str) -> dict:
        return read_json(self.url + path, self.headers)


@pytest.fixture(scope="session")
def lr_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LrRuns]:
    """A sidecar holding three runs of one study: a baseline, the same run with the learning
    rate x100 at step 300 (it diverges, then goes NaN), and a noisier rerun."""
    settings = load_settings(data_dir=tmp_path_factory.mktemp("lr-runs"), token=TOKEN)
    runs = {"baseline": lr_run_records("baseline"),
            "lr-x100": lr_run_records("lr-x100", jump_at=300, seed=1),
            "rerun": lr_run_records("rerun", noise=0.15, seed=2)}
    with LiveServer(settings) as srv:
        fed = LrRuns(srv.url, list(runs), {"Authorization": f"Bearer {TOKEN}"})
        for records in runs.values():
            for i in range(0, len(records), 100):
                body = b"\n".join(orjson.dumps(r) for r in records[i:i + 100])
                res = httpx.post(srv.url + "/v1/records", content=body, timeout=60, headers={
                    **fed.headers, "content-type": "application/x-ndjson"})
                assert res.status_code < 300, res.text
        def caught_up() -> None:
            counts = [httpx.get(f"{srv.url}/v1/runs/{r}/series?points=10", timeout=10)
                      for r in runs]
            assert all(c.status_code == 200 and c.json()["range"][1] == 600 for c in counts)

        eventually(caught_up, timeout=30, interval=0.1, what="the three runs' chart history")
        yield fed
