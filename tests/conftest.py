"""Shared fixtures: a real sidecar (subprocess or in-process uvicorn) and trace paths."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "client", REPO / "tests"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from sidecar_process import SidecarProcess  # noqa: E402

TRACES = REPO.parent / "shared" / "traces" / "public"


@pytest.fixture
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"public traces not found at {TRACES}")
    return TRACES


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[SidecarProcess]:
    """A running sidecar subprocess on a free port; ``kill()``/``start()`` to crash it."""
    proc = SidecarProcess(tmp_path / "data")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def sidecar_factory(tmp_path: Path) -> Iterator[type[SidecarProcess]]:
    """Build sidecars with a config file or env of your own; all stopped at teardown."""
    made: list[SidecarProcess] = []

    def make(config: Path | None = None, env: dict[str, str] | None = None,
             data_dir: Path | None = None) -> SidecarProcess:
        proc = SidecarProcess(data_dir or tmp_path / f"data{len(made)}", config=config, env=env)
        made.append(proc)
        return proc

    try:
        yield make  # type: ignore[misc]
    finally:
        for proc in made:
            proc.stop()
