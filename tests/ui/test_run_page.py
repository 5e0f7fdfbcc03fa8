"""The run page as a TensorBoard or W&B user reads it: the config, a verdict timeline, view
controls, the script's own scalars, findings grouped by episode, and labels that fit.

Three runs of one study (conftest.lr_runs); ``lr-x100`` raises the learning rate x100 at
step 300 and diverges, then goes NaN."""

from __future__ import annotations

import math
import random
from pathlib import Path

import httpx
import orjson
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from ui_checks import wait

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer

# Text whose box is wider than the box that clips it, anywhere on the page (axis labels are
# canvas text: the axis size is checked against the widest label's measured width).
OVERFLOW = """
const bad = [];
for (const n of document.querySelectorAll('#facts b, #timeline .event, .u-legend th, h2, #config th')) {
  if (n.offsetParent && n.scrollWidth > n.clientWidth + 1 && getComputedStyle(n).overflow === 'hidden')
    bad.push(n.textContent);
}
const ctx = document.createElement('canvas').getContext('2d');
ctx.font = '12px system-ui, -apple-system, "Segoe UI", sans-serif';
let checked = 0;
const charts = window.runPage ? window.runPage.charts : window.comparePage.charts;
for (const [id, u] of Object.entries(charts)) {
  u.axes.forEach((ax, i) => {
    if (i === 0 || !ax._values) return;
    checked += 1;
    const widest = Math.max(0, ...ax._values.map(v => ctx.measureText(v || '').width));
    // uPlot draws a label ticks + gap (15 px) from the plot: it must end inside the axis.
    if (widest + 15 > ax._size) bad.push(id + ': ' + ax._values.join(' '));
  });
}
return {bad, checked};
"""


def open_run(browser, lr_runs, run_id: str, query: str = "") -> None:
    browser.get(f"{lr_runs.url}/runs/{run_id}{query}")
    wait(browser, 20).until(lambda d: d.execute_script(
        "return document.body.dataset.loaded === '1' && !!window.runPage.heats.heat_grad"))


def test_config_panel_shows_the_runs_maps_escaped_and_collapsed(browser, lr_runs, shots: Path):
    open_run(browser, lr_runs, "baseline")
    card = browser.find_element(By.ID, "config-card")
    assert card.get_attribute("open") is None  # collapsed until asked
    assert "learning_rate=0.0006" in browser.find_element(By.ID, "config-summary").text
    browser.execute_script("arguments[0].open = true", card)
    rows = {tr.find_element(By.TAG_NAME, "th").text: tr.find_element(By.TAG_NAME, "td").text
            for tr in card.find_elements(By.CSS_SELECTOR, "#config tr")}
    assert rows["optimizer.name"] == "adamw" and rows["optimizer.betas"] == "0.9, 0.95"
    assert rows["gpu"] == "NVIDIA H100 80GB HBM3" and rows["n_embd"] == "384"
    assert rows["note"] == "<script>alert('x')</script>"  # shown as text, never run
    assert rows["layer_order"].endswith("… (27 in all)")
    groups = [g.get_attribute("data-group") for g in card.find_elements(By.CSS_SELECTOR,
                                                                         ".config-group")]
    assert groups == ["config", "model", "hardware"]
    browser.save_screenshot(str(shots / "run-config.png"))


def test_timeline_names_the_first_finding_of_each_kind_in_step_order(browser, lr_runs,
                                                                     shots: Path):
    findings = lr_runs.get("/v1/runs/lr-x100/findings?limit=10000")["findings"]
    first: dict[str, int] = {}
    for f in sorted(findings, key=lambda f: f["step"]):
        first.setdefault(f["type"], f["step"])
    # "(paged)" is what woke someone: an alert of the page route that went out (issue 31:
    # not a warning posted to chat, as the LR jump's is).
    alerts = lr_runs.get("/v1/alerts?run_id=lr-x100")["alerts"]
    alerted = {a["type"] for a in alerts if a["paged"]}
    assert "lr_jump" not in alerted and any(a["type"] == "lr_jump" for a in alerts)
    assert first and alerted, "the diverging run should have findings and an alert"
    open_run(browser, lr_runs, "lr-x100")
    events = browser.find_elements(By.CSS_SELECTOR, "#timeline .event")
    shown = [(e.get_attribute("data-type"), e.text) for e in events]
    assert [t for t, _ in shown] == sorted(first, key=first.get)[:8]
    for kind, text in shown:
        assert f"at step {first[kind]}" in text
        assert text.endswith("(paged)") == (kind in alerted), text
    assert all(s >= 300 for s in first.values())  # nothing before the jump
    browser.save_screenshot(str(shots / "run-timeline.png"))


def test_a_finding_repeated_every_step_is_one_episode_with_its_range_and_count(browser,
                                                                               lr_runs):
    findings = lr_runs.get("/v1/runs/lr-x100/findings?limit=10000")["findings"]
    nan_steps = sorted(f["step"] for f in findings if f["type"] == "nan_inf")
    assert len(nan_steps) >= 3, "the NaN tail (steps 337-600) should be found again and again"
    open_run(browser, lr_runs, "lr-x100")
    rows = browser.find_elements(By.CSS_SELECTOR, "#findings tr.episode[data-type='nan_inf']")
    assert len(rows) == 1
    assert int(rows[0].get_attribute("data-count")) == len(nan_steps)
    assert f"steps {nan_steps[0]}–{nan_steps[-1]}" in rows[0].text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#findings tr.episode")) < len(findings)


