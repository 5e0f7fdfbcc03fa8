"""The runs page and the run page in a real browser, against a real sidecar."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By
from ui_checks import CANVAS_COLOURS, CHARTS, wait

from monitor_agent.settings import load_settings
from monitor_agent.ui.pages import STATIC
from tests.eventually import scaled
from tests.live_server import LiveServer


def open_run_page(browser, fed) -> None:
    browser.get(f"{fed.url}/runs/{fed.run_id}")
    wait(browser, 20).until(
        lambda d: d.execute_script("return document.body.dataset.loaded === '1' && "
                                   "!!window.runPage.heats.heat_zero"))


def test_every_chart_ships_with_the_package():
    for name in ("run.html", "runs.html", "run.js", "runs.js", "common.js", "heatmap.js",
                 "charts.js", "ui.css", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css",
                 "vendor/uPlot.LICENSE"):
        assert (STATIC / name).is_file(), name
    for name in ("run.html", "runs.html"):
        page = (STATIC / name).read_text()
        assert "http://" not in page and "https://" not in page  # air-gapped clusters


def row_of(browser, run_id: str) -> tuple[list[str], str]:
    """A run's row of the runs page: its cells' text and its verdict, read in one look (the
    page redraws its rows on every poll, so an element held across reads goes stale)."""
    def read(d) -> tuple[list[str], str]:
        row = d.find_element(By.CSS_SELECTOR, f"tr[data-run='{run_id}']")
        return ([td.text for td in row.find_elements(By.TAG_NAME, "td")],
                row.find_element(By.CSS_SELECTOR, ".verdict").text)

    return wait(browser, 10).until(read)


def test_runs_page_lists_the_fed_run(browser, fed, shots: Path):
    browser.get(fed.url + "/")
    cells, shown = row_of(browser, fed.run_id)
    cells = cells[1:]  # after the tick box
    assert cells[0] == fed.run_id and cells[1] == "traces"
    assert cells[3] == str(fed.run_id and fed.get(f"/v1/runs/{fed.run_id}")["last_step"])
    assert cells[6].split()[0] == str(len(fed.get(f"/v1/runs/{fed.run_id}/findings")["findings"]))
    verdict = fed.get(f"/v1/runs/{fed.run_id}")["verdict"]  # under the status
    assert shown == verdict["words"]
    browser.save_screenshot(str(shots / "runs.png"))


def test_run_page_draws_every_chart_and_marks_every_finding(browser, fed, shots: Path):
    open_run_page(browser, fed)
    drawn = browser.execute_script(CANVAS_COLOURS)
    for chart in CHARTS:
        assert drawn[chart]["shown"], f"{chart} is not shown"
        assert drawn[chart]["colours"] >= 3, f"{chart} drew nothing: {drawn[chart]}"
    detail = fed.get(f"/v1/runs/{fed.run_id}")
    def latest(d):  # read again when the page's poll replaced the element meanwhile
        shown = d.find_element(By.ID, "latest-loss")
        return shown.get_attribute("data-value"), shown.text

    value, text = wait(browser, 10).until(latest)
    assert float(value) == detail["ranks"]["0"]["latest"]["loss"]
    assert float(text) == pytest.approx(detail["ranks"]["0"]["latest"]["loss"], rel=1e-4)
    findings = fed.get(f"/v1/runs/{fed.run_id}/findings?limit=10000")["findings"]
    assert findings, "the trace should have produced findings"
    def marked(d):
        return sorted(int(m.get_attribute("data-step"))
                      for m in d.find_elements(By.CSS_SELECTOR, "#charts .marker"))

    assert wait(browser, 10).until(marked) == sorted(f["step"] for f in findings)
    ranks = wait(browser, 10).until(
        lambda d: [o.text for o in d.find_elements(By.CSS_SELECTOR, "#rank option")])
    assert ranks == ["0", "1"]

    def verdict(d):  # in the header, beside the status
        shown = d.find_element(By.ID, "verdict")
        return shown.text, shown.get_attribute("class")

    words, classes = wait(browser, 10).until(verdict)
    assert words == detail["verdict"]["words"]
    assert "verdict-" + detail["verdict"]["state"] in classes
    browser.save_screenshot(str(shots / "run.png"))


def test_a_finding_marker_shows_its_evidence_and_zooms_to_its_step(browser, fed):
    open_run_page(browser, fed)
    marker = browser.find_element(By.CSS_SELECTOR, "#chart-heat_act .marker")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", marker)
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element(marker).perform()
    tip = browser.find_element(By.ID, "tip")
    assert "activation_blowup" in tip.text and "evidence:" in tip.text
    assert "what to try next:" in tip.text
    step = int(marker.get_attribute("data-step"))
    marker.click()
    lo, hi = wait(browser, 5).until(lambda d: d.execute_script(
        "return window.runPage.view"))
    assert lo < step < hi and hi - lo < fed.last_step / 2


def test_a_live_step_appears_without_a_reload(browser, fed):
    open_run_page(browser, fed)
    step = fed.last_step + 1
    fed.post_records([{"kind": "step", "run_id": fed.run_id, "step": step,
                       "time": time.time(), "loss": 2.125, "step_time": 0.02}])
    fed.last_step = step
    # The page polls each second (run.js); the wait only stops a page that never shows it.
    wait(browser, scaled(10), poll_frequency=0.05).until(lambda d: d.execute_script(
        "const u = window.runPage.charts.loss;"
        "return document.getElementById('last-step').textContent === arguments[0] && "
        "u.data[0][u.data[0].length - 1] === +arguments[0]", str(step)))


def test_acknowledge_and_silence_need_the_token(browser, fed, shots: Path):
    alerts = [a for a in fed.get(f"/v1/alerts?run_id={fed.run_id}")["alerts"]
              if a["state"] != "resolved"]
    assert alerts, "the fed run should have an open alert"
    fp = alerts[0]["fingerprint"]
    open_run_page(browser, fed)
    browser.execute_script("sessionStorage.clear()")
    click(browser, f"tr[data-fp='{fp}'] button.ack")
    wait(browser, 5).until(
        lambda d: "Refused" in d.find_element(By.ID, "notice").text)
    assert _alert(fed, fp)["acked_at"] is None
    browser.save_screenshot(str(shots / "refused.png"))

    token = browser.find_element(By.ID, "token")
    token.send_keys("ui-test-token")
    browser.find_element(By.ID, "token-save").click()
    click(browser, f"tr[data-fp='{fp}'] button.ack")
    wait(browser, 5).until(lambda d: _alert(fed, fp)["acked_at"] is not None)
    assert _alert(fed, fp)["acked_by"] == "web UI"

    click(browser, f"tr[data-fp='{fp}'] button.silence")
    wait(browser, 5).until(lambda d: [
        s for s in fed.get("/v1/silences")["silences"] if s["run_id"] == fed.run_id])
    silence = fed.get("/v1/silences")["silences"][0]
    assert silence["type"] == alerts[0]["type"] and silence["created_by"] == "web UI"
    browser.execute_script("sessionStorage.clear()")


def click(browser, selector: str) -> None:
    """Click what the selector names now (the alerts table re-renders when alerts change)."""
    wait(browser, 5).until(lambda d: d.execute_script(
        "const b = document.querySelector(arguments[0]); if (b) b.click(); return !!b", selector))


def _alert(fed, fp: str) -> dict:
    return next(a for a in fed.get("/v1/alerts")["alerts"] if a["fingerprint"] == fp)


def test_reads_follow_auth_reads(browser, tmp_path: Path):
    from monitor_agent.settings import load_settings
    from tests.live_server import LiveServer

    settings = load_settings(data_dir=tmp_path, token="read-token", auth_reads=True)
    with LiveServer(settings) as srv:
        res = httpx.post(srv.url + "/v1/records", timeout=10, headers={
            "Authorization": "Bearer read-token"}, json={"records": [
                {"kind": "step", "run_id": "locked", "step": s, "time": 1.0 + s, "loss": 2.0}
                for s in range(1, 30)]})
        assert res.status_code == 200
        browser.get(srv.url + "/runs/locked")
        browser.execute_script("sessionStorage.clear()")
        browser.get(srv.url + "/runs/locked")
        wait(browser, 5).until(
            lambda d: "requires the token" in d.find_element(By.ID, "notice").text)
        assert not browser.find_elements(By.ID, "last-step")  # nothing shown without it
        browser.find_element(By.ID, "token").send_keys("read-token")
        browser.find_element(By.ID, "token-save").click()
        wait(browser, 10).until(
            lambda d: d.find_element(By.ID, "last-step").text == "29")
        browser.execute_script("sessionStorage.clear()")


CONTROL = "http://127.0.0.2:9/csp-control.png"  # an image no policy of ours lets in


def _violations(browser) -> list[str]:
    """The page's CSP violations so far. Each is reported after the fact, in order: an
    image of our own that the policy blocks is reported after every violation the page made
    before it, so once its report is in, theirs are too."""
    browser.execute_script(f"new Image().src = '{CONTROL}'")
    seen = wait(browser, 10).until(lambda d: [
        v for v in d.execute_script("return window.__csp") or [] if CONTROL in v] and
        d.execute_script("return window.__csp"))
    return [v for v in seen if CONTROL not in v]


def test_both_pages_work_under_their_content_security_policy(browser, fed):
    """The pages are served with a CSP (scripts from the sidecar only, no framing) and
    draw, list and act under it without one violation."""
    for path in ("/", f"/runs/{fed.run_id}"):
        csp = httpx.get(fed.url + path).headers.get("content-security-policy", "")
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, (path, csp)
    # Injected through the DevTools protocol, so the policy itself does not block it.
    watch = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": (
        "window.__csp = []; document.addEventListener('securitypolicyviolation', "
        "e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));")})
    try:
        browser.get(fed.url + "/")
        wait(browser, 10).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, f"tr[data-run='{fed.run_id}']"))
        listed = _violations(browser)
        open_run_page(browser, fed)
        drawn = _violations(browser)
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                                {"identifier": watch["identifier"]})
    assert listed == [] and drawn == [], (listed, drawn)


def test_run_page_lists_the_attempts_of_a_reused_run_id(browser, tmp_path: Path):
    def steps(token: str, first: int, last: int, loss: float) -> list[dict]:
        return [{"kind": "step", "run_id": "reused", "step": s, "time": 1.0 + s,
                 "loss": loss, "attempt": token} for s in range(first, last + 1)]

    crashed = {"kind": "end", "run_id": "reused", "step": 40, "time": 42.0,
               "status": "failed", "attempt": "a"}
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        for batch in (steps("a", 1, 40, 3.0) + [crashed], steps("b", 25, 60, 2.0)):
            assert httpx.post(srv.url + "/v1/records", json={"records": batch},
                              timeout=10).status_code == 200
        browser.get(f"{srv.url}/runs/reused")
        # Read in one script: the page redraws the table as it polls, and cells read one
        # WebDriver call at a time can belong to a row that was just replaced.
        cells = wait(browser, 20).until(lambda d: d.execute_script(
            "const rows = [...document.querySelectorAll('#attempts tbody tr')];"
            "return rows.length ? rows.map(r => [...r.cells].map(c => c.innerText.trim()))"
            " : null;"))
    # Attempt 1 ended failed and no rollback plan was applied: a crash's resume.
    assert cells == [["1", "first", "1–40", "", ""],
                     ["2", "resumed after a crash", "25–60", "steps 25–40 of earlier attempts",
                      "current"]]


def test_a_long_verdict_wraps_and_the_runs_list_fits_a_1400px_screen(browser, tmp_path: Path,
                                                                       shots: Path):
    """Issue 31: a run with two causes and rollbacks has a long verdict; it wraps in its
    column, and no column is pushed off the screen."""
    import math

    def attempt(token: str, first: int, last: int) -> list[dict]:
        out = []  # a divergence from 150, then NaN from 200 to the end
        for s in range(first, last + 1):
            loss = 2.0 + 0.02 * math.sin(s) if s < 150 else 2.0 * 1.2 ** (s - 149)
            out.append({"kind": "step", "run_id": "long-verdict", "step": s, "time": 1.0 + s,
                        "attempt": token, "loss": "NaN" if s >= 200 else loss,
                        "grad_norm": "NaN" if s >= 200 else 1.0 + (s >= 150) * (s - 149)})
        return out

    crashed = {"kind": "end", "run_id": "long-verdict", "step": 240, "time": 242.0,
               "status": "failed", "attempt": "a"}
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        # Relaunched by hand once the first process failed.
        for batch in (attempt("a", 1, 240) + [crashed], attempt("b", 120, 260)):
            assert httpx.post(srv.url + "/v1/records", json={"records": batch},
                              timeout=30).status_code == 200
        words = httpx.get(srv.url + "/v1/runs/long-verdict", timeout=10).json()["verdict"]["words"]
        assert len(words) > 80 and "resumed after a crash once" in words, words
        browser.get(srv.url + "/")
        rects = wait(browser, 10).until(lambda d: [
            td.rect for td in d.find_element(By.CSS_SELECTOR, "tr[data-run='long-verdict']")
            .find_elements(By.TAG_NAME, "td")])
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= 1400 and all(r["x"] + r["width"] <= 1400 for r in rects), (width, rects)
        assert row_of(browser, "long-verdict")[1] == words
        browser.save_screenshot(str(shots / "runs-long-verdict.png"))
