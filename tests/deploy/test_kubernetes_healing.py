"""deploy/kubernetes, healing: the JobSet runs a Pod again when it exits 75 and tells its
client so; the sidecar writes its drain state where Node Problem Detector's plugin reads
it; and the plugin speaks NPD's custom-plugin protocol about the state a real sidecar's
drain wrote (exit 0 OK, 1 the problem with the reason, 2 unknown)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml
from conftest import DEPLOY

from monitor_agent.cluster.drain import DrainSettings, NodeDrain

K8S = DEPLOY / "kubernetes"
NPD = K8S / "node-problem-detector"


def _jobset() -> dict:
    return next(d for d in yaml.safe_load_all((K8S / "training-jobset.yaml").read_text())
                if d["kind"] == "JobSet")


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_the_jobset_runs_every_pod_again_when_one_exits_to_be_restarted() -> None:
    jobset = _jobset()
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] >= 3  # above restart_budget
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (trainer,) = pod["containers"]
    env = _env(trainer)
    assert env["MONITOR_AGENT_RESTARTS"] == "1" and env["MONITOR_AGENT_RUN_ID"]
    (sidecar,) = pod["initContainers"]
    state = _env(sidecar)["MONITOR_AGENT_CLUSTER__DRAIN__STATE_FILE"]
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # The state file is on the node, where NPD's DaemonSet mounts the same hostPath.
    host = volumes[mounts[str(Path(state).parent)]]["hostPath"]["path"]
    assert host == "/var/run/monitor-agent" and state.startswith(host)
    plugin = (NPD / "monitor-agent-node.sh").read_text()
    assert f"${{MONITOR_AGENT_NODE_FILE:-{state}}}" in plugin


def test_the_npd_config_and_configmap_hold_the_plugin_as_committed() -> None:
    config = json.loads((NPD / "monitor-agent-node.json").read_text())
    assert config["plugin"] == "custom"
    [rule] = config["rules"]
    assert rule["condition"] == config["conditions"][0]["type"] == "MonitorAgentNodeLeftOut"
    assert rule["path"] == "/config/plugin/monitor-agent-node.sh"
    configmap = yaml.safe_load((NPD / "configmap.yaml").read_text())
    assert json.loads(configmap["data"]["monitor-agent-node.json"]) == config
    assert configmap["data"]["monitor-agent-node.sh"] == (NPD / "monitor-agent-node.sh").read_text()


def _plugin(state: Path) -> tuple[int, str]:
    done = subprocess.run(["sh", str(NPD / "monitor-agent-node.sh")], capture_output=True,
                          text=True, timeout=30, check=False,
                          env={**os.environ, "MONITOR_AGENT_NODE_FILE": str(state)})
    return done.returncode, done.stdout.strip()


def test_the_plugin_reports_the_state_a_sidecars_drain_wrote(tmp_path: Path) -> None:
    state = tmp_path / "run" / "node.json"
    drain = NodeDrain(DrainSettings(state_file=str(state)), tmp_path / "data")
    assert _plugin(state) == (0, "no training run left this node out")
    drain.drain("train-gpt", 3, "hard GPU error (xid 79) at step 4200")
    assert _plugin(state) == (1, "left out: monitor-agent run train-gpt action 3: hard GPU "
                                 "error (xid 79) at step 4200")
    drain.clear()
    assert not state.exists() and _plugin(state)[0] == 0
    state.write_text("{not json")
    assert _plugin(state)[0] == 2