def test_smoothing_and_log_scale_are_view_controls_kept_in_the_url(browser, lr_runs,
                                                                   shots: Path):
    try:
        _smooth_and_log(browser, lr_runs, shots)
    finally:
        browser.execute_script("localStorage.clear()")  # the next page opens unsmoothed


def _smooth_and_log(browser, lr_runs, shots: Path) -> None:
    open_run(browser, lr_runs, "baseline")
    slider = browser.find_element(By.ID, "smoothing")
    browser.execute_script("arguments[0].value = '0.9'; arguments[0].dispatchEvent("
                           "new Event('input'))", slider)
    loss = browser.execute_script(
        "const u = window.runPage.charts.loss; return u.series.slice(1).map(s => s.label)")
    assert "loss raw" in loss and "loss" in loss  # the raw line stays, faint, behind
    spread = browser.execute_script("""
        const u = window.runPage.charts.loss, at = l => u.data[u.series.findIndex(s => s.label === l)];
        const jitter = v => { v = v.filter(x => x != null); let t = 0;
                              for (let i = 1; i < v.length; i++) t += Math.abs(v[i] - v[i - 1]);
                              return t / (v.length - 1); };
        return [jitter(at('loss raw')), jitter(at('loss'))];""")
    assert spread[1] < spread[0] / 3, spread  # smoothing removes most of the step noise
    legend = browser.execute_script(
        "return [...window.runPage.charts.loss.root.querySelectorAll('.u-legend .u-series')]"
        ".filter(r => r.style.display !== 'none').map(r => r.textContent)")
    assert not any("raw" in t for t in legend)
    toggle = browser.find_element(By.CSS_SELECTOR, "#chart-loss input[data-log]")
    toggle.click()
    assert browser.execute_script("return window.runPage.charts.loss.scales.y.distr") == 3
    assert "smooth=0.9" in browser.current_url and "log=loss" in browser.current_url
    browser.save_screenshot(str(shots / "run-smoothed-log.png"))
    browser.get(browser.current_url)  # the link reopens the same view
    wait(browser, 20).until(lambda d: d.execute_script(
        "return document.body.dataset.loaded === '1'"))
    assert browser.execute_script("return window.runPage.charts.loss.scales.y.distr") == 3
    assert browser.find_element(By.ID, "smoothing").get_attribute("value") == "0.9"
    # The other charts keep their own choice: update ratio opens on a log scale, grad norm not.
    assert browser.execute_script("return window.runPage.charts.update.scales.y.distr") == 3
    assert browser.execute_script("return window.runPage.charts.grad.scales.y.distr") == 1


def test_the_scripts_own_scalars_get_a_chart_each(browser, lr_runs, shots: Path):
    open_run(browser, lr_runs, "baseline", "?smooth=0")
    user = browser.execute_script(
        "return [...document.querySelectorAll('#user-charts .card')].filter(c => "
        "c.style.display !== 'none').map(c => c.querySelector('h2').firstChild.textContent)")
    assert user == ["accuracy", "perplexity", "eval/bleu"]
    bleu = browser.execute_script(
        "const u = Object.values(window.runPage.charts).find(u => u.series[1].label === "
        "'eval/bleu'); return [u.data[0], u.data[1]]")
    assert bleu == [[100, 200, 300, 400, 500, 600], [100 / 30, 200 / 30, 10, 400 / 30,
                                                     500 / 30, 20]]
    card = browser.find_element(By.ID, "user-card")
    browser.execute_script("arguments[0].scrollIntoView()", card)
    browser.save_screenshot(str(shots / "run-user-scalars.png"))


def test_header_and_labels_fit_and_say_what_they_mean(browser, lr_runs, shots: Path):
    open_run(browser, lr_runs, "baseline")
    # The last step (600) is an eval step at a tenth of the rate: the header is not.
    tps = float(browser.find_element(By.ID, "tps").get_attribute("data-value"))
    assert 4.0e4 < tps < 5.0e4
    fit = browser.execute_script(OVERFLOW)
    assert fit["checked"] >= 10 and fit["bad"] == [], fit
    # MFU has its own chart: nothing drawn under tokens/s.
    assert browser.execute_script("return window.runPage.charts.speed.series.length") == 2
    assert browser.execute_script("return window.runPage.charts.mfu.series[1].label") == "MFU"
    # 27 layers: every row of the heatmaps is named.
    names = browser.find_elements(By.CSS_SELECTOR, "#chart-heat_grad .row-name")
    assert len(names) == 27 and names[0].get_attribute("title") == "h.0.attn.weight"
    # A healthy update ratio (2e-4) stays far from the detector's limits (1e-7, 0.1): the
    # chart's range is the curve's own, with no band below it.
    lo, hi = browser.execute_script(
        "const s = window.runPage.charts.update.scales.y; return [s.min, s.max]")
    assert lo > 1e-7 and hi < 0.1
    browser.execute_script("document.getElementById('chart-heat_grad').scrollIntoView()")
    browser.save_screenshot(str(shots / "run-heatmaps.png"))


