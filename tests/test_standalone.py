"""The repository stands alone: a `git clone` with nothing beside it has every file its
tests, benches and docs point at, and no tracked file points outside it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()

# Places outside the repository that files once pointed at: a sibling checkout, the
# machine's own directories, and the traces' old home with its format document.
OUTSIDE = re.compile("|".join([
    r"\.\./" + "shared",          # ../shared/...
    r"(?<![\w/])" + "shared/traces",
    r"/work/" + r"(?:shared|main|wt)\b",
    "FORMAT" + r"\.md",           # the old format document; now docs/format.md
]))
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             check=True, timeout=60).stdout
        paths = [REPO / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # an export without .git
        skip = {".git", ".venv", "__pycache__", "monitor-data", ".ruff_cache"}
        paths = [p for p in REPO.rglob("*") if p.is_file() and not skip & set(p.parts)]
    texts = []
    for path in paths:
        if path.resolve() == THIS or not path.is_file():
            continue
        head = path.read_bytes()[:4096]
        if b"\0" in head or head[:2] == b"\x1f\x8b":
            continue  # binary or gzip data
        texts.append(path)
    return texts


def test_no_tracked_file_points_outside_the_repository():
    offenders = []
    for path in _tracked_text_files():
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()[:120]}")
    assert not offenders, "paths outside the repository:\n" + "\n".join(offenders)


def test_relative_links_in_docs_resolve_inside_the_repository():
    broken = []
    for path in _tracked_text_files():
        if path.suffix != ".md":
            continue
        for target in MD_LINK.findall(path.read_text(errors="replace")):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append(f"{path.relative_to(REPO)}: {target}")
    assert not broken, "links that leave the repository or lead nowhere:\n" + "\n".join(broken)


@pytest.mark.parametrize("directory", ["tests/traces/public", "tests/traces"])
def test_the_labelled_traces_tests_and_benches_read_are_in_the_repository(directory):
    root = REPO / directory
    labels = json.loads((root / "labels.json").read_text())
    entries = labels if isinstance(labels, list) else list(labels.values())
    files = [e["file"] if isinstance(e, dict) else e for e in entries]
    assert files, f"{directory}/labels.json lists no trace"
    missing = [f for f in files if not (root / f).is_file()]
    assert not missing, f"{directory}: labelled but missing: {missing}"


def test_tests_and_benches_point_at_the_in_repository_traces():
    conftest = (REPO / "tests" / "conftest.py").read_text()
    assert 'TRACES = REPO / "tests" / "traces" / "public"' in conftest
    bench = (REPO / "bench" / "detection.py").read_text()
    assert 'TRACES = Path(__file__).resolve().parents[1] / "tests" / "traces" / "public"' in bench
