"""The compare page: runs ticked on the runs page (or added from a run page) overlaid on
one set of axes per chart, aligned by step, one colour and one legend entry per run."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from test_run_page import OVERFLOW, open_run
from ui_checks import wait


def loaded(browser) -> None:
    wait(browser, 20).until(lambda d: d.execute_script(
        "return document.body.dataset.loaded === '1' && !!window.comparePage"))


def legend(browser, chart: str) -> list[str]:
    return browser.execute_script(
        "return [...window.comparePage.charts[arguments[0]].root.querySelectorAll("
        "'.u-legend .u-series')].slice(1).filter(r => r.style.display !== 'none')"
        ".map(r => r.querySelector('.u-label').textContent)", chart)


def test_runs_ticked_on_the_runs_page_open_overlaid(browser, lr_runs, shots: Path):
    browser.get(lr_runs.url + "/")
    wait(browser, 10).until(lambda d: len(d.find_elements(
        By.CSS_SELECTOR, "tr[data-run] input.pick")) >= 3)
    button = browser.find_element(By.ID, "compare")
    assert not button.is_enabled()
    for run in ("baseline", "lr-x100", "rerun"):
        browser.find_element(By.CSS_SELECTOR, f"tr[data-run='{run}'] input.pick").click()
    browser.save_screenshot(str(shots / "runs-picked.png"))
    browser.find_element(By.ID, "compare").click()
    loaded(browser)
    picked = parse_qs(urlparse(browser.current_url).query)["run"]
    assert sorted(picked) == ["baseline", "lr-x100", "rerun"]
    for chart in ("loss", "val_loss", "lr", "grad", "update", "speed"):
        assert sorted(legend(browser, chart)) == sorted(picked), chart
        assert browser.execute_script(
            "return window.comparePage.charts[arguments[0]].series.length", chart) == 4
    fit = browser.execute_script(OVERFLOW)
    assert fit["checked"] >= 6 and fit["bad"] == [], fit
    browser.save_screenshot(str(shots / "compare-3.png"))


def test_compare_aligns_by_step_and_shares_the_view_in_its_url(browser, lr_runs, shots: Path):
    browser.get(lr_runs.url + "/compare?run=baseline&run=lr-x100&smooth=0.8&log=loss")
    loaded(browser)
    # One x axis: each run's value at a step sits at that step's index.
    at = browser.execute_script("""
        const u = window.comparePage.charts.lr, x = u.data[0], i = x.indexOf(400);
        return [x.length, u.data[1][i], u.data[2][i]];""")
    assert at[0] == 600 and at[1] == 6e-4 and abs(at[2] - 6e-2) < 1e-9  # baseline, x100
    assert browser.execute_script("return window.comparePage.charts.loss.scales.y.distr") == 3
    assert legend(browser, "loss") == ["baseline", "lr-x100"]  # raw lines stay unlisted
    labels = browser.execute_script(
        "return window.comparePage.charts.loss.series.slice(1).map(s => s.label)")
    assert labels == ["baseline raw", "baseline", "lr-x100 raw", "lr-x100"]
    users = browser.execute_script(
        "return [...document.querySelectorAll('#charts .card')].filter(c => "
        "c.dataset.chart.startsWith('user-') && c.style.display !== 'none').length")
    assert users == 3  # accuracy, perplexity, eval/bleu: every run's own scalars
    browser.execute_script("window.comparePage.charts.loss.setScale('x', {min: 290, max: 330})")
    wait(browser, 5).until(lambda d: d.execute_script(  # every chart follows
        "return Object.values(window.comparePage.charts).every(u => u.scales.x.min === 290 && "
        "u.scales.x.max === 330)"))
    chips = [c.get_attribute("data-run") for c in browser.find_elements(By.CSS_SELECTOR, ".chip")]
    assert chips == ["baseline", "lr-x100"]
    browser.save_screenshot(str(shots / "compare-2-smoothed-log.png"))
    browser.execute_script("localStorage.clear()")


def test_add_run_on_a_run_page_opens_the_compare_view(browser, lr_runs):
    open_run(browser, lr_runs, "lr-x100")
    pick = browser.find_element(By.ID, "add-run")
    pick.click()
    wait(browser, 5).until(lambda d: len(Select(pick).options) >= 3)
    Select(pick).select_by_value("baseline")
    loaded(browser)
    assert parse_qs(urlparse(browser.current_url).query)["run"] == ["lr-x100", "baseline"]
    assert legend(browser, "loss") == ["lr-x100", "baseline"]