def test_a_run_with_no_steps_says_so(browser, lr_runs):
    import httpx

    res = httpx.post(lr_runs.url + "/v1/records", headers=lr_runs.headers, timeout=10, json={
        "records": [{"kind": "run", "run_id": "empty", "time": 1.0, "config": {"lr": 1e-3}}]})
    assert res.status_code == 200, res.text
    browser.get(f"{lr_runs.url}/runs/empty")
    wait(browser, 10).until(lambda d: d.execute_script(
        "return document.body.dataset.loaded === '1'"))
    assert browser.find_element(By.ID, "last-step").text == "no steps yet"
    # No plan, no ETA: the page says so, and how to give one.
    progress = browser.find_element(By.ID, "progress")
    assert progress.text == "no ETA"
    assert "Monitor(total_steps=N)" in progress.find_element(By.XPATH, "..").text
    browser.get(lr_runs.url + "/")
    wait(browser, 10).until(lambda d: d.find_elements(
        By.CSS_SELECTOR, "tr[data-run='empty']"))
    row = browser.find_element(By.CSS_SELECTOR, "tr[data-run='empty']")
    assert "no steps yet" in row.text and "-1" not in row.text


def test_many_scalars_chart_the_first_twelve_and_name_the_rest(browser, lr_runs):
    import httpx

    names = [f"m{i:02d}" for i in range(15)]
    res = httpx.post(lr_runs.url + "/v1/records", headers=lr_runs.headers, timeout=10, json={
        "records": [{"kind": "step", "run_id": "many", "step": s, "time": 1.0 + s, "loss": 2.0,
                     "metrics": {n: s * (i + 1) for i, n in enumerate(names)}}
                    for s in range(1, 21)]})
    assert res.status_code == 200, res.text
    browser.get(f"{lr_runs.url}/runs/many")
    wait(browser, 10).until(lambda d: d.execute_script(
        "return document.body.dataset.loaded === '1' && "
        "document.querySelectorAll('#user-charts .card').length === 12"))
    titles = browser.execute_script(
        "return [...document.querySelectorAll('#user-charts .card h2')].map(h => "
        "h.firstChild.textContent)")
    assert titles == names[:12]
    assert browser.find_element(By.ID, "user-more").text == "3 more not charted: m12, m13, m14"


def test_the_update_ratio_alert_limit_shows_where_the_curve_reaches_it(browser, lr_runs,
                                                                      shots: Path):
    import httpx

    # The ratio climbs from 1e-3 to 0.5 (update_norm / param_norm), past the 0.1 limit.
    res = httpx.post(lr_runs.url + "/v1/records", headers=lr_runs.headers, timeout=10, json={
        "records": [{"kind": "step", "run_id": "hot", "step": s, "time": 1.0 + s, "loss": 2.0,
                     "param_norm": 100.0, "update_norm": 0.1 * 1.1 ** s} for s in range(1, 90)]})
    assert res.status_code == 200, res.text
    browser.get(f"{lr_runs.url}/runs/hot")
    wait(browser, 10).until(lambda d: d.execute_script(
        "return document.body.dataset.loaded === '1' && !!window.runPage.charts.update"))
    shown = wait(browser, 5).until(lambda d: d.execute_script(
        "return window.runPage.charts.update.limitsShown"))
    assert shown == [0.1]
    browser.execute_script("document.getElementById('chart-update').scrollIntoView()")
    browser.save_screenshot(str(shots / "run-update-limit.png"))
    open_run(browser, lr_runs, "baseline")  # a healthy ratio: no limit in its range
    assert browser.execute_script("return window.runPage.charts.update.limitsShown") == []


def test_a_rollback_draws_the_abandoned_branch_apart_from_the_resumed_history(
        browser, lr_runs, shots: Path):
    """A run diverges at step 300 and is rolled back to its checkpoint at step 250 (the
    client draws a fresh attempt token and sends 251, 252, ... again): the loss chart draws
    the resumed history as its line and steps 251-330 as a faded branch of their own, with
    the rollback point marked, not a sawtooth of both in one line."""
    import math

    import httpx

    def steps(token: str, first: int, last: int, diverge: bool) -> list[dict]:
        return [{"kind": "step", "run_id": "rolled", "step": s, "time": 1.0 + s,
                 "attempt": token, "grad_norm": 1.0 + 0.1 * math.sin(s),
                 "loss": (2.0 * 1.15 ** (s - 299) if diverge and s >= 300 else
                          2.5 - s / 1000 + 0.03 * math.sin(s * 1.7))}
                for s in range(first, last + 1)]

    stopped = {"kind": "end", "run_id": "rolled", "step": 330, "time": 332.0,
               "status": "failed", "attempt": "a"}  # the diverged process ends; relaunched
    for batch in (steps("a", 1, 330, diverge=True) + [stopped],
                  steps("b", 251, 450, diverge=False)):
        res = httpx.post(lr_runs.url + "/v1/records", headers=lr_runs.headers, timeout=10,
                         json={"records": batch})
        assert res.status_code == 200, res.text
    browser.get(f"{lr_runs.url}/runs/rolled")
    shown = wait(browser, 20).until(lambda d: d.execute_script(
        "const u = window.runPage.charts.loss, s = window.runPage.series; "
        "return document.body.dataset.loaded === '1' && s && s.range[1] === 450 "
        "&& u && u.branchesShown && u.branchesShown.length && u.branchesShown"))
    assert shown == [{"attempt": 2, "rolled_back_to": 250, "last": 330, "points": 80}]
    # The current history is one line: each step once, the resumed values from step 251 on.
    series = browser.execute_script("return window.runPage.series")
    assert series["steps"] == list(range(1, 451))
    assert max(series["series"]["loss"]["mean"][250:]) < 2.5
    browser.execute_script("document.getElementById('chart-loss').scrollIntoView()")
    browser.save_screenshot(str(shots / "run-rollback-branch.png"))


