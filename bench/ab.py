"""Before/after in one run: a bench script on this tree and on an earlier revision, interleaved.

A refactor or an optimisation is judged by a ratio measured under the same load, not by
two numbers taken an hour apart on a machine whose neighbours changed. This checks the
earlier revision out into a temporary git worktree, then runs the same bench script in
both trees alternately (base, new, base, new, ...), each with its own tree first on
``PYTHONPATH`` so each imports its own code. Every line a script prints is a row: the
line with its numbers blanked is the row's key, and per row the median of each number
over the rounds is compared as new/base.

    python -m bench.ab --rev main~3 -- bench.ingest --seconds 5 --clients 1 8
    python -m bench.ab --rev v0.1 --rounds 3 -- bench.client_overhead --reps 3

The script is named as a module (``bench.ingest``); a revision from before bench/ was a
package (no ``bench/__init__.py``) runs the same script by its path, ``bench/ingest.py``.
Lines whose numbers are not figures (a header, a payload size) show a ratio of 1.00.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def rows(text: str) -> Iterator[tuple[str, list[float]]]:
    """(key, numbers) per output line; a JSON object line is flattened, one row a leaf.
    A key seen again in the same output (one table row per client count) gets ``#2``..."""
    seen: dict[str, int] = {}
    for key, numbers in _rows(text):
        seen[key] = seen.get(key, 0) + 1
        yield (key if seen[key] == 1 else f"{key} #{seen[key]}"), numbers


def _rows(text: str) -> Iterator[tuple[str, list[float]]]:
    for line in text.splitlines():
        line = line.rstrip()
        if line.startswith("{"):
            try:
                yield from _flatten("", json.loads(line))
                continue
            except ValueError:
                pass
        numbers = [float(x) for x in NUMBER.findall(line)]
        if numbers:
            # Widths change with the numbers: the key is the words in order.
            yield " ".join(NUMBER.sub("#", line).split()), numbers


def _flatten(prefix: str, obj: object) -> Iterator[tuple[str, list[float]]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(f"{prefix}.{k}" if prefix else str(k), v)
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        yield prefix, [float(obj)]


def command(tree: Path, script: list[str]) -> list[str]:
    """``python -m bench.X ARGS`` in a tree where bench/ is a package, ``python
    bench/X.py ARGS`` in an older one; ``script[0]`` may be either spelling."""
    name = script[0].removesuffix(".py").replace("/", ".")
    if (tree / "bench" / "__init__.py").is_file():
        return [sys.executable, "-m", name, *script[1:]]
    return [sys.executable, name.replace(".", "/") + ".py", *script[1:]]


def run(tree: Path, script: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(tree / "client")]))
    done = subprocess.run(command(tree, script), cwd=tree, env=env, text=True,
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed in {tree}:\n{done.stderr[-2000:]}")
    return done.stdout


def medians(outputs: list[str]) -> dict[str, list[float]]:
    """Per row key, the median of each number position over the rounds."""
    seen: dict[str, list[list[float]]] = {}
    for out in outputs:
        for key, numbers in rows(out):
            seen.setdefault(key, []).append(numbers)
    return {key: [statistics.median(col) for col in zip(*runs, strict=False)]
            for key, runs in seen.items()}


def report(base: dict[str, list[float]], new: dict[str, list[float]]) -> None:
    for key, after in new.items():
        before = base.get(key)
        if before is None or len(before) != len(after):
            continue
        ratios = [f"{a / b:.2f}" if b else "-" for a, b in zip(after, before, strict=True)]
        print(key)
        print(f"    base  {' '.join(f'{v:.4g}' for v in before)}")
        print(f"    new   {' '.join(f'{v:.4g}' for v in after)}")
        print(f"    ratio {' '.join(ratios)}   (new/base)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", required=True, help="the earlier revision (any git rev)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each tree, interleaved")
    ap.add_argument("script", nargs=argparse.REMAINDER, help="-- bench.SCRIPT [args]")
    args = ap.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base_tree), args.rev],
                       cwd=REPO, check=True)
        try:
            outs: dict[str, list[str]] = {"base": [], "new": []}
            for i in range(args.rounds):
                for name, tree in (("base", base_tree), ("new", REPO)):
                    print(f"round {i + 1}/{args.rounds}: {name}", file=sys.stderr)
                    outs[name].append(run(tree, script))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO,
                           check=False)
    print(f"{' '.join(script)}: median of {args.rounds} interleaved rounds, base = {args.rev}")
    report(medians(outs["base"]), medians(outs["new"]))


if __name__ == "__main__":
    main()
