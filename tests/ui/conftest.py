"""Browser fixtures: one headless Chromium for the whole session, and a sidecar fed with a
real trace (left running: no end record, so its alerts still fire and live steps land).

Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them); the driver path
is passed explicitly so Selenium Manager never downloads anything.
"""

from __future__ import annotations

import copy
import gzip
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from live_server import LiveServer
from monitor_agent.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests" / "traces" / "activation_blowup_gpt.jsonl.gz"
CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
TOKEN = "ui-test-token"


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not (CHROMIUM.is_file() and DRIVER.is_file()):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,3000", "--hide-scrollbars"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(str(DRIVER)))
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
        res = httpx.get(self.url + path, headers=self.headers, timeout=30)
        res.raise_for_status()
        return res.json()

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
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        res = httpx.get(f"{run.url}/v1/runs/{run.run_id}/series?points=10&rank=1", timeout=10)
        if res.status_code == 200 and res.json()["range"][1] == run.last_step:
            return
        time.sleep(0.1)
    raise AssertionError("the chart history never caught up with the fed records")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where a test leaves its screenshots (kept with pytest's tmp dirs)."""
    path = tmp_path / "screenshots"
    path.mkdir()
    return path
