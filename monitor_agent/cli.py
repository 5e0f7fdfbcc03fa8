"""``monitor-agent``: serve, replay, export, push-spool, check-config, demo.

``monitor-agent serve --port 9400 --data-dir /var/lib/monitor-agent`` runs the sidecar;
``monitor-agent export gpt-7 -o gpt-7.jsonl.gz --data-dir /var/lib/monitor-agent`` writes a
stored run as a trace file, and ``monitor-agent replay`` runs trace files through the
detectors offline (``--findings-out findings.jsonl``, ``--report report.html``). Replaying
a run that hung after eight steps, as ``main`` does for the command line::

    >>> import json, tempfile
    >>> steps = [{"kind": "step", "run_id": "r1", "step": s, "time": 10.0 * s, "loss": 2.0}
    ...          for s in range(1, 9)]
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     trace = Path(tmp, "hung.jsonl")
    ...     _ = trace.write_text("".join(json.dumps(step) + "\\n" for step in steps))
    ...     main(["replay", "--quiet", str(trace)])
    trace ... findings (type: count @first step)
    hung.jsonl     8     8   no  stalled: 1 @8
    0
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from monitor_agent import __version__
from monitor_agent.alerting.rules import RuleError
from monitor_agent.errors import MonitorAgentError
from monitor_agent.records import wire
from monitor_agent.settings import ConfigError, Settings, load_settings

if TYPE_CHECKING:  # both import heavy modules; the CLI imports them only when needed
    from tqdm import tqdm

    from monitor_agent.pipeline.trace_judge import JudgedTrace


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except MonitorAgentError as exc:
        # Worded for the person at the terminal already: one line, no traceback. A broken
        # config or rules file is the whole tool's; any other failure names the command.
        where = "" if isinstance(exc, ConfigError | RuleError) else f" {args.command}"
        print(f"monitor-agent{where}: {exc}", file=sys.stderr)
        return args.failed


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="monitor-agent", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"monitor-agent {__version__}")
    # ``failed``: the exit status of a command that fails with a MonitorAgentError.
    p.set_defaults(failed=2)
    sub = p.add_subparsers(metavar="COMMAND", dest="command")

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
    r.add_argument("--report", type=Path, metavar="HTML",
                   help="write a self-contained HTML report (charts, every finding marked)")
    r.set_defaults(func=_replay)

    e = sub.add_parser("export", help="write a stored run as a trace file replay accepts")
    e.add_argument("run_id")
    e.add_argument("-o", "--output", type=Path, required=True, help="trace file (.jsonl[.gz])")
    src = e.add_mutually_exclusive_group()
    src.add_argument("--data-dir", type=Path, help="the sidecar's data directory (default: "
                     "env MONITOR_AGENT_DATA_DIR or monitor-data)")
    src.add_argument("--url", help="a running sidecar, e.g. http://127.0.0.1:9400")
    e.add_argument("--token", help="bearer token for --url (env MONITOR_AGENT_TOKEN)")
    e.set_defaults(func=_export, failed=1)

    ps = sub.add_parser("push-spool", help="send the records a client left in its spool")
    ps.add_argument("path", type=Path, help="a run's spool directory (<run_id>-r<rank>), the "
                    "spool base holding several, or one .ndjson segment")
    ps.add_argument("--url", help="the sidecar (env MONITOR_AGENT_URL; default "
                    "http://127.0.0.1:9400)")
    ps.add_argument("--token", help="bearer token (env MONITOR_AGENT_TOKEN)")
    ps.add_argument("--keep", action="store_true", help="keep the files once sent")
    ps.set_defaults(func=_push_spool, failed=1)

    c = sub.add_parser("check-config", help="validate a YAML config file and its rules")
    c.add_argument("file", type=Path)
    c.set_defaults(func=_check_config)

    d = sub.add_parser("demo", help="sidecar + a tiny GPT run with an injected fault, no Docker")
    d.add_argument("--inject", default="nan",
                   choices=["nan", "lr-spike", "frozen-layer", "slow-data", "leak", "none"])
    d.add_argument("--steps", type=int, default=300)
    d.add_argument("--inject-step", type=int, default=200)
    d.add_argument("--port", type=int, default=0, help="0 picks a free port")
    d.add_argument("--exit-after", type=float, metavar="SECONDS",
                   help="stop serving this long after the run (default: serve until Ctrl-C)")
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

    from monitor_agent.serving.app import create_app
    from monitor_agent.serving.server import return_freed_memory, uvicorn_config
    from monitor_agent.storage.data_lock import DataDirLock

    settings = load_settings(
        _config_path(args.config), host=args.host, port=args.port, data_dir=args.data_dir,
        log_level=args.log_level,
    )
    _setup_logging(settings.log_level)
    # One clear line now (DataDirInUse); the app's lifespan takes the lock for real, for its life.
    DataDirLock(settings.data_dir).acquire().release()
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
    from monitor_agent.pipeline.trace_judge import judge_traces

    settings = load_settings(_config_path(args.config))
    _setup_logging("warning")
    missing = [f for f in args.files if not f.is_file()]
    if missing:
        print(f"monitor-agent replay: no such file: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    if args.report and len(args.files) != 1:
        print("monitor-agent replay: --report takes exactly one trace file", file=sys.stderr)
        return 2
    bar = _progress_bar(args.files, disable=args.quiet)
    try:  # a TraceError names the file, line and column
        runs = judge_traces(args.files, settings, on_record=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    if args.findings_out:
        with args.findings_out.open("wb") as fh:
            for run in runs:
                for f in run.findings:
                    fh.write(wire.dumps(f.to_dict()) + b"\n")
    _print_summary(runs)
    if args.report:
        from monitor_agent.tools.report import write_report

        run_id = write_report(args.files[0], runs[0], args.report, settings)
        print(f"report of run {run_id}: {args.report}")
    return 0


def _export(args: argparse.Namespace) -> int:
    import os

    from monitor_agent.storage.export import export_from_data_dir, export_from_url

    if args.url:
        token = args.token or os.environ.get("MONITOR_AGENT_TOKEN")
        count = export_from_url(args.url, args.run_id, args.output, token)
    else:
        data_dir = args.data_dir or Path(os.environ.get("MONITOR_AGENT_DATA_DIR",
                                                        "monitor-data"))
        count = export_from_data_dir(data_dir, args.run_id, args.output)
    print(f"{count} records of run {args.run_id} written to {args.output}")
    return 0


def _push_spool(args: argparse.Namespace) -> int:
    import os

    from monitor_agent.tools.push_spool import http_post, push, scan

    url = args.url or os.environ.get("MONITOR_AGENT_URL") or "http://127.0.0.1:9400"
    token = args.token or os.environ.get("MONITOR_AGENT_TOKEN")
    try:
        report = push(scan(args.path), http_post(url, token), keep=args.keep)
    except OSError as exc:  # unreadable or undeletable files: say which, no traceback
        print(f"monitor-agent push-spool: {exc}", file=sys.stderr)
        return 1
    print(f"pushed {args.path} to {url}: {report.summary()}")
    for label, lines, count in (("refused", report.refused_lines, report.refused),
                                ("refused for now", report.waiting_lines, report.waiting),
                                ("kept", report.kept, len(report.kept)),
                                ("skipped", report.skipped, len(report.skipped))):
        shown = lines[:20]
        for line in shown:
            print(f"  {label}: {line}")
        if count > len(shown):
            print(f"  ... and {count - len(shown)} more {label}")
    if report.waiting:  # not done: a script that pushes should push again, later
        print(f"monitor-agent push-spool: {report.waiting} records were refused for now; "
              "their files are kept: push again later", file=sys.stderr)
        return 1
    return 0


def _progress_bar(files: list[Path], disable: bool) -> tqdm | None:
    if disable or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(desc="replaying", unit="rec", file=sys.stderr)


def _print_summary(runs: list[JudgedTrace]) -> None:
    print(f"{'trace':40} {'records':>8} {'last':>6} {'end':>4}  findings (type: count @first step)")
    for run in runs:
        first: dict[str, int] = {}
        counts = Counter(f.type for f in run.findings)
        for f in run.findings:
            first.setdefault(f.type, f.step)
        found = ", ".join(f"{t}: {counts[t]} @{first[t]}"
                          for t in sorted(first, key=lambda t: first[t]))
        name = run.path.name[:40]
        print(f"{name:40} {run.records:>8} {run.last_step:>6} {'yes' if run.ended else 'no':>4}  "
              f"{found or '-'}")
        if run.rejected:
            print(f"{'':40} {run.rejected} records rejected and skipped (warnings say why)")


def _check_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.file)
    from monitor_agent.alerting import load_rules

    rules = load_rules(settings.alerting.rules_file)
    print(f"{args.file}: OK ({len(rules)} alert rules)")
    print(_redacted_yaml(settings))
    return 0


def _redacted_yaml(settings: Settings) -> str:
    import yaml

    return yaml.safe_dump(settings.redacted(), sort_keys=False)


def _demo(args: argparse.Namespace) -> int:
    from monitor_agent.tools.demo import run_demo

    return run_demo(inject=args.inject, steps=args.steps, inject_step=args.inject_step,
                    port=args.port, exit_after=args.exit_after)
