"""``monitor-agent``: serve, replay, check-config, demo.

Example::

    monitor-agent serve --port 9400 --data-dir /var/lib/monitor-agent
    monitor-agent replay run.jsonl.gz --findings-out findings.jsonl
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from pathlib import Path

from monitor_agent import __version__, wire
from monitor_agent.settings import ConfigError, Settings, load_settings


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"monitor-agent: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="monitor-agent", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"monitor-agent {__version__}")
    sub = p.add_subparsers(metavar="COMMAND")

    s = sub.add_parser("serve", help="run the sidecar (HTTP ingest, detectors, alerts, /metrics)")
    s.add_argument("--host", help="bind address (env MONITOR_AGENT_HOST; default 127.0.0.1)")
    s.add_argument("--port", type=int, help="port (env MONITOR_AGENT_PORT; default 9400)")
    s.add_argument("--data-dir", type=Path, help="SQLite directory (env MONITOR_AGENT_DATA_DIR)")
    s.add_argument("--config", type=Path, help="YAML config file (env MONITOR_AGENT_CONFIG)")
    s.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=_serve)

    r = sub.add_parser("replay", help="run trace files through the detectors offline")
    r.add_argument("files", nargs="+", type=Path, help="trace files (.jsonl or .jsonl.gz)")
    r.add_argument("--findings-out", type=Path, help="write every finding as a JSON line here")
    r.add_argument("--config", type=Path, help="YAML config file (detector thresholds)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=_replay)

    c = sub.add_parser("check-config", help="validate a YAML config file and its rules")
    c.add_argument("file", type=Path)
    c.set_defaults(func=_check_config)

    d = sub.add_parser("demo", help="sidecar + a tiny GPT run with an injected fault, no Docker")
    d.add_argument("--inject", default="nan",
                   choices=["nan", "lr-spike", "frozen-layer", "slow-data", "leak", "none"])
    d.add_argument("--steps", type=int, default=300)
    d.add_argument("--inject-step", type=int, default=200)
    d.add_argument("--port", type=int, default=0, help="0 picks a free port")
    d.set_defaults(func=_demo)
    return p


def _config_path(arg: Path | None) -> Path | None:
    import os

    if arg is not None:
        return arg
    env = os.environ.get("MONITOR_AGENT_CONFIG")
    return Path(env) if env else None


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from monitor_agent.app import create_app
    from monitor_agent.server import return_freed_memory, uvicorn_config

    settings = load_settings(
        _config_path(args.config), host=args.host, port=args.port, data_dir=args.data_dir,
        log_level=args.log_level,
    )
    _setup_logging(settings.log_level)
    return_freed_memory()
    app = create_app(settings)
    config = uvicorn_config(app, settings, settings.host, settings.port,
                            log_level=settings.log_level, access_log=False,
                            timeout_graceful_shutdown=10)
    uvicorn.Server(config).run()
    return 0


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _replay(args: argparse.Namespace) -> int:
    from monitor_agent.replay import replay_files

    settings = load_settings(_config_path(args.config))
    _setup_logging("warning")
    missing = [f for f in args.files if not f.is_file()]
    if missing:
        print(f"monitor-agent replay: no such file: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    bar = _progress_bar(args.files, disable=args.quiet)
    try:
        runs = replay_files(args.files, settings, on_record=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    if args.findings_out:
        with args.findings_out.open("wb") as fh:
            for run in runs:
                for f in run.findings:
                    fh.write(wire.dumps(f.to_dict()) + b"\n")
    _print_summary(runs)
    return 0


def _progress_bar(files: list[Path], disable: bool):
    if disable or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(desc="replaying", unit="rec", file=sys.stderr)


def _print_summary(runs) -> None:
    print(f"{'trace':40} {'records':>8} {'last':>6} {'end':>4}  findings (type: count @first step)")
    for run in runs:
        first: dict[str, int] = {}
        counts = Counter(f.type for f in run.findings)
        for f in run.findings:
            first.setdefault(f.type, f.step)
        found = ", ".join(f"{t}: {counts[t]} @{first[t]}" for t in sorted(first, key=first.get))
        name = run.path.name[:40]
        print(f"{name:40} {run.records:>8} {run.last_step:>6} {'yes' if run.ended else 'no':>4}  "
              f"{found or '-'}")


def _check_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.file)
    from monitor_agent.alerting import RuleError, load_rules

    try:
        rules = load_rules(settings.alerting)
    except RuleError as exc:
        print(f"monitor-agent: {exc}", file=sys.stderr)
        return 2
    print(f"{args.file}: OK ({len(rules)} alert rules)")
    print(_redacted_yaml(settings))
    return 0


def _redacted_yaml(settings: Settings) -> str:
    import yaml

    return yaml.safe_dump(settings.redacted(), sort_keys=False)


def _demo(args: argparse.Namespace) -> int:
    from monitor_agent.demo import run_demo

    return run_demo(inject=args.inject, steps=args.steps, inject_step=args.inject_step,
                    port=args.port)
