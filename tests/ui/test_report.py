"""``monitor-agent replay TRACE --report``: one HTML file that opens with the network off."""

from __future__ import annotations

from pathlib import Path

from selenium.webdriver.common.by import By
from ui_checks import CANVAS_COLOURS, CHARTS, wait

from monitor_agent.cli import main
from monitor_agent.pipeline.trace_judge import judge_traces
from monitor_agent.settings import Settings

TRACE = Path(__file__).resolve().parents[1] / "traces" / "activation_blowup_gpt.jsonl.gz"


def test_report_opens_offline_with_every_chart_and_finding(browser, tmp_path: Path, shots: Path,
                                                           capsys):
    report = tmp_path / "report.html"
    assert main(["replay", str(TRACE), "--report", str(report), "--quiet"]) == 0
    assert f"report of run activation_blowup_gpt: {report}" in capsys.readouterr().out
    html = report.read_text()
    assert "<script src=" not in html and "<link " not in html  # every asset inlined
    findings = judge_traces([TRACE], Settings())[0].findings

    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.emulateNetworkConditions", {
        "offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    try:
        browser.get(report.as_uri())
        wait(browser, 20).until(lambda d: d.execute_script(
            "return document.body.dataset.loaded === '1'"))
        drawn = browser.execute_script(CANVAS_COLOURS)
        browser.save_screenshot(str(shots / "report.png"))
    finally:
        browser.execute_cdp_cmd("Network.emulateNetworkConditions", {
            "offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    missing = set(CHARTS) - {c for c, v in drawn.items()
                                            if v["shown"] and v["colours"] >= 3}
    assert not missing, drawn
    markers = browser.find_elements(By.CSS_SELECTOR, "#charts .marker")
    assert len(markers) == len(findings)
    assert sorted(int(m.get_attribute("data-step")) for m in markers) == sorted(
        f.step for f in findings)
