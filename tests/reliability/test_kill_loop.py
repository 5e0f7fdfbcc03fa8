"""kill -9 of the sidecar during a real training run through the real client: every step
stored once and in order, every page once, resolves arrive, detector state continues."""

from __future__ import annotations

import pytest

from tests.reliability.kill_loop import kill_loop


@pytest.mark.slow
def test_three_kills_lose_nothing_and_page_once(tmp_path):
    report = kill_loop(tmp_path, kills=3, steps=300, gap=(0.3, 1.2))
    ref, chaos = report.reference, report.chaos
    assert chaos.kills == 3, report.summary()
    assert chaos.exit_code == 0 and chaos.steps_logged == 300
    # Stored exactly once and in arrival order 1..N (row ids increase with arrival).
    assert chaos.stored_steps == list(range(1, 301)), report.summary()
    # Every page that fired unharmed fires exactly once under kills, and resolves.
    assert ref.triggers and chaos.triggers == ref.triggers, report.summary()
    assert all(n == 1 for n in chaos.dedup_triggers.values()), report.summary()
    assert all(chaos.resolves[k] == 1 for k in chaos.dedup_triggers), report.summary()
    # Detector state (EMA, windows, cooldowns) continued as if nothing happened.
    assert chaos.findings == ref.findings, report.summary()
    assert ref.loss_ema is not None
    assert chaos.loss_ema == pytest.approx(ref.loss_ema, rel=1e-9)
    assert chaos.slack == ref.slack and all(n == 1 for n in chaos.slack.values()), report.summary()
