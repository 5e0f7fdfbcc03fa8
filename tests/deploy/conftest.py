"""Paths of the deployment files, and the Debian binaries that check them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES_DIR = DEPLOY / "prometheus" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.yml"))
DASHBOARD_DIR = REPO / "dashboards"
DASHBOARDS = sorted(DASHBOARD_DIR.glob("*.json"))


def binary(name: str) -> str:
    """The binary's path, or a skip that says how to get it (CI installs them)."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not on PATH: apt-get install prometheus prometheus-alertmanager")
    return path


@pytest.fixture
def promtool() -> str:
    return binary("promtool")


@pytest.fixture
def amtool() -> str:
    return binary("amtool")
