"""With ``auth_reads``, ``/metrics`` needs the token, and the real Prometheus binary scrapes
it with the ``authorization: {credentials_file: ...}`` that docs/deploy.md and the
Kubernetes README prescribe for the shipped scrape job; a job without it is refused."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.test_stack import DEPLOY, Binary, have
from tests.eventually import eventually
from tests.sidecar_process import SidecarProcess, free_port

TOKEN = "scrape-token-7d41c2"


def test_prometheus_scrapes_a_guarded_metrics_endpoint_with_the_token(tmp_path: Path):
    if not have("prometheus"):
        pytest.skip("prometheus not on PATH: apt-get install prometheus")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {"MONITOR_AGENT_TOKEN_FILE": str(token_file), "MONITOR_AGENT_AUTH_READS": "true"}
    with SidecarProcess(tmp_path / "data", env=env) as sc:
        auth = {"authorization": f"Bearer {TOKEN}"}
        steps = [{"kind": "step", "run_id": "scraped", "step": s, "time": 1.0 + s, "loss": 2.5}
                 for s in range(1, 4)]
        assert sc.post(steps, headers=auth).status_code == 200
        assert httpx.get(sc.url + "/metrics").status_code == 401
        target = sc.url.removeprefix("http://")
        config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        [job] = [j for j in config["scrape_configs"] if j["job_name"] == "monitor-agent"]
        job.update(scrape_interval="1s", scrape_timeout="1s",
                   static_configs=[{"targets": [target]}],
                   authorization={"credentials_file": str(token_file)})
        without = {**job, "job_name": "no-token"}
        del without["authorization"]
        prom_port = free_port()
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(
            {"global": {"scrape_interval": "1s"}, "scrape_configs": [job, without]}))
        prom = Binary(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                       f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                       f"--web.listen-address=127.0.0.1:{prom_port}"],
                      tmp_path / "prometheus.log", f"http://127.0.0.1:{prom_port}/-/ready")
        try:
            def query(expr: str) -> list[dict]:
                r = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/query",
                              params={"query": expr})
                return list(r.json()["data"]["result"])

            eventually(lambda: query('training_loss{run_id="scraped"}'), timeout=30, interval=0.5,
                       what="the run's loss scraped with the token", context=prom.tail)
            up = eventually(lambda: query('up{job="no-token"}'), timeout=30, interval=0.5,
                            what="the tokenless scrape")
            assert up[0]["value"][1] == "0"  # 401: Prometheus marks the target down
            assert query('up{job="monitor-agent"}')[0]["value"][1] == "1"
        finally:
            prom.stop()
