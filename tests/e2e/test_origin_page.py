"""Through the real sidecar: the page says where the fault started (issue 17), and the run's
API answer carries the effective learning rate. Recorded traces from real CPU runs through
the real client (tests/traces/origin), a real Slack-protocol receiver."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx

from tests.receivers import Receiver

ORIGIN = Path(__file__).resolve().parents[1] / "traces" / "origin"
RULES = """
routes: {page: [slack]}
rules:
  - name: TrainingNanInf
    match: {types: [nan_inf]}
    severity: critical
  - name: TrainingGradExplosion
    match: {types: [grad_explosion]}
    severity: error
"""


def _config(tmp: Path, slack: Receiver) -> Path:
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    config = tmp / "config.yaml"
    config.write_text(
        "tick_interval_seconds: 0.2\n"
        "alerting:\n"
        f"  rules_file: {rules}\n"
        "  group_wait_seconds: 0.05\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/originsecret', "
        "min_interval_seconds: 0}\n"
    )
    return config


def _records(name: str) -> list[dict]:
    with gzip.open(ORIGIN / f"{name}.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


def _post_all(sc, records: list[dict]) -> None:
    for i in range(0, len(records), 100):
        response = sc.post(records[i:i + 100])
        assert response.status_code == 200 and response.json()["rejected"] == [], response.text


def _page_text(slack: Receiver, run_id: str, alert: str) -> str:
    for _ in range(100):
        for r in slack.accepted():
            text = r.body.decode()
            if run_id in text and alert in text:
                return text
        slack.wait_for(len(slack.accepted()) + 1, timeout=0.2)
    raise AssertionError(f"no {alert} page for {run_id}")


def test_pages_name_the_origin_and_the_api_has_the_effective_lr(tmp_path, sidecar_factory):
    with Receiver("slack") as slack:
        sc = sidecar_factory(config=_config(tmp_path, slack))
        sc.start()
        _post_all(sc, _records("nan_forward_gpt"))
        page = _page_text(slack, "nan_forward_gpt", "TrainingNanInf")
        assert "the output of blocks.1.mlp_fc went non-finite first" in page
        assert "pass=forward, origin=blocks.1.mlp_fc" in page  # and in the evidence line

        _post_all(sc, _records("lr_spike_gpt"))
        page = _page_text(slack, "lr_spike_gpt", "TrainingGradExplosion")
        assert "first layer out of its band:" in page
        assert "first_layer_out=" in page  # in the evidence line the page shows, too

        run = httpx.get(f"{sc.url}/v1/runs/lr_spike_gpt", timeout=10).json()
        text = json.dumps(run)
        assert '"effective_lr"' in text
        (rank,) = [v for v in _find(run, "latest")]
        assert isinstance(rank["effective_lr"], float) and rank["effective_lr"] > 0


def _find(obj, key):
    """Every value under ``key`` anywhere in a JSON answer."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                yield v
            yield from _find(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from _find(v, key)