def test_a_straggler_finding_shows_where_its_step_goes_next_to_the_other_ranks(browser,
                                                                                lr_runs):
    import httpx

    records = [{"kind": "run", "run_id": "slow-loader", "time": 1.0, "rank": r}
               for r in range(4)]
    for s in range(1, 31):  # rank 2 loads each batch for 410 ms, the others wait for it
        for r in range(4):
            data = 0.41 if r == 2 else 0.012
            records.append({"kind": "step", "run_id": "slow-loader", "step": s, "rank": r,
                            "time": 1.0 + s, "loss": 2.0, "step_time": 0.47,
                            "data_time": data, "compute_time": 0.05,
                            "sync_wait_time": 0.42 - data})
    res = httpx.post(lr_runs.url + "/v1/records", headers=lr_runs.headers, timeout=30,
                     json={"records": records})
    assert res.status_code == 200, res.text
    browser.get(f"{lr_runs.url}/runs/slow-loader")
    wait(browser, 20).until(lambda d: d.find_elements(
        By.CSS_SELECTOR, "#findings tr[data-type='straggler'] table.breakdown"))
    # read in one go: the page re-renders its findings as the run's state is polled
    table = browser.execute_script("""
        const t = document.querySelector('#findings table.breakdown');
        const cells = tr => [...tr.children].map(c => c.textContent);
        return {heads: cells(t.tHead.rows[0]), rows: [...t.tBodies[0].rows].map(cells),
                cause: t.querySelector('td.cause').textContent};""")
    assert table["heads"] == ["", "data loading", "compute", "all-reduce wait"]
    assert table["rows"] == [["rank 2", "410 ms", "50 ms", "10 ms"],
                             ["other ranks (median)", "12 ms", "50 ms", "408 ms"]]
    assert table["cause"] == "410 ms"


def test_checkpoints_are_marked_on_the_loss_chart_clean_or_suspect(browser, lr_runs,
                                                                   shots: Path):
    saves = [{"kind": "checkpoint", "run_id": "lr-x100", "step": s, "time": 1.5 + s,
              "path": f"/ckpt/lr-x100/step-{s}.pt", "tag": "periodic"} for s in (100, 250, 450)]
    res = httpx.post(lr_runs.url + "/v1/records", json={"records": saves}, timeout=30,
                     headers=lr_runs.headers)
    assert res.json()["accepted"] == 3, res.text
    ledger = lr_runs.get("/v1/runs/lr-x100/checkpoints")
    want = [(c["step"], c["status"]) for c in ledger["checkpoints"]]
    # The LR jump at 300 sends the run to divergence, then NaN: the save at 450 holds it.
    assert want == [(100, "clean"), (250, "clean"), (450, "suspect")], ledger
    open_run(browser, lr_runs, "lr-x100")
    wait(browser, 20).until(lambda d: len(d.find_elements(
        By.CSS_SELECTOR, "#chart-loss .ckpt-mark")) == 3)
    marks = browser.find_elements(By.CSS_SELECTOR, "#chart-loss .ckpt-mark")
    shown = [(int(m.get_attribute("data-step")), m.get_attribute("data-status")) for m in marks]
    assert shown == want
    lefts = [m.rect["x"] for m in marks]
    assert lefts == sorted(lefts) and all(m.is_displayed() for m in marks)
    assert [m.value_of_css_property("background-color") for m in marks][1:] == [
        "rgba(26, 127, 55, 1)", "rgba(191, 135, 0, 1)"]
    # Ticks on the bottom edge (issue 31: full-height lines every save buried the curve).
    assert all(m.size["height"] <= 12 for m in marks)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})",
                           browser.find_element(By.ID, "chart-loss"))
    ActionChains(browser).move_to_element(marks[2]).perform()
    tip = browser.find_element(By.ID, "tip")
    wait(browser, 5).until(lambda d: tip.is_displayed())
    assert "step 450" in tip.text and "suspect:" in tip.text
    browser.find_element(By.ID, "chart-loss").screenshot(str(shots / "run-checkpoints.png"))


