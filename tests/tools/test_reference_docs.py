"""The generated reference pages (docs/reference/) are what the code produces now, and the
generator's check finds a stale one."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from pydantic.fields import FieldInfo

from monitor_agent.tools import reference_docs
from monitor_agent.tools.reference_docs import PAGES, REFERENCE_DIR, REFRESH, main, stale, write


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_committed_page_is_what_the_code_produces(name: str) -> None:
    page = REFERENCE_DIR / name
    assert page.is_file(), f"docs/reference/{name} is missing; run `{REFRESH}`"
    assert page.read_text(encoding="utf-8") == PAGES[name](), (
        f"docs/reference/{name} is stale (the code it describes changed); run `{REFRESH}` "
        "and commit the result")


def test_pages_are_deterministic_and_name_no_temporary_path() -> None:
    first = {name: page() for name, page in PAGES.items()}
    assert first == {name: page() for name, page in PAGES.items()}
    temp = tempfile.gettempdir()
    assert not [name for name, text in first.items() if temp in text]


def test_check_names_a_stale_page_and_write_mends_it(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert write(tmp_path) == sorted(PAGES)
    assert main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "metrics.md").write_text("# an old table\n", encoding="utf-8")
    (tmp_path / "api.md").unlink()
    assert stale(tmp_path) == ["api.md", "metrics.md"]
    assert main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "metrics.md is stale" in err and "api.md is stale" in err and REFRESH in err
    assert main(["--out", str(tmp_path)]) == 0
    assert stale(tmp_path) == []


def test_every_key_metric_and_route_is_on_its_page() -> None:
    """Spot checks that each page is read from its source, not a fixed list."""
    assert "`MONITOR_AGENT_CLUSTER__LEADER_URL`" in PAGES["configuration.md"]()
    assert "`training_steps_total` | counter" in PAGES["metrics.md"]()
    assert "`monitor_agent_notifications_total` | counter | `channel`, `outcome`" in (
        PAGES["metrics.md"]())
    assert "## `GET /v1/runs/{run_id}/goodput`" in PAGES["api.md"]()
    detectors = PAGES["detectors.md"]()
    assert "## `nan_inf`" in detectors and "`spike_z` | `6.0`" in detectors
    # A field with no description says so rather than inventing one.
    rows = reference_docs._knob_rows({"quiet_knob": FieldInfo(default=3),
                                      "said_seconds": FieldInfo(default=1.5, description="Why.")})
    assert rows == [("`quiet_knob`", "`3`", "", "", reference_docs.NO_DESCRIPTION),
                    ("`said_seconds`", "`1.5`", "seconds", "", "Why.")]
