"""Cardinality bombs (layer names, run ids, label values) are capped: what is over the cap
is refused with a clear 4xx or counted as dropped, and memory holds only up to the caps.
bench/chaos.py runs the million-name versions and prints the memory they cost."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer
from tests.reliability.cardinality import label_bomb, layer_bomb, run_bomb


def _dropped(url: str, reason: str) -> float:
    text = httpx.get(url + "/metrics").text
    m = re.search(rf'monitor_agent_dropped_series_total{{reason="{reason}"}} (\S+)', text)
    assert m, reason
    return float(m.group(1))


@pytest.fixture
def capped(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, max_layer_names_per_run=500,
                             max_active_runs=200, max_new_runs_per_request=500,
                             max_runs_exposed=50, max_layers_exposed=100)
    with LiveServer(settings) as srv:
        yield srv


def test_layer_name_bomb_is_stored_but_tracked_only_up_to_the_cap(capped):
    result = layer_bomb(capped.url, os.getpid(), names=6000, per_record=1000, per_batch=3)
    assert result.statuses == {200: 2} and result.accepted == 6  # nothing refused or lost
    run = capped.app.state.services.engine.registry.get("layer-bomb").state
    assert len(run.layer_names) == 500
    assert _dropped(capped.url, "max_layer_names") == 5500
    # The same names again cost nothing more; known names keep being analysed.
    again = layer_bomb(capped.url, os.getpid(), names=1000, per_record=1000)
    assert again.accepted == 0  # same run and steps: duplicates, not new state
    assert len(run.layer_names) == 500


def test_run_id_bomb_is_refused_past_max_active_runs(capped):
    result = run_bomb(capped.url, os.getpid(), runs=2000, per_batch=500)
    assert result.accepted == 200 and result.rejected == 1800
    assert result.statuses[429] == 3  # whole batches of new runs: a clear 429
    assert len(capped.app.state.services.engine.registry) == 200
    text = httpx.get(capped.url + "/metrics").text
    assert len(set(re.findall(r'run_id="([^"]+)"', text))) <= 50


def test_label_value_bomb_gets_a_clear_422(capped):
    result = label_bomb(capped.url, os.getpid(), values=5000, per_record=1000, per_batch=5)
    assert result.statuses == {422: 1} and result.accepted == 0
    r = httpx.post(capped.url + "/v1/records", json={"records": [
        {"kind": "run", "run_id": "lbl", "labels": {f"k{i}": "v" for i in range(1000)}}]})
    assert r.status_code == 422 and "labels" in r.json()["detail"]
    assert len(capped.app.state.services.engine.registry) == 0


def _history_rows(path: Path, sql: str) -> tuple:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchone()
    finally:
        db.close()


def test_new_layer_names_every_step_do_not_grow_the_chart_history_with_their_square(
        capped, tmp_path: Path):
    # One new name a step: a step's vector has a slot for every name known so far, so
    # stored dense the history grows with names^2; and a heatmap would hold every name.
    steps = 600
    result = layer_bomb(capped.url, os.getpid(), names=steps, per_record=1, per_batch=100)
    assert result.accepted == steps
    history = tmp_path / "history.sqlite"
    eventually(lambda: _history_rows(
        history, "SELECT MAX(step) FROM steps WHERE run_id = 'layer-bomb'")[0] == steps,
        timeout=60, interval=0.1, what="the history folded every step")
    stored = _history_rows(history, "SELECT SUM(LENGTH(data)) FROM matrices WHERE "
                                    "run_id = 'layer-bomb' AND stat = 'grad_norm'")[0]
    # Each step carried one number: stored as one position and one value (history/vectors.py)
    # behind an 8-byte header, not as a vector of every name seen so far.
    assert stored <= steps * (8 + 8)
    answer = httpx.get(capped.url + "/v1/runs/layer-bomb/matrix/grad_norm",
                       params={"points": 10_000}).json()
    assert answer["names"] == [f"bomb.{i}.weight" for i in range(100)]
    assert len(answer["steps"]) == steps
