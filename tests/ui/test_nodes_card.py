"""The run page's Nodes card, in a real browser: a six-rank run on three hosts posted raw to
a live sidecar, host gpu-node-2's two ranks computing 18.7 ms a step where the others take
3.2 ms (issue 44's held-out fail-slow shape), shows gpu-node-2 sick (compute-slow) and the
other two healthy; a run on one host shows no card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from ui_checks import wait

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer

RUN = "nodes-ui"


def _records(run: str, hosts: int) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = [
        {"kind": "run", "run_id": run, "rank": r, "time": 1.0,
         "labels": {"hostname": f"gpu-node-{r * hosts // 6}"},
         "hardware": {"world_size": 6, "device": "cpu"}} for r in range(6)]
    for step in range(1, 81):
        for r in range(6):
            slow = hosts > 1 and r >= 4
            compute = (0.0187 if slow else 0.0032) * (1 + 0.02 * ((step + r) % 3 - 1))
            recs.append({"kind": "step", "run_id": run, "rank": r, "step": step,
                         "time": 100.0 + step * 0.021, "loss": 2.0, "step_time": 0.021,
                         "data_time": 0.0008, "compute_time": compute,
                         "sync_wait_time": 0.021 - 0.0008 - compute})
    return recs


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with LiveServer(load_settings(data_dir=tmp_path_factory.mktemp("nodes-ui"))) as srv:
        for run, hosts in ((RUN, 3), (RUN + "-one", 1)):
            recs = _records(run, hosts)
            for i in range(0, len(recs), 120):
                r = httpx.post(srv.url + "/v1/records", json={"records": recs[i:i + 120]},
                               timeout=10)
                assert r.status_code == 200 and not r.json().get("rejected"), r.text
        yield srv


def test_the_run_page_names_the_sick_node_and_its_cause(browser, sidecar, shots: Path):
    def judged() -> list:
        nodes = httpx.get(f"{sidecar.url}/v1/runs/{RUN}/nodes", timeout=10).json()["nodes"]
        assert [v["state"] for v in nodes] == ["healthy", "healthy", "sick"], nodes
        return nodes
    eventually(judged, timeout=20, what="gpu-node-2 judged sick")
    browser.get(f"{sidecar.url}/runs/{RUN}")
    wait(browser, 20).until(lambda d: d.execute_script(
        "return document.body.dataset.loaded === '1' && "
        "!document.getElementById('nodes-card').hidden"))
    rows = {tr.get_attribute("data-node"): [td.text for td in tr.find_elements(
        By.TAG_NAME, "td")] for tr in browser.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")}
    assert rows["gpu-node-0"][:4] == ["gpu-node-0", "0, 1", "healthy", ""]
    assert rows["gpu-node-1"][:4] == ["gpu-node-1", "2, 3", "healthy", ""]
    assert rows["gpu-node-2"][:4] == ["gpu-node-2", "4, 5", "sick", "compute-slow"]
    assert "all its ranks are slower than the other nodes'" in rows["gpu-node-2"][4]
    card = browser.find_element(By.ID, "nodes-card")
    browser.execute_script("arguments[0].scrollIntoView()", card)
    card.screenshot(str(shots / "run-nodes-card.png"))

    browser.get(f"{sidecar.url}/runs/{RUN}-one")
    wait(browser, 20).until(lambda d: d.execute_script(
        "return document.body.dataset.loaded === '1'"))
    assert not browser.find_element(By.ID, "nodes-card").is_displayed()
