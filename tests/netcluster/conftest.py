"""The netcluster fixtures: a cluster needs root (namespaces, veths, cgroups, tc). Without
it a test skips and says why, except under ``CI=true`` (tests/ci_strict.py): CI runs as
root, so there a missing privilege is a broken machine and fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netcluster import Cluster, unavailable


@pytest.fixture(scope="session")
def privileged() -> None:
    """Skips (fails under CI=true) where no cluster can be made."""
    require_cluster()


def require_cluster() -> None:
    why = unavailable()
    if why is not None:
        pytest.skip(f"netcluster: {why}")


@pytest.fixture
def small_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Two nodes, nothing started on them."""
    require_cluster()
    with Cluster(tmp_path / "cluster", nodes=2) as cluster:
        yield cluster