def test_a_multi_rank_runs_findings_name_their_rank(browser, tmp_path):
    """Four ranks: rank 3's shard goes bad at step 60 (rank_outlier), then rank 0's loss
    goes NaN at step 150 and the others follow through the all-reduce (nan_inf, named on
    rank 0: the row says so, not only ranks other than 0)."""
    rnd = random.Random(0)
    records: list[dict] = [{"kind": "run", "run_id": "ddp4", "time": 1.0, "rank": r,
                            "hardware": {"reporting_ranks": 4},
                            "labels": {"hostname": f"node-{r}"}} for r in range(4)]
    for s in range(1, 161):
        for r in range(4):
            loss = 2.0 + math.exp(-s / 50) + rnd.gauss(0, 0.05)
            loss *= 3.0 if r == 3 and 60 <= s < 150 else 1.0
            grad = 1.0 + rnd.gauss(0, 0.05)
            if s >= 150:
                loss = "NaN" if r == 0 or s > 150 else loss
                grad = "NaN"
            records.append({"kind": "step", "run_id": "ddp4", "step": s, "time": 1.0 + s,
                            "rank": r, "loss": loss, "grad_norm": grad})
    with LiveServer(load_settings(data_dir=tmp_path / "data")) as srv:
        body = b"\n".join(orjson.dumps(r) for r in records)
        res = httpx.post(srv.url + "/v1/records", content=body, timeout=60,
                         headers={"content-type": "application/x-ndjson"})
        assert res.status_code < 300, res.text
        browser.get(f"{srv.url}/runs/ddp4")
        wait(browser, 20).until(lambda d: d.execute_script(
            "return document.body.dataset.loaded === '1'"))
        wait(browser, 20).until(lambda d: d.find_elements(
            By.CSS_SELECTOR, "#findings tr.episode[data-type='nan_inf']"))
        text = {t: browser.find_element(
            By.CSS_SELECTOR, f"#findings tr.episode[data-type='{t}']").text
            for t in ("rank_outlier", "nan_inf")}
    assert "rank_outlier · rank 3" in text["rank_outlier"], text
    assert "nan_inf · rank 0" in text["nan_inf"], text
    assert "NaN first on rank 0 (host node-0) at step 150" in text["nan_inf"], text


def test_steps_the_step_guard_skipped_are_marked_on_the_loss_and_grad_charts(browser, lr_runs,
                                                                              shots: Path):
    import httpx

    skipped = {40: "grad_norm_outlier", 95: "nonfinite_grad", 150: "grad_norm_outlier"}

    def step(s: int) -> dict:
        rec = {"kind": "step", "run_id": "guarded", "step": s, "time": 1.0 + s,
               "loss": 3.0 - s / 100, "grad_norm": 1.0 + 0.05 * (s % 7), "clip_threshold": 5.0}
        if s in skipped:
            rec.update(skipped=True, skip_reason=skipped[s], loss=30.0,
                       grad_norm="NaN" if skipped[s] == "nonfinite_grad" else 900.0)
        return rec

    res = httpx.post(lr_runs.url + "/v1/records", headers=lr_runs.headers, timeout=10,
                     json={"records": [step(s) for s in range(1, 201)]})
    assert res.status_code == 200, res.text
    browser.get(f"{lr_runs.url}/runs/guarded")
    # The chart history folds the records on its own thread: wait until it has all 200.
    wait(browser, 20).until(lambda d: d.execute_script(
        "const s = window.runPage.series; return document.body.dataset.loaded === '1' && "
        "!!window.runPage.charts.grad && s && s.range[1] === 200"))
    assert browser.execute_script("return window.runPage.series.skipped_steps") == [40, 95, 150]
    shown = wait(browser, 5).until(lambda d: d.execute_script(
        "const c = window.runPage.charts; return c.loss.skippedShown && "
        "[c.loss.skippedShown, c.grad.skippedShown]"))
    assert shown == [3, 3]
    # Issue 31: the skipped batches' losses (30 here) are neither on the line nor the axis,
    # nor in the header's loss EMA, and no skip (a NaN one included) made a page or the run
    # unhealthy.
    assert browser.execute_script("return window.runPage.charts.loss.scales.y.max") < 5
    detail = lr_runs.get("/v1/runs/guarded")
    assert detail["ranks"]["0"]["loss_ema"] < 3.5, detail["ranks"]
    assert detail["verdict"]["state"] == "healthy" and detail["alerts"] == [], detail["alerts"]
    browser.execute_script("document.getElementById('chart-loss').scrollIntoView()")
    browser.save_screenshot(str(shots / "run-guard-skips.png"))
    open_run(browser, lr_runs, "baseline")  # a run with no skips: no marks
    assert browser.execute_script("return window.runPage.charts.loss.skippedShown") == 0


def test_a_hang_lists_each_ranks_last_step_and_frame(browser, tmp_path):
    """Issue 23: the hang finding's row carries a per-rank table: the rank stuck elsewhere,
    the one waiting in all_reduce, the last completed step of each."""
    import time

    import httpx

    from monitor_agent.settings import load_settings
    from tests.live_server import LiveServer

    settings = load_settings(data_dir=tmp_path, tick_interval_seconds=0.05)
    now = time.time()
    frames = {0: ("torch/distributed/distributed_c10d.py", "all_reduce"),
              1: ("train.py", "wait_for_batch")}
    records = [{"kind": "run", "run_id": "hung", "hardware": {"world_size": 2}}]
    records += [{"kind": "step", "run_id": "hung", "step": s, "rank": r, "loss": 1.0,
                 "time": now - 60 + s} for s in range(1, 8) for r in (0, 1)]
    records += [{"kind": "hang", "run_id": "hung", "step": 7, "rank": r, "time": now,
                 "stuck_seconds": 53.0, "limit_seconds": 30.0, "phase": "backward",
                 "threads": [{"name": "MainThread", "training": True, "frames": [
                     {"file": "train.py", "line": 88, "function": "main", "user": True},
                     {"file": f, "line": 9, "function": fn, "user": f == "train.py"}]}]}
                for r, (f, fn) in frames.items()]
    with LiveServer(settings) as srv:
        assert httpx.post(srv.url + "/v1/records", json={"records": records},
                          timeout=30).status_code == 200
        eventually(lambda: [f for f in httpx.get(f"{srv.url}/v1/runs/hung/findings", timeout=10)
                            .json()["findings"] if f["type"] == "hang"],
                   timeout=60, interval=0.1, what="the hang finding")
        browser.get(f"{srv.url}/runs/hung")
        wait(browser, 20).until(lambda d: d.find_elements(
            By.CSS_SELECTOR, "#findings tr.episode[data-type='hang'] table.hang-ranks"))
        # read in one go: the page re-renders its findings as the run's state is polled
        row = browser.execute_script("""
            const row = document.querySelector("#findings tr.episode[data-type='hang']");
            return {text: row.innerText, cells: [...row.querySelectorAll(
                "table.hang-ranks tr[data-state]")].map(
                tr => [...tr.querySelectorAll("td")].map(td => td.innerText))};""")
        assert "rank 1 stuck 53 s in train.py:wait_for_batch" in row["text"]
        cells = row["cells"]
        assert cells == [
            ["0", "hung", "7", "53 s", "backward",
             "torch/distributed/distributed_c10d.py:all_reduce ← train.py:88"],
            ["1", "hung", "7", "53 s", "backward", "train.py:wait_for_batch ← train.py:88"]]


