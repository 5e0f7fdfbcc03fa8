"""``monitor-agent demo``: the sidecar plus a tiny GPT run with an injected fault.

No Docker, no network beyond loopback: SQLite in a temp dir, the console channel, and
the char-level GPT of ``tools/demo_gpt.py`` (``examples/train_gpt.py`` in a checkout) trained on
CPU through the real client, in a child process. It ships in the package, so the demo runs
from an installed wheel too, given ``torch`` and ``monitor-client``. When the fault fires, the
alert is shown exactly as Slack would receive it (the most severe one, whatever arrived
first), with the finding's evidence and suggestions. Then the sidecar keeps serving, with
the run page's address printed, until Ctrl-C (``exit_after`` bounds that for tests).

``monitor-agent demo --inject nan --steps 300 --inject-step 200`` calls ``run_demo`` (cli.py);
tests/tools/test_demo.py runs that command and checks the Slack message it shows.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

import httpx

import monitor_agent
from monitor_agent.serving.embedded import EmbeddedServer, free_port

# Where this monitor_agent is imported from (a checkout or site-packages): the trainer child
# process imports the same one. A checkout also has the client beside it, in client/.
PACKAGE_ROOT = Path(monitor_agent.__file__).resolve().parents[1]


class _SlackCatcher:
    """A loopback endpoint speaking Slack's incoming-webhook protocol: keeps what it gets."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        received: list[dict[str, Any]] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/demo"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


SEVERITIES = ("INFO", "WARNING", "ERROR", "CRITICAL")


def run_demo(inject: str, steps: int, inject_step: int, port: int = 0,
             exit_after: float | None = None) -> int:
    from monitor_agent.settings import load_settings

    missing = _missing_trainer_packages()
    if missing:
        print(f"demo: the training side needs {' and '.join(missing)}: pip install "
              "monitor-client torch==2.13.0 (from a checkout: pip install ./client)",
              file=sys.stderr)
        return 2
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    _show_console_alerts()
    slack = _SlackCatcher()
    with tempfile.TemporaryDirectory(prefix="monitor-agent-demo-") as tmp:
        settings = load_settings(
            data_dir=Path(tmp), host="127.0.0.1", port=port,
            alerting={"console": {"enabled": True}, "slack": {"webhook_url": slack.url}},
        )
        print(f"sidecar: {url}  (data in {tmp}; API docs {url}/docs, metrics {url}/metrics)")
        with EmbeddedServer(settings):
            run_id = f"demo-{inject}-{int(time.time())}"
            page = f"{url}/runs/{run_id}"
            print(f"watch it live: {page}")
            code = _train(url, run_id, inject, steps, inject_step)
            time.sleep(1.5)  # let the last batch and its alert delivery land
            _report(url, run_id)
            _show_slack(slack.received)
            print(f"\nrun page: {page}   (all runs: {url}/)")
            _serve(exit_after)
    slack.close()
    return 0 if code in (0, 1) else code


def _serve(exit_after: float | None) -> None:
    """Keep the sidecar (and the page's links) up until Ctrl-C, or ``exit_after`` seconds."""
    if exit_after is not None:
        time.sleep(exit_after)
        return
    print("serving until Ctrl-C", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopped")


def _severity(message: dict[str, Any]) -> int:
    """How severe a Slack message is: the highest severity word its text names."""
    text = str(message.get("text", ""))
    return max((i for i, word in enumerate(SEVERITIES) if word in text), default=-1)


def _show_slack(received: list[dict[str, Any]]) -> None:
    if not received:
        print("\n(no alert reached the Slack endpoint)")
        return
    worst = max(received, key=_severity)  # max keeps the earliest of equals
    print(f"\nwhat Slack received ({len(received)} message(s)); the most severe, verbatim:")
    print(json.dumps(worst, indent=2, ensure_ascii=False))


class _AboveTheBar(logging.Handler):
    """Log lines printed through tqdm, so they never land in the middle of a progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stdout)
        except Exception:
            self.handleError(record)


def _show_console_alerts() -> None:
    """The console channel logs each alert message; print them as they come."""
    handler = _AboveTheBar()
    handler.setFormatter(logging.Formatter("\n%(message)s"))
    logger = logging.getLogger("monitor_agent.alerts")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _trainer_path() -> list[str]:
    """sys.path entries for the trainer process: this monitor_agent, and a checkout's client."""
    client = PACKAGE_ROOT / "client"
    return [str(PACKAGE_ROOT)] + ([str(client)] if (client / "monitor_client").is_dir() else [])


def _missing_trainer_packages() -> list[str]:
    """What the trainer process could not import: looked up where it will look."""
    return [name for name in ("torch", "monitor_client")
            if importlib.util.find_spec(name) is None
            and PathFinder.find_spec(name, _trainer_path()) is None]


def _train(url: str, run_id: str, inject: str, steps: int, at: int) -> int:
    from tqdm import tqdm

    cmd = [sys.executable, "-m", "monitor_agent.tools.demo_gpt", "--url", url, "--run-id", run_id,
           "--project", "demo",
           "--steps", str(steps), "--inject", inject, "--inject-step", str(at), "--progress",
           # The char-GPT's warm-up grad norm sits above 1.0; 2.0 keeps the demo to the fault.
           "--grad-clip", "2.0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [*_trainer_path(), os.environ.get("PYTHONPATH", "")])}
    print(f"training: {' '.join(cmd[1:])}")
    bar = tqdm(total=steps, unit="step", desc="train_gpt", dynamic_ncols=True, mininterval=0.5)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("step "):
                done = int(line.split()[1].split("/")[0])
                bar.set_postfix_str(line.split("loss", 1)[-1].strip()[:20], refresh=False)
                bar.update(done - bar.n)
            else:
                bar.write(line.rstrip())
        code = proc.wait()
    bar.close()
    return code


def _report(url: str, run_id: str) -> None:
    run = httpx.get(f"{url}/v1/runs/{run_id}", timeout=10).json()
    print(f"\nrun {run_id}: status {run.get('status')}, last step {run.get('last_step')}")
    recent = list(reversed(run.get("findings", {}).get("recent", [])))
    for f in recent[:8]:
        print(f"  finding @step {f['step']:>4} {f['severity']:>8} {f['type']}: {f['message']}")
    rank = {s.lower(): i for i, s in enumerate(SEVERITIES)}
    worst = max(recent, key=lambda f: rank.get(f["severity"], -1), default=None)
    if worst and rank.get(worst["severity"], -1) >= rank["error"]:
        print("\nevidence:", json.dumps(worst.get("evidence", {}), indent=2))
        print("what to try next:")
        for s in worst.get("suggestions", []):
            print(f"  - {s}")
    print(f"\nalerts: {url}/v1/alerts   metrics: {url}/metrics   API: {url}/docs")
