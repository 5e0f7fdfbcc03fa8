"""Writes dashboards/*.json from the Python definitions beside it.

The committed JSON is what Grafana loads; edit the Python and regenerate:

    python -m dashboards.generate          # rewrite the JSON files
    python -m dashboards.generate --check  # exit 1 if a JSON file is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dashboards import fleet, layers, training_run
from dashboards.panels import Json

HERE = Path(__file__).resolve().parent
BOARDS = {"training-run.json": training_run.build, "layers.json": layers.build,
          "fleet.json": fleet.build}


def render(board: Json) -> str:
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"


def stale() -> list[str]:
    """Files whose content differs from what the definitions produce."""
    return [name for name, build in BOARDS.items()
            if not (HERE / name).exists() or (HERE / name).read_text() != render(build())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"dashboards/{name} is out of date: run python -m dashboards.generate")
        return 1 if names else 0
    for name, build in BOARDS.items():
        (HERE / name).write_text(render(build()))
        print(f"wrote dashboards/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
