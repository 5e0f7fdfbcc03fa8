"""Issue 23, item 2 on real parts: a 4-process DDP job (gloo on loopback, one process per
rank as torchrun starts them, ``tests/e2e/ddp_rank_fault_train.py``), the real client in
each rank, a real sidecar paging a local Slack receiver.

1. rank 2's input batch gets a NaN at step 20: every rank's reduced gradient is NaN at that
   step and every loss after it; the run pages once, naming rank 2 and its node as first
   and saying ranks 0, 1, 3 followed through the gradient all-reduce;
2. rank 3's labels are scaled x5 from step 40 (a corrupt shard, never NaN): the
   ``rank_outlier`` warning names rank 3 and its node, and no other rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.ddp_job import ddp_job
from tests.eventually import eventually
from tests.receivers import Receiver
from tests.sidecar_process import SidecarProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]



@pytest.fixture
def slack():
    with Receiver("slack") as receiver:
        yield receiver


@pytest.fixture
def paging_sidecar(tmp_path: Path, sidecar_factory, slack) -> SidecarProcess:
    config = tmp_path / "config.yaml"
    config.write_text(f"alerting:\n  group_wait_seconds: 0.05\n"
                      f"  slack: {{webhook_url: '{slack.url}/hook', min_interval_seconds: 0}}\n")
    return sidecar_factory(config=config).start()


def _messages(slack: Receiver, needle: str, timeout: float = 20.0) -> list[str]:
    def hits() -> list[str]:
        texts = [json.dumps(r.json) for r in slack.requests if r.json]
        found = [t for t in texts if needle in t]
        assert found, texts
        return found

    return eventually(hits, timeout=timeout, interval=0.1, what=f"a message with {needle!r}")


def _findings(sc: SidecarProcess, run_id: str, ftype: str) -> list[dict]:
    import httpx

    body = httpx.get(f"{sc.url}/v1/runs/{run_id}/findings?limit=10000", timeout=10).json()
    return [f for f in body["findings"] if f["type"] == ftype]


def test_the_rank_whose_input_went_nan_is_paged_as_first(paging_sidecar, slack):
    ddp_job(paging_sidecar.url, "ddp-nan", "--steps", "30", "--nan-rank", "2", "--nan-step", "20")
    pages = _messages(slack, "[FIRING:1] run ddp-nan: TrainingNanInf")
    assert len(pages) == 1, pages  # once for the run, not once per rank
    assert ("NaN first on rank 2 (host gpu-node-2) at step 20: its local loss is nan; "
            "ranks 0, 1, 3 followed at step 20 through the gradient all-reduce (their loss "
            "finite, grad_norm nan)") in pages[0], pages[0]
    found = sorted(_findings(paging_sidecar, "ddp-nan", "nan_inf"), key=lambda f: f["step"])
    # The onset and the persistence milestone (3 steps non-finite), both the first rank's:
    # a rule's action_after counts the run's episode, not its ranks.
    assert [(f["step"], f["rank"]) for f in found] == [(20, 2), (22, 2)], found
    onset = found[0]
    assert onset["evidence"]["first_host"] == "gpu-node-2"
    assert onset["evidence"]["followed"] == "0, 1, 3"


def test_a_rank_with_a_corrupt_shard_is_warned_about(paging_sidecar, slack):
    ddp_job(paging_sidecar.url, "ddp-shard", "--steps", "100", "--corrupt-rank", "3",
         "--corrupt-from", "40", "--corrupt-scale", "5")
    found = _findings(paging_sidecar, "ddp-shard", "rank_outlier")
    assert found and {f["rank"] for f in found} == {3}, found
    first = found[0]
    assert first["step"] >= 40 and first["evidence"]["since_step"] >= 40
    assert first["message"].startswith("rank 3 (host gpu-node-3): local loss")
    assert _messages(slack, "rank 3 (host gpu-node-3): local loss")
    assert _findings(paging_sidecar, "ddp-shard", "nan_inf") == []
