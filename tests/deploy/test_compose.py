"""docker-compose.yml, .env.example and the Dockerfile, checked without a Docker engine:
every mounted path exists, healthchecks and ports agree with the configs they serve."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import DEPLOY, REPO

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
DOCKERFILE = (DEPLOY / "Dockerfile").read_text()
# The port each service listens on inside its container.
PORTS = {"monitor-agent": 9400, "prometheus": 9090, "alertmanager": 9093, "grafana": 3000}
VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def env_example() -> dict[str, str]:
    lines = (REPO / ".env.example").read_text().splitlines()
    pairs = [line.split("=", 1) for line in lines if line and not line.startswith("#")]
    return {k: v for k, v in pairs}


def test_the_four_services_with_pinned_images() -> None:
    assert set(SERVICES) == set(PORTS)
    for name, svc in SERVICES.items():
        if name == "monitor-agent":
            assert svc["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
            continue
        image, _, tag = svc["image"].partition(":")
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: pin an exact version, not {tag!r}"


@pytest.mark.parametrize("name", sorted(PORTS))
def test_every_bind_mount_exists_in_the_repo(name: str) -> None:
    for volume in SERVICES[name].get("volumes", []):
        source = volume.split(":")[0]
        if source.startswith("."):
            assert (REPO / source).exists(), f"{name} mounts missing {source}"
        else:
            assert source in COMPOSE["volumes"], f"{name}: undeclared volume {source}"


@pytest.mark.parametrize("name", sorted(PORTS))
def test_healthcheck_and_published_port_match_the_service(name: str) -> None:
    svc = SERVICES[name]
    port = PORTS[name]
    test = " ".join(svc["healthcheck"]["test"])
    assert f"127.0.0.1:{port}/" in test
    published = [p for p in svc["ports"] if p.endswith(f":{port}")]
    assert len(published) == 1, f"{name} must publish container port {port}"


def test_health_endpoints_are_the_real_ones() -> None:
    hc = {n: " ".join(s["healthcheck"]["test"]) for n, s in SERVICES.items()}
    assert "/readyz" in hc["monitor-agent"] and "/readyz" in DOCKERFILE
    assert "/-/ready" in hc["prometheus"] and "/-/ready" in hc["alertmanager"]
    assert "/api/health" in hc["grafana"]


def test_startup_order_waits_for_health() -> None:
    for name, svc in SERVICES.items():
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in SERVICES and cond == {"condition": "service_healthy"}, name
    assert "alertmanager" in SERVICES["monitor-agent"]["depends_on"]
    assert "prometheus" in SERVICES["grafana"]["depends_on"]


def test_service_names_and_ports_are_what_the_configs_reach() -> None:
    prom = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    assert "monitor-agent:9400" in prom and "alertmanager:9093" in prom
    sources = (DEPLOY / "grafana" / "provisioning" / "datasources" / "monitor-agent.yml").read_text()
    assert "http://prometheus:9090" in sources and "http://alertmanager:9093" in sources
    env = SERVICES["monitor-agent"]["environment"]
    assert env["MONITOR_AGENT_ALERTING__ALERTMANAGER__URLS"] == '["http://alertmanager:9093"]'
    assert "--config.file=/etc/prometheus/prometheus.yml" in SERVICES["prometheus"]["command"]
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in SERVICES["alertmanager"]["command"]


def test_every_variable_is_documented_in_env_example_with_a_default() -> None:
    documented = env_example()
    text = (REPO / "docker-compose.yml").read_text()
    used = {m[1]: m[2] for m in VAR.finditer(text)}
    assert used.keys() == documented.keys(), sorted(used.keys() ^ documented.keys())
    for var in used:
        assert f"${{{var}:-" in text, f"{var} has no default: compose would fail without .env"


def test_secrets_reach_alertmanager_as_the_files_its_config_reads() -> None:
    am = (DEPLOY / "alertmanager" / "alertmanager.yml").read_text()
    targets = {c["target"] for c in SERVICES["alertmanager"]["configs"]}
    assert targets == {"/run/secrets/slack_webhook_url", "/run/secrets/pagerduty_routing_key"}
    for target in targets:
        assert target in am
    assert COMPOSE["configs"]["slack_webhook_url"]["content"] == "${SLACK_WEBHOOK_URL:-}"
    assert SERVICES["monitor-agent"]["environment"]["MONITOR_AGENT_TOKEN"] == "${MONITOR_AGENT_TOKEN:-}"


def test_dockerfile_is_slim_non_root_with_a_data_volume() -> None:
    froms = re.findall(r"^FROM (\S+)", DOCKERFILE, re.M)
    assert froms and all(f == "python:3.11-slim" for f in froms)
    assert re.search(r"^USER 10001$", DOCKERFILE, re.M)
    assert 'VOLUME ["/data"]' in DOCKERFILE and "EXPOSE 9400" in DOCKERFILE
    assert re.search(r"^HEALTHCHECK .*\n.*urllib.request.urlopen\('http://127.0.0.1:9400/readyz'", DOCKERFILE, re.M)
    cmd = re.search(r"^CMD (.*)$", DOCKERFILE, re.M)[1]
    assert cmd == '["serve", "--host", "0.0.0.0", "--port", "9400", "--data-dir", "/data"]'


def test_the_runtime_image_has_ss_for_the_tcp_probe() -> None:
    """The slim image has no iproute2; without `ss` the sidecar's TCP probe is off
    (cluster/tcp_probe.py), and no network-slow verdict comes from its node."""
    runtime = DOCKERFILE[DOCKERFILE.rindex("\nFROM "):]
    assert re.search(r"apt-get install -y --no-install-recommends iproute2", runtime)
    assert runtime.index("iproute2") < runtime.index("\nUSER 10001")  # installed as root


def test_dockerfile_copies_only_what_exists_and_dockerignore_lets_through() -> None:
    copies = re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE, re.M)
    sources = [s for line in copies for s in line.split()]
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    for source in sources:
        assert (REPO / source).exists(), f"Dockerfile copies missing {source}"
        assert f"!{source}" in ignore, f".dockerignore excludes {source}"


def test_dockerfile_build_stage_runs_natively(tmp_path: Path) -> None:
    # The build stage's own step on exactly the files it copies (offline: --no-deps and the
    # setuptools already here): the wheel has the package and the `monitor-agent` command.
    src = tmp_path / "src"
    shutil.copytree(REPO / "monitor_agent", src / "monitor_agent",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "wheels"), str(src)],
                   check=True, capture_output=True, timeout=120)
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "monitor_agent/cli.py" in names and "monitor_agent/serving/app.py" in names
    assert "monitor-agent = monitor_agent.cli:main" in entry_points
