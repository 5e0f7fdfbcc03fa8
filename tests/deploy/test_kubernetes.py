"""deploy/kubernetes: the Job runs the sidecar as a native sidecar, the PodMonitor scrapes
it, and the PrometheusRule holds exactly the rules that promtool tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import DEPLOY, RULE_FILES

K8S = DEPLOY / "kubernetes"


def load(name: str, kind: str | None = None) -> dict:
    docs = list(yaml.safe_load_all((K8S / name).read_text()))
    return next(d for d in docs if kind is None or d["kind"] == kind)


def pod() -> dict:
    return load("training-job.yaml", "Job")["spec"]["template"]


def test_sidecar_is_a_native_sidecar_init_container() -> None:
    spec = pod()["spec"]
    (sidecar,) = spec["initContainers"]
    assert sidecar["name"] == "monitor-agent" and sidecar["restartPolicy"] == "Always"
    assert spec["restartPolicy"] == "Never"
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert sidecar["args"][:1] == ["serve"] and "/data" in sidecar["args"]
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    volumes = {v["name"] for v in spec["volumes"]}
    assert mounts["/data"] in volumes and set(mounts.values()) <= volumes


def test_trainer_reaches_the_sidecar_over_loopback_with_the_shared_token() -> None:
    spec = pod()["spec"]
    sidecar = spec["initContainers"][0]
    (trainer,) = spec["containers"]
    env = {e["name"]: e for e in trainer["env"]}
    port = sidecar["ports"][0]["containerPort"]
    assert env["MONITOR_AGENT_URL"]["value"] == f"http://127.0.0.1:{port}"
    secret = env["MONITOR_AGENT_TOKEN"]["valueFrom"]["secretKeyRef"]
    token_volume = next(v for v in spec["volumes"] if "secret" in v)
    assert token_volume["secret"]["secretName"] == secret["name"] == load("secret.example.yaml")["metadata"]["name"]
    sidecar_env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert sidecar_env["MONITOR_AGENT_TOKEN_FILE"].endswith("/" + secret["key"])


def test_every_node_finds_the_leader_from_what_torchrun_already_has() -> None:
    """One run, one brain: node 0's sidecar leads; the others reach it at MASTER_ADDR, on
    the port every node's sidecar listens on, through the Job's headless Service, and its
    Host check accepts the name (no allowed_hosts to set)."""
    from monitor_agent.serving.browser_guard import host_allowed

    job, service = load("training-job.yaml", "Job"), load("training-job.yaml", "Service")
    spec = pod()["spec"]
    sidecar, (trainer,) = spec["initContainers"][0], spec["containers"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] > 1
    assert spec["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert "--node-rank=$(JOB_COMPLETION_INDEX)" in trainer["command"]
    assert "--master-addr=$(MASTER_ADDR)" in trainer["command"]
    master = env["MASTER_ADDR"].replace("$(POD_NAMESPACE)", "default")
    assert master.startswith(f"{job['metadata']['name']}-0.{service['metadata']['name']}.")
    assert host_allowed(master, [])
    port = sidecar["ports"][0]["containerPort"]
    assert env["MONITOR_AGENT_URL"].endswith(f":{port}") and "0.0.0.0" in sidecar["args"]
    assert port in {p["port"] for p in service["spec"]["ports"]}


def test_a_node_sidecar_follows_the_leader_its_ranks_name_with_a_credential_of_its_own(
        ) -> None:
    """Hostile input, part five: a sidecar follows a leader its ranks name only on its own
    MASTER_ADDR at its own port, so the Pod gives the sidecar the trainer's MASTER_ADDR;
    the link's credential is a Secret key only the sidecar mounts (no job speaks for a
    node)."""
    from monitor_agent.cluster.placement import leader_of
    from monitor_agent.cluster.settings import ClusterSettings
    from monitor_agent.records.types import ClusterPlacement

    spec = pod()["spec"]
    sidecar, (trainer,) = spec["initContainers"][0], spec["containers"]
    trainer_env = {e["name"]: e for e in trainer["env"]}
    sidecar_env = {e["name"]: e for e in sidecar["env"]}
    assert sidecar_env["MASTER_ADDR"]["value"] == trainer_env["MASTER_ADDR"]["value"]
    master = sidecar_env["MASTER_ADDR"]["value"].replace("$(POD_NAMESPACE)", "default")
    port = sidecar["ports"][0]["containerPort"]
    named = ClusterPlacement(node_rank=1, nodes=2, leader_url=f"http://{master}:{port}")
    assert leader_of(named, ClusterSettings(master_addr=master), port) == named.leader_url
    peer_file = sidecar_env["MONITOR_AGENT_CLUSTER__PEER_TOKEN_FILE"]["value"]
    volume = next(v for v in spec["volumes"] if "secret" in v)
    items = {i["key"]: i["path"] for i in volume["secret"]["items"]}
    assert peer_file.endswith("/" + items["peer_token"])
    assert "peer_token" in load("secret.example.yaml")["stringData"]
    assert "peer_token" not in str(trainer)  # the trainer has only the write token


def test_podmonitor_selects_the_pod_and_names_the_job_the_rules_match() -> None:
    monitor = load("podmonitor.yaml")
    labels = pod()["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    port_names = {p["name"] for p in pod()["spec"]["initContainers"][0]["ports"]}
    assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
    job = next(r for r in endpoint["relabelings"] if r["targetLabel"] == "job")
    assert job["replacement"] == "monitor-agent"


def test_prometheusrule_holds_the_same_rules_as_the_rule_files() -> None:
    rule = load("prometheusrule.yaml")
    assert rule["kind"] == "PrometheusRule"
    groups = [g for p in RULE_FILES for g in yaml.safe_load(p.read_text())["groups"]]
    assert rule["spec"]["groups"] == groups, "run: python deploy/kubernetes/make_prometheusrule.py"


@pytest.mark.binaries
def test_prometheusrule_passes_promtool(promtool: str, tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": load("prometheusrule.yaml")["spec"]["groups"]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_generator_reproduces_the_committed_file() -> None:
    code = "import make_prometheusrule as m, sys; sys.stdout.write(m.render())"
    out = subprocess.run([sys.executable, "-c", code], cwd=K8S, capture_output=True, text=True,
                         check=True).stdout
    assert out == (K8S / "prometheusrule.yaml").read_text()
