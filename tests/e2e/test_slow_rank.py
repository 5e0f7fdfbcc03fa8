"""The proof of issue 23, item 3: a 4-process gloo DDP run on loopback, launched with
torchrun as users launch it (``slow_loader_ddp.py``, the real client), into a real sidecar
with the shipped alert rules and a real Slack-protocol receiver.

One rank's data loader slowed: one straggler page naming that rank and data loading as the
cause. Every rank's loader slowed: one input-bound page for the run, and no straggler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.eventually import eventually
from tests.receivers import Receiver
from tests.sidecar_process import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "e2e" / "slow_loader_ddp.py"


@pytest.fixture
def slack() -> Receiver:
    with Receiver("slack") as receiver:
        yield receiver


@pytest.fixture
def paging_sidecar(tmp_path: Path, sidecar_factory, slack: Receiver):
    config = tmp_path / "config.yaml"  # the shipped default rules: no rules_file
    config.write_text("alerting:\n  group_wait_seconds: 0.05\n"
                      f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/slowsecret', "
                      "min_interval_seconds: 0}\n")
    return sidecar_factory(config=config).start()


def _train(url: str, run_id: str, slow: str, tmp: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
           "--master-port", str(free_port()), str(SCRIPT), "--url", url, "--run-id", run_id,
           "--slow-ranks", slow, "--steps", "60", "--spool-dir", str(tmp / "spool")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _pages(slack: Receiver, sc, run_id: str, alert: str) -> list[str]:
    """The firing Slack messages of ``alert`` for ``run_id``, once the run's end was
    handled (its alerts resolved: nothing more is coming)."""
    def resolved() -> list[str]:
        texts = [r.body.decode() for r in slack.accepted()]
        assert any(run_id in t and "RESOLVED" in t.upper() for t in texts), texts
        return texts

    texts = eventually(resolved, timeout=20, interval=0.1, what=f"{run_id}'s alerts resolved")
    return [t for t in texts if run_id in t and alert in t and "FIRING" in t]


@pytest.mark.slow
def test_one_slow_loader_pages_once_naming_the_rank_and_data_loading(
        paging_sidecar, slack, tmp_path):
    _train(paging_sidecar.url, "slow-loader", "2", tmp_path)
    pages = _pages(slack, paging_sidecar, "slow-loader", "TrainingStraggler")
    assert len(pages) == 1, [json.loads(p) for p in pages]
    assert "rank 2 is the straggler: its data loading takes" in pages[0]
    assert "waiting for it in the all-reduce" in pages[0]
    assert _pages(slack, paging_sidecar, "slow-loader", "TrainingInputBound") == []
    steps = [r for r in paging_sidecar.records("slow-loader") if r["kind"] == "step"]
    waits = {r["rank"]: r["sync_wait_time"] for r in steps if r["step"] == 40}
    assert min(waits, key=waits.__getitem__) == 2  # the one rank that does not wait
    # the per-rank split is on /metrics too (capped with the other per-rank gauges)
    metrics = httpx.get(paging_sidecar.url + "/metrics", timeout=10).text
    for name in ("training_sync_wait_seconds", "training_compute_seconds"):
        assert sum(line.startswith(name + "{") and 'run_id="slow-loader"' in line
                   for line in metrics.splitlines()) == 4, name


@pytest.mark.slow
def test_every_slow_loader_is_one_input_bound_page(paging_sidecar, slack, tmp_path):
    _train(paging_sidecar.url, "all-slow", "all", tmp_path)
    pages = _pages(slack, paging_sidecar, "all-slow", "TrainingInputBound")
    assert len(pages) == 1, pages
    assert "input-bound: every rank waits on its data loader" in pages[0]
    assert "num_workers" in pages[0]
    assert _pages(slack, paging_sidecar, "all-slow", "TrainingStraggler") == []
