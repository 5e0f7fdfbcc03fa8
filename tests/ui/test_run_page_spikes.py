"""A one-step spike stays on the run page however many steps share a pixel.

The page asks the server for about one bucket per pixel (series: min/max/mean per bucket,
read from the pre-aggregated blocks on a long run; heatmaps: the max per bucket), so a
spike of one step in 25,000 must still reach its value in the loss chart's band (the
bucket's max) and colour its heatmap column, not be averaged away by the bucket it falls
in."""

from __future__ import annotations

from pathlib import Path

import httpx
from ui_checks import wait

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer

STEPS = 25_000  # ~38 steps a pixel on a 650 px chart: the series reads the 16-step blocks
LOSS_SPIKE, GRAD_SPIKE = 17_777, 12_350
YELLOW = [253, 231, 37]  # the heatmap palette's top colour


def _records() -> list[dict]:
    out: list[dict] = [{"kind": "run", "run_id": "spiky", "time": 0.0,
                        "model": {"layer_order": ["a", "b", "c"]}}]
    for s in range(1, STEPS + 1):
        rec: dict = {"kind": "step", "run_id": "spiky", "step": s, "time": float(s),
                     "loss": 50.0 if s == LOSS_SPIKE else 2.0 + (s % 7) / 100}
        if s % 25 == 0:
            rec["layers"] = {n: {"grad_norm": 100.0 if (s, n) == (GRAD_SPIKE, "b") else 1.0}
                             for n in ("a", "b", "c")}
        out.append(rec)
    return out


def test_a_one_step_spike_is_drawn_on_the_loss_band_and_the_heatmap(
        browser, tmp_path: Path, shots: Path):
    records = _records()
    with LiveServer(load_settings(data_dir=tmp_path / "data")) as srv:
        for i in range(0, len(records), 2500):
            assert httpx.post(srv.url + "/v1/records", json={"records": records[i:i + 2500]},
                              timeout=120).status_code == 200
        wait(browser, 60, poll_frequency=0.2).until(lambda _: httpx.get(
            f"{srv.url}/v1/runs/spiky/series?points=10", timeout=10).json()["range"][1] == STEPS)
        browser.get(f"{srv.url}/runs/spiky")
        wait(browser, 30).until(lambda d: d.execute_script(
            "return document.body.dataset.loaded === '1' && !!window.runPage.heats.heat_grad"))
        got = browser.execute_script("""
            const S = window.runPage, u = S.charts.loss, h = S.heats.heat_grad;
            const c = h.canvas, d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            const row = Math.floor(c.height / 2), x = Math.round(h.xpos(arguments[0]) * c.width / c.clientWidth);
            const near = [];  // the colours around the spike's column in the middle row ("b")
            for (let dx = -3; dx <= 3; dx++) { const o = 4 * (row * c.width + x + dx); near.push([d[o], d[o + 1], d[o + 2]]); }
            const o = 4 * (row * c.width + 5);
            const top = u.series.findIndex(s => s.label === "loss max");
            const at = u.data[0].reduce((b, s, i) => Math.abs(s - arguments[1]) < Math.abs(u.data[0][b] - arguments[1]) ? i : b, 0);
            return {bucketed: S.series.bucketed, points: S.series.steps.length,
                    spikeTop: u.data[top][at], yMax: u.scales.y.max, elsewhere: Math.max(...u.data[top].filter((v, i) => v != null && Math.abs(i - at) > 1)),
                    near, far: [d[o], d[o + 1], d[o + 2]], columns: h.m.steps.length, pixels: c.width};""",
            GRAD_SPIKE, LOSS_SPIKE)
        browser.execute_script("document.getElementById('chart-loss').scrollIntoView()")
        browser.save_screenshot(str(shots / "run-spikes-loss.png"))
        browser.execute_script("document.getElementById('chart-heat_grad').scrollIntoView()")
        browser.save_screenshot(str(shots / "run-spikes.png"))
    assert got["bucketed"] and got["points"] < STEPS / 20, got  # many steps per bucket
    # The bucket holding the spike draws its max (the band's upper edge) at the spike.
    assert got["spikeTop"] == 50.0 and got["elsewhere"] < 2.1, got
    # ... on the chart's own y axis, which reaches it: the band's edges are drawn to the
    # scale the axis shows, so the spike's height reads off the axis, not clipped.
    assert got["yMax"] >= 50.0, got
    # More buckets than the heatmap's pixels (its row names take some of the width): the
    # spike's bucket must not be one of those a scaled draw leaves out.
    assert got["columns"] > got["pixels"], got
    assert YELLOW in got["near"] and got["far"] != YELLOW, got