def test_the_gpu_table_shows_each_ranks_gpu_and_marks_what_is_wrong(browser, lr_runs,
                                                                   shots: Path):
    """Issue 34: per rank, the node and GPU from its run record and its latest NVML reading;
    rank 1's GPU throttles (thermal) and reported uncorrectable ECC errors."""
    healthy = {"utilization": 0.97, "temperature_c": 70.0, "power_w": 650.0,
               "power_limit_w": 700.0, "sm_clock_mhz": 1980.0, "sm_clock_max_mhz": 1980.0,
               "throttle_reasons": 0.0, "throttle_thermal": 0.0, "throttle_power": 0.0,
               "throttle_hw_slowdown": 0.0, "ecc_uncorrected_volatile": 0.0,
               "ecc_uncorrected_aggregate": 0.0, "ecc_corrected_volatile": 0.0,
               "ecc_corrected_aggregate": 12.0, "remapped_rows_correctable": 0.0,
               "remapped_rows_uncorrectable": 0.0, "remapped_rows_pending": 0.0,
               "remapped_rows_failure": 0.0, "pcie_link_width": 16.0,
               "pcie_link_width_max": 16.0, "pcie_link_gen": 5.0, "pcie_link_gen_max": 5.0,
               "xid_count": 0.0}
    sick = {**healthy, "temperature_c": 91.0, "sm_clock_mhz": 1410.0, "throttle_reasons": 96.0,
            "throttle_thermal": 1.0, "ecc_uncorrected_volatile": 2.0,
            "ecc_uncorrected_aggregate": 2.0, "remapped_rows_pending": 1.0}
    records: list[dict] = [{"kind": "run", "run_id": "gpu-table", "time": 1.0, "rank": r,
                            "labels": {"hostname": f"gpu-node-{r}"},
                            "hardware": {"device_name": "NVIDIA H100 80GB HBM3", "gpu_index": r,
                                         "gpu_pci_bus_id": f"00000000:{r + 16:02X}:00.0"}}
                           for r in range(2)]
    for s in range(1, 11):
        for r in range(2):
            records.append({"kind": "step", "run_id": "gpu-table", "step": s, "rank": r,
                            "time": 1.0 + s, "loss": 2.0, "step_time": 0.1,
                            "gpu": sick if r == 1 and s >= 5 else healthy})
    res = httpx.post(lr_runs.url + "/v1/records", headers=lr_runs.headers, timeout=30,
                     json={"records": records})
    assert res.status_code == 200, res.text
    browser.get(f"{lr_runs.url}/runs/gpu-table")
    wait(browser, 20).until(lambda d: d.execute_script(
        "return document.querySelectorAll('#gpus tbody tr').length === 2 && "
        "document.querySelector('#gpus tbody tr td:nth-child(2)').textContent !== ''"))
    rows = browser.execute_script("""
        return [...document.querySelectorAll('#gpus tbody tr')].map(tr =>
            [...tr.children].map(td => [td.textContent, td.className === 'bad']));""")
    browser.save_screenshot(str(shots / "gpu-table.png"))
    by_rank = {r[0][0]: r for r in rows}
    assert by_rank["0"][1][0] == "gpu-node-0"
    assert by_rank["1"][2][0] == "GPU 1 · NVIDIA H100 80GB HBM3 · PCI 00000000:11:00.0"
    assert not any(bad for _, bad in by_rank["0"])
    bad = {text for text, flagged in by_rank["1"] if flagged}
    assert bad == {"1410 / 1980", "thermal", "2 / 2", "0 unc. · 0 corr. · reset pending"}


ROLLBACK_RULES = """
routes: {page: [console], chat: [console]}
rules:
  - name: RollbackOnDivergence
    match: {types: [divergence]}
    severity: error
    action: rollback
    rollback_skip_margin: 20
  - name: TrainingLossSpike
    match: {types: [loss_spike]}
    severity: warning
  - name: TrainingWindowTrained
    match: {types: [window_trained]}
    severity: error
    fingerprint: []
"""


