"""A restart (graceful or kill -9) keeps runs, history and detector state."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.sidecar_process import SidecarProcess


def _steps(run_id: str, start: int, stop: int) -> list[dict]:
    return [
        {"kind": "step", "run_id": run_id, "step": s, "time": 1000.0 + s, "loss": 3.0 - s * 0.01,
         "grad_norm": 1.0, "tokens": 100, "step_time": 0.1}
        for s in range(start, stop)
    ]


def _ema(url: str, run_id: str) -> float:
    text = httpx.get(url + "/metrics").text
    m = re.search(rf'training_loss_ema{{project="[^"]*",run_id="{run_id}",rank="0"}} (\S+)', text)
    assert m, text[:2000]
    return float(m.group(1))


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_restart_keeps_runs_history_and_detector_state(tmp_path: Path, how: str):
    reference = SidecarProcess(tmp_path / "ref").start()
    try:
        reference.post(_steps("r", 1, 121))
        expected_ema = _ema(reference.url, "r")
    finally:
        reference.stop()

    sc = SidecarProcess(tmp_path / "data").start()
    try:
        sc.post(_steps("r", 1, 61))
        getattr(sc, how)()
        sc.start()
        assert [r["step"] for r in sc.records("r")] == list(range(1, 61))
        assert httpx.get(sc.url + "/v1/runs/r").json()["last_step"] == 60
        r = sc.post(_steps("r", 1, 121))  # the client re-sends everything: only new steps count
        assert r.json() == {**r.json(), "accepted": 60, "duplicates": 60}
        assert _ema(sc.url, "r") == pytest.approx(expected_ema, rel=1e-9)
    finally:
        sc.stop()


def _skipped(url: str, run_id: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        rf'training_skipped_steps_by_reason_total{{project="[^"]*",run_id="{run_id}",'
        r'rank="0",reason="(\w+)"} (\S+)', text)}


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_restart_keeps_the_skipped_steps_by_reason(tmp_path: Path, how: str):
    reasons = {10: "grad_norm_outlier", 20: "nonfinite_grad", 70: "grad_norm_outlier",
               75: "loss_scale"}
    steps = _steps("g", 1, 81)
    for rec in steps:
        if rec["step"] in reasons:
            rec.update(skipped=True, skip_reason=reasons[rec["step"]])
    sc = SidecarProcess(tmp_path / "data").start()
    try:
        sc.post(steps[:60])
        assert _skipped(sc.url, "g") == {"grad_norm_outlier": 1, "nonfinite_grad": 1}
        getattr(sc, how)()
        sc.start()
        sc.post(steps)  # re-sent from the start: duplicates count nothing twice
        assert _skipped(sc.url, "g") == {"grad_norm_outlier": 2, "nonfinite_grad": 1,
                                         "loss_scale": 1}
    finally:
        sc.stop()
