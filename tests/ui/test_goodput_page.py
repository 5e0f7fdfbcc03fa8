"""The run page's goodput card and the runs list's goodput column, in a real browser: records
of known timing posted raw to a live sidecar (tests/api/test_goodput.py's style: a 2-rank run
up 3 s before step 1, a 4 s loader stall, a 2 s checkpoint save, a hang the watchdog reported
10 s in and that lasted 20 s, a crash and a relaunch 30 s later under a new attempt token)
come back as a proportional bar, a badput table of exactly those seconds, and each incident
with its cost on the timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from ui_checks import wait

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer

T0 = 10_000.0
RUN = "gp-ui"


def _run(t: float, token: str) -> list[dict[str, Any]]:
    return [{"kind": "run", "run_id": RUN, "rank": r, "time": t, "attempt": token,
             "labels": {"project": "goodput"},
             "hardware": {"world_size": 2, "device": "cpu"}} for r in (0, 1)]


def _step(step: int, t: float, token: str, data: float = 0.0) -> list[dict[str, Any]]:
    return [{"kind": "step", "run_id": RUN, "rank": r, "step": step, "time": t,
             "attempt": token, "loss": 2.0, "grad_norm": 1.0, "step_time": 1.0 + data,
             "data_time": data} for r in (0, 1)]


def _records() -> list[list[dict[str, Any]]]:
    """Batches in the order a job sends them. Attempt a: up 3 s before step 1 (steps take
    1 s), step 5 waits 4 s more on its loader, a 2 s save after step 10, no step after 15 for
    20 s (the watchdog reports 10 s in), dies after step 20. Attempt b: relaunched 30 s
    later from the checkpoint at step 10, up 2 s before its first step."""
    batches, t = [_run(T0, "a")], T0
    for step in range(1, 21):
        stall = 4.0 if step == 5 else 0.0
        t += 1.0 + stall + {1: 3.0, 11: 2.0, 16: 20.0}.get(step, 0.0)
        batches.append(_step(step, t, "a", data=stall))
        if step == 10:
            batches.append([{"kind": "checkpoint", "run_id": RUN, "step": 10, "time": t + 2.0,
                             "attempt": "a", "path": "/c/10.pt", "seconds": 2.0}])
        if step == 15:
            batches.append([{"kind": "hang", "run_id": RUN, "step": 15, "time": t + 11.0,
                             "attempt": "a", "stuck_seconds": 11.0, "limit_seconds": 10.0}])
    batches.append([{"kind": "end", "run_id": RUN, "step": 20, "time": t, "attempt": "a",
                     "status": "failed", "error": "RuntimeError: boom"}])
    t += 30.0
    batches.append(_run(t, "b"))
    t += 3.0
    batches.append(_step(11, t, "b"))
    for step in range(12, 25):
        t += 1.0
        batches.append(_step(step, t, "b"))
    return batches


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with LiveServer(load_settings(data_dir=tmp_path_factory.mktemp("goodput-ui"))) as srv:
        for batch in _records():
            r = httpx.post(srv.url + "/v1/records", json={"records": batch}, timeout=10)
            assert r.status_code == 200 and not r.json().get("rejected"), r.text
        yield srv


def _goodput(srv: LiveServer) -> dict[str, Any]:
    r = httpx.get(f"{srv.url}/v1/runs/{RUN}/goodput", timeout=10)
    r.raise_for_status()
    return r.json()


def test_the_run_page_shows_the_bar_the_badput_table_and_each_incidents_cost(
        browser, sidecar, shots: Path):
    g = _goodput(sidecar)
    assert g["gpus"] == 2 and g["badput_seconds"]["input"] == pytest.approx(4.0)
    browser.get(f"{sidecar.url}/runs/{RUN}")
    wait(browser, 20).until(lambda d: d.execute_script(
        "return document.body.dataset.loaded === '1' && "
        "!document.getElementById('goodput-card').hidden"))

    assert browser.find_element(By.ID, "goodput-ratio").text == f"{g['goodput_ratio']:.1%}"
    assert browser.find_element(By.ID, "goodput-summary").text == g["summary"]
    assert g["summary"].startswith("goodput ")

    # The table: every non-zero cause, its seconds, share of the wall-clock and GPU-hours.
    rows = {tr.get_attribute("data-cause"): [td.text for td in tr.find_elements(
        By.TAG_NAME, "td")] for tr in browser.find_elements(By.CSS_SELECTOR,
                                                             "#goodput-table tbody tr")}
    wall = g["wall_seconds"]
    assert set(rows) == {k for k, v in g["badput_seconds"].items() if v > 0}
    assert {"startup", "input", "checkpoint", "hang_undetected", "hang_detected", "restart",
            "resume"} <= set(rows)
    assert rows["input"] == ["input (data loader)", "4.0 s", f"{4.0 / wall:.1%}",
                             f"{4.0 * 2 / 3600:.3g}"]
    assert rows["checkpoint"][1] == "2.0 s"
    assert rows["startup"][1] == "5.0 s"  # 3 s before attempt a's first step, 2 s before b's
    assert rows["hang_undetected"][1] == rows["hang_detected"][1] == "10.0 s"
    assert rows["restart"][1] == "30.0 s"
    total = browser.find_element(By.CSS_SELECTOR, "#goodput-table tfoot tr.total")
    assert total.find_elements(By.TAG_NAME, "td")[1].text == f"{g['badput_seconds_total']:.1f} s"

    # The bar: productive and each cause, widths in proportion to their seconds.
    segs = browser.execute_script(
        "return [...document.querySelectorAll('#goodput-bar .seg')].map(s => "
        "[s.dataset.cause, s.getBoundingClientRect().width]);")
    bar = browser.find_element(By.ID, "goodput-bar").rect["width"]
    widths = dict(segs)
    assert list(widths)[0] == "productive" and set(widths) == {"productive", *rows}
    assert sum(widths.values()) == pytest.approx(bar, abs=2)
    assert widths["productive"] / bar == pytest.approx(g["goodput_ratio"], abs=0.02)
    assert widths["restart"] / bar == pytest.approx(30.0 / wall, abs=0.02)

    # The incidents, on the timeline strip, each with what it cost.
    incidents = {i.get_attribute("data-kind"): i.text for i in browser.find_elements(
        By.CSS_SELECTOR, "#timeline-card #incidents .incident")}
    assert set(incidents) == {"hang", "restart"}
    assert "after step 15" in incidents["hang"]
    # A CPU-only run's ranks are CPU processes, not GPUs (issue 45): in the costs and the
    # card's totals alike.
    assert "this hang cost 20 s x 2 CPU processes = 0.011 process-hours" in incidents["hang"]
    totals = browser.find_element(By.ID, "goodput-totals").text
    assert " · 2 CPU processes · " in totals and "process-hours" in totals, totals
    assert "GPU" not in totals + incidents["hang"]
    [restart] = [i for i in g["incidents"] if i["kind"] == "restart"]
    assert "resumed at step 11" in incidents["restart"] and restart["words"] in incidents[
        "restart"]
    card = browser.find_element(By.ID, "goodput-card")
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(shots / "run-goodput.png"))
    card.screenshot(str(shots / "run-goodput-card.png"))


def test_the_runs_list_shows_each_runs_goodput(browser, sidecar, shots: Path):
    g = _goodput(sidecar)
    listed = httpx.get(sidecar.url + "/v1/ui/runs", timeout=10).json()["runs"]
    assert [r["goodput"] for r in listed if r["run_id"] == RUN] == [
        pytest.approx(g["goodput_ratio"])]
    stored = httpx.get(sidecar.url + "/v1/runs", timeout=10).json()["runs"]
    assert [r["goodput"] for r in stored if r["run_id"] == RUN] == [
        pytest.approx(g["goodput_ratio"])]
    # A run with one record has no time yet: its cell is blank.
    httpx.post(sidecar.url + "/v1/records", timeout=10, json={"records": [
        {"kind": "run", "run_id": "just-started", "time": T0}]}).raise_for_status()
    browser.get(sidecar.url + "/")
    cell = wait(browser, 10).until(lambda d: d.find_elements(
        By.CSS_SELECTOR, f"tr[data-run='{RUN}'] td.goodput"))[0]
    assert cell.text == f"{g['goodput_ratio']:.1%}"
    blank = wait(browser, 10).until(lambda d: d.find_elements(
        By.CSS_SELECTOR, "tr[data-run='just-started'] td.goodput"))[0]
    assert blank.text == ""
    browser.save_screenshot(str(shots / "runs-goodput.png"))