def test_a_rolled_back_run_shows_the_fault_it_left_and_what_the_plan_did(browser, tmp_path,
                                                                          shots: Path):
    """Issue 31: a run diverges (loss up to ~7 from step 300), a rule rolls it back to its
    save at 250 skipping data, its process stops for a relaunch, and the relaunch resumes
    past the window. Meanwhile the page says it waits for the relaunch; after it, the loss
    axis takes the abandoned branch in (the fault is visible), the fault is listed and on
    the timeline as abandoned, the alerts table names the finding's step, the warning that
    only went to chat is not "(paged)", and the checkpoint ticks leave the curve clear."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(ROLLBACK_RULES)
    settings = load_settings(data_dir=tmp_path / "data", alerting={"rules_file": str(rules)})

    def steps(token: str, first: int, last: int, skipped: int, diverge: bool) -> list[dict]:
        out = []
        for s in range(first, last + 1):
            loss = (2.0 * 1.045 ** (s - 299) if diverge and s >= 300 else
                    2.5 - s / 1000 + 0.03 * math.sin(s * 1.7))
            if s == 180:
                loss = 4.0  # one odd batch: a loss-spike warning, sent to chat
            out.append({"kind": "step", "run_id": "planned", "step": s, "time": 1.0 + s,
                        "attempt": token, "loss": loss, "data_position": s + skipped,
                        "grad_norm": 1.0 + 0.1 * math.sin(s) + (s - 299) / 10 * diverge * (
                            s >= 300)})
            if s % 50 == 0:
                out.append({"kind": "checkpoint", "run_id": "planned", "step": s,
                            "time": 1.5 + s, "attempt": token, "path": f"/ckpt/planned-{s}"})
        return out

    with LiveServer(settings) as srv:
        def post(records: list[dict]) -> dict:
            res = httpx.post(srv.url + "/v1/records", json={"records": records}, timeout=30)
            assert res.status_code == 200, res.text
            return res.json()

        post(steps("a", 1, 340, 0, diverge=True))
        [plan] = [a for a in httpx.get(f"{srv.url}/v1/runs/planned/actions").json()["actions"]]
        c, [(_, last)] = plan["plan"]["checkpoint_step"], plan["plan"]["skip"]
        post([{"kind": "end", "run_id": "planned", "step": 341, "time": 342.0, "attempt": "a",
               "status": "stopped", "error": "stopped to roll back"}])
        browser.get(f"{srv.url}/runs/planned")
        wait(browser, 20).until(lambda d: "waiting for relaunch" in d.find_element(
            By.ID, "status").text and d.execute_script(
            "const s = window.runPage.series; return !!s && s.range[1] === 340"))
        assert browser.find_element(By.ID, "status").text.startswith(
            f"stopped · waiting for relaunch from checkpoint step {c} (/ckpt/planned-{c})")
        browser.save_screenshot(str(shots / "run-waiting-for-relaunch.png"))

        post(steps("b", c + 1, 460, last - c, diverge=False)
             + [{"kind": "end", "run_id": "planned", "step": 460, "time": 470.0,
                 "attempt": "b", "status": "completed"}])
        # smooth=0: the view is pinned (a smoothing another test left in this origin's
        # localStorage, on a reused port, would otherwise apply); the wait lets a draw made
        # before the branch arrived be redrawn with it.
        browser.get(f"{srv.url}/runs/planned?smooth=0")
        wait(browser, 20).until(lambda d: d.execute_script(
            "const u = window.runPage.charts.loss, s = window.runPage.series; "
            "return document.body.dataset.loaded === '1' && s && s.range[1] === 460 "
            "&& u && u.branchesShown && u.branchesShown.length && u.scales.y.max >= 6"))
        loss = browser.execute_script(
            "const u = window.runPage.charts.loss; return {max: u.scales.y.max, "
            "peak: u.branchPeak, shown: u.branchesShown}")
        assert loss["shown"][0]["rolled_back_to"] == c
        assert loss["max"] >= 6.0 and loss["peak"] is None, loss  # the fault on the scale
        wait(browser, 20).until(lambda d: d.find_elements(
            By.CSS_SELECTOR, "#findings tr.episode.abandoned[data-type='divergence']"))
        # The page redraws its tables on every poll: each read looks again when the element
        # it found was replaced meanwhile (wait: StaleElementReference).
        def read(fn):
            return wait(browser, 10).until(lambda d: [fn(d)])[0]

        timeline = read(lambda d: d.find_element(By.ID, "timeline").text)
        assert "divergence at step" in timeline and "(abandoned: rolled back)" in timeline
        assert "No findings so far" not in timeline
        events = read(lambda d: {e.get_attribute("data-type"): e.text
                                 for e in d.find_elements(By.CSS_SELECTOR, "#timeline .event")})
        assert "(paged)" not in events["loss_spike"], events  # a warning went to chat
        assert "(paged)" in events["divergence"], events
        [row] = read(lambda d: [r.text for r in d.find_elements(
            By.CSS_SELECTOR, "#alerts tr[data-state]") if "RollbackOnDivergence" in r.text])
        divergence = httpx.get(f"{srv.url}/v1/runs/planned/findings?limit=100").json()
        steps_found = {f["step"] for f in divergence["findings"] if f["type"] == "divergence"}
        assert any(f"step {s}" in row for s in steps_found), row
        verdict = read(lambda d: d.find_element(By.ID, "verdict").text)
        assert verdict.startswith("healthy (rolled back once: divergence at step"), verdict
        assert read(lambda d: d.find_element(
            By.CSS_SELECTOR, "#attempts tr[data-attempt='2']").text).startswith(
            "2 rolled back (a rollback plan)")
        grad = browser.execute_script("return window.runPage.charts.grad.branchPeak")
        assert grad and grad["step"] == 340  # far off the grad scale: clipped, its peak said
        marks = browser.find_elements(By.CSS_SELECTOR, "#chart-loss .ckpt-mark")
        assert marks and all(m.size["height"] <= 12 for m in marks)
        browser.save_screenshot(str(shots / "run-after-rollback.png"))
        browser.execute_script("document.getElementById('chart-loss').scrollIntoView()")
        browser.find_element(By.ID, "chart-loss").screenshot(
            str(shots / "run-after-rollback-loss.png"))


def test_thousands_of_checkpoints_and_findings_draw_a_capped_number_of_marks(browser, tmp_path,
                                                                          shots: Path):
    """Issue 35: the run page drew one element per checkpoint and per finding, each placed
    with a reflow, and a run with 20,000 checkpoints froze the tab. Marks are now capped
    like the charts' points, one per few pixels at most, each standing for the others of
    its slice: the last clean checkpoint and the critical finding among them."""
    from monitor_agent.records.types import Finding, Severity
    from monitor_agent.storage.store import Store, StoredCheckpoint

    settings = load_settings(data_dir=tmp_path / "data")
    n = 4000
    steps = [{"kind": "step", "run_id": "many", "step": s, "time": 1.0 + s,
              "loss": 3.0 - s / 4000} for s in range(1, n + 1)]
    with LiveServer(settings) as srv:
        for i in range(0, n, 1000):
            assert httpx.post(srv.url + "/v1/records", json={"records": steps[i:i + 1000]},
                              timeout=60).status_code == 200
        wait(browser, 30, poll_frequency=0.2).until(lambda _: httpx.get(
            f"{srv.url}/v1/runs/many/series?points=10", timeout=10).json()["range"][1] == n)
    # Stored as a long run would have stored them (its ingest is not what this is about):
    # a save every step, a warning every step up to 3000, then the loss goes NaN at 3500.
    store = Store(settings.db_path)
    for s in range(1, n + 1):
        store.add_checkpoint(StoredCheckpoint("many", s, 1, 0, f"/ckpt/step-{s}.pt", 1.0 + s))
    warn = [Finding("loss_spike", Severity.WARNING, "many", step=s, message="a spike",
                    time=1.0 + s).to_dict() for s in range(1, 3001)]
    nan = Finding("nan_inf", Severity.CRITICAL, "many", step=3500, message="loss is NaN",
                  time=3501.0)
    store.insert_findings([*warn, nan.to_dict()])
    store.close()
    with LiveServer(settings) as srv:
        ledger = httpx.get(f"{srv.url}/v1/runs/many/checkpoints?limit=1", timeout=10).json()
        assert ledger["last_clean"]["step"] == 3499
        browser.get(f"{srv.url}/runs/many")
        wait(browser, 30).until(lambda d: d.execute_script(
            "const u = window.runPage.charts.loss; return document.body.dataset.loaded === '1'"
            " && u && u.ckptsShown > 0 && u.marksShown > 0"))
        got = browser.execute_script("""
            const box = window.runPage.charts.loss.over;
            const read = sel => [...box.querySelectorAll(sel)].map(m => [+m.dataset.step,
                m.dataset.status || m.dataset.type, +m.dataset.count]);
            const {min, max} = window.runPage.charts.loss.scales.x;
            return {width: box.clientWidth, ckpts: read('.ckpt-mark'), marks: read('.marker'),
                    range: [min, max]};""")
        cap = got["width"] // 6 + 1
        ckpts, marks = got["ckpts"], got["marks"]
        assert 10 < len(ckpts) <= cap and 10 < len(marks) <= cap, (got["width"], len(ckpts),
                                                                   len(marks))
        # Every checkpoint and finding in the chart's range is accounted for by the mark
        # standing for it.
        lo, hi = got["range"]
        assert sum(c for _, _, c in ckpts) == n
        assert sum(c for _, _, c in marks) == len([s for s in range(1, 3001) if lo <= s <= hi]) + 1
        assert [3499, "clean"] in [m[:2] for m in ckpts]
        assert "suspect" in {s for _, s, _ in ckpts}
        assert [3500, "nan_inf"] in [m[:2] for m in marks]
        # A mark clear of the findings' (none between 3000 and 3500) says what it stands for.
        step = next(s for s, _, c in ckpts if 3050 < s < 3450 and c > 1)
        mark = browser.find_element(By.CSS_SELECTOR, f"#chart-loss .ckpt-mark[data-step='{step}']")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})",
                               browser.find_element(By.ID, "chart-loss"))
        ActionChains(browser).move_to_element(mark).perform()
        tip = browser.find_element(By.ID, "tip")
        wait(browser, 5).until(lambda d: tip.is_displayed())
        assert f"step {step}" in tip.text and "more checkpoints near here" in tip.text
        browser.find_element(By.ID, "chart-loss").screenshot(str(shots / "run-many-marks.png"))
