"""The proof of issue 22's step guard: a real CPU training run (a subprocess) with injected
single-batch gradient spikes at known steps, against a real sidecar with the default rules
and a PagerDuty receiver. The guard skips exactly those steps and no others; the sidecar
stores each with its reason and counts them per reason in /metrics; spikes within the skip
budget page nobody (a NaN batch the guard skipped included: the weights never saw it, so the
run stays healthy and its loss EMA ordinary), and the one that exceeds it pages once, naming
count, reasons and steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from monitor_agent.detectors import DetectorSettings
from monitor_agent.detectors.support.stats import Ema
from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]
STEPS = 220
BUDGET = 3  # detectors.skip_budget_skips, over skip_budget_steps=200


@pytest.fixture
def guard_sidecar(tmp_path, sidecar_factory, pd_receiver):
    config = tmp_path / "guard-config.yaml"
    config.write_text(
        f"detectors:\n  skip_budget_skips: {BUDGET}\n  skip_budget_steps: 200\n"
        "alerting:\n  group_wait_seconds: 0.05\n"
        f"  pagerduty: {{routing_key: k-0123456789abcdef0123456789abcd, "
        f"url: '{pd_receiver.url}/v2/enqueue'}}\n")
    return sidecar_factory(config=config).start()


def _train(url: str, run_id: str, spikes: list[int], tmp_path: Path,
           nans: tuple[int, ...] = ()) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(REPO / "tests" / "e2e" / "guard_train.py"), "--url", url,
           "--run-id", run_id, "--steps", str(STEPS), "--spool-dir", str(tmp_path / run_id),
           "--spike", *map(str, spikes), "--nan", *map(str, nans)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stdout + proc.stderr


def _skipped(sc, run_id: str) -> dict[int, str]:
    steps = [r for r in sc.records(run_id) if r["kind"] == "step"]
    assert len(steps) == STEPS
    return {r["step"]: r.get("skip_reason") for r in steps if r.get("skipped")}


def _pages(pd_receiver, run_id: str) -> list[str]:
    return [r.json["payload"]["summary"] for r in pd_receiver.requests
            if r.json and run_id in str(r.json)]


@pytest.mark.slow
def test_spikes_are_skipped_exactly_and_page_only_past_the_budget(guard_sidecar, pd_receiver,
                                                                     tmp_path):
    sc = guard_sidecar
    # BUDGET - 1 skips, a spike and a NaN batch: the guard handles them, nobody is paged.
    _train(sc.url, "guard-within", [90], tmp_path, nans=(130,))
    assert _skipped(sc, "guard-within") == {90: "grad_norm_outlier", 130: "nonfinite_grad"}
    run = httpx.get(f"{sc.url}/v1/runs/guard-within", timeout=10).json()
    assert run["verdict"]["state"] == "healthy", run["verdict"]
    # The header's loss EMA is the EMA of the steps the weights saw (a skipped spike's loss,
    # ~1e6 here, would dominate it for hundreds of steps).
    ema = Ema(DetectorSettings().ema_alpha)
    for r in sc.records("guard-within"):
        if r["kind"] == "step" and not r.get("skipped"):
            ema.add(r["loss"])
    assert run["ranks"]["0"]["loss_ema"] == pytest.approx(ema.value, rel=1e-6)

    beyond = [90, 130, 170]  # the BUDGET-th skip within 200 steps pages
    _train(sc.url, "guard-beyond", beyond, tmp_path)
    assert _skipped(sc, "guard-beyond") == dict.fromkeys(beyond, "grad_norm_outlier")

    pages = eventually(lambda: _pages(pd_receiver, "guard-beyond"), timeout=20,
                       what="the skip budget's page")
    assert pages and all("TrainingSkipBudget" in p for p in pages), pages
    assert "skipped 3 of the last 200 steps" in pages[0], pages
    assert "grad_norm_outlier x3" in pages[0] and "steps 90, 130, 170" in pages[0], pages
    findings = httpx.get(f"{sc.url}/v1/runs/guard-beyond/findings", timeout=10).json()
    budget = [f for f in findings["findings"] if f["type"] == "skip_budget"]
    assert budget and budget[0]["step"] == 170
    # the run within the budget was never paged (its pages, if any, would have arrived by
    # now: they are sent before the later run's)
    assert _pages(pd_receiver, "guard-within") == []

    metrics = httpx.get(f"{sc.url}/metrics", timeout=10).text
    lines = [ln for ln in metrics.splitlines()
             if ln.startswith("training_skipped_steps_by_reason_total{")
             and 'run_id="guard-beyond"' in ln]
    assert len(lines) == 1 and 'reason="grad_norm_outlier"' in lines[0], lines
    assert float(lines[0].rsplit(" ", 1)[1]) == 3, lines
