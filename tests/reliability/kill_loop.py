"""The sidecar killed (SIGKILL) at random moments while the example trainer runs through the
real client, with Slack and PagerDuty receivers attached; compared with an unharmed run.

Example::

    report = kill_loop(tmp_path, kills=10, steps=2500)
    print(report.summary())
    assert report.steps_stored_in_order == report.steps_logged
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.receivers import Receiver
from tests.sidecar_process import SidecarProcess

REPO = Path(__file__).resolve().parents[2]
# Findings that depend on wall-clock time or host memory differ between two runs of the
# same seed; those that depend only on the (deterministic) values must be identical.
TIME_DEPENDENT = {"stalled", "throughput_drop", "straggler", "memory_pressure"}
# Their alerts (default_rules.yaml): on a loaded machine either run may page them.
TIME_DEPENDENT_ALERTS = {"TrainingStalled", "TrainingThroughputDrop", "TrainingStraggler",
                         "TrainingMemoryPressure", "TrainingMemoryPressureCritical"}
PD_KEY = "kill-loop-routing-key-5f1e000000"


@dataclass
class RunOutcome:
    """What one trainer run left behind: steps, pages, findings, the final loss EMA."""

    steps_logged: int = 0
    stored_steps: list[int] = field(default_factory=list)  # in arrival (row id) order
    triggers: Counter = field(default_factory=Counter)  # alertname -> pages
    dedup_triggers: Counter = field(default_factory=Counter)  # dedup_key -> pages
    resolves: Counter = field(default_factory=Counter)  # dedup_key -> resolves
    slack: Counter = field(default_factory=Counter)  # (status, alertname) -> messages
    findings: set[tuple] = field(default_factory=set)
    loss_ema: float | None = None
    kills: int = 0
    exit_code: int | None = None


@dataclass
class KillLoopReport:
    reference: RunOutcome
    chaos: RunOutcome

    @property
    def steps_stored_in_order(self) -> int:
        stored = self.chaos.stored_steps
        return len(stored) if stored == list(range(1, len(stored) + 1)) else -1

    @property
    def duplicated_pages(self) -> int:
        return sum(n - 1 for n in self.chaos.dedup_triggers.values() if n > 1)

    def summary(self) -> str:
        c, r = self.chaos, self.reference
        unresolved = [k for k in c.dedup_triggers if not c.resolves[k]]
        return (f"kills {c.kills}; steps logged {c.steps_logged}, stored {len(c.stored_steps)} "
                f"(exactly once and in order: {self.steps_stored_in_order == c.steps_logged}); "
                f"pages expected {sum(r.triggers.values())} {dict(r.triggers)}, delivered "
                f"{len(c.dedup_triggers)} {dict(c.triggers)}, duplicated {self.duplicated_pages}; "
                f"resolves {sum(c.resolves.values())}, unresolved {len(unresolved)}; "
                f"findings identical to the unharmed run: {c.findings == r.findings} "
                f"({len(c.findings)} vs {len(r.findings)}); loss EMA {c.loss_ema} vs {r.loss_ema}")


def _config(tmp: Path, slack: Receiver, pd: Receiver) -> Path:
    config = tmp / "config.yaml"
    config.write_text(
        "tick_interval_seconds: 0.2\nsnapshot_interval_seconds: 2\n"
        "alerting:\n  group_wait_seconds: 0.05\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/killloop', min_interval_seconds: 0}}\n"
        f"  pagerduty: {{routing_key: {PD_KEY}, url: '{pd.url}/v2/enqueue'}}\n"
    )
    return config


def _trainer(url: str, run_id: str, steps: int, spool: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(REPO / "examples" / "train_gpt.py"), "--url", url,
           "--run-id", run_id, "--steps", str(steps), "--inject", "nan",
           "--inject-step", str(steps // 2), "--nan-patience", str(10 * steps),
           "--eval-every", "100", "--threads", "1", "--peak-flops", "1e10",
           "--spool-dir", str(spool), "--progress", "--quiet"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _replay_leftover_spool(url: str, spool: Path) -> None:
    """What the trainer could not deliver before exiting goes out on the 'next start'."""
    from monitor_client._sender import Sender
    from monitor_client._spool import Spool
    from monitor_client._transport import HttpTransport

    for directory in spool.iterdir() if spool.exists() else []:
        sender = Sender(HttpTransport(url, None), Spool(directory), linger=0.01)
        sender.close(timeout=60)


def _wait_for_resolves(pd: Receiver, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        keys = {r.json["dedup_key"]: r.json["event_action"] for r in pd.accepted()}
        if keys and all(a == "resolve" for a in keys.values()):
            time.sleep(1.0)  # a late duplicate would show up now
            return
        time.sleep(0.1)  # a report, not a check: the caller judges what came


def _loss_ema(url: str, run_id: str) -> float | None:
    import re

    text = httpx.get(url + "/metrics", timeout=10).text
    m = re.search(rf'training_loss_ema{{[^}}]*run_id="{run_id}"[^}}]*}} (\S+)', text)
    return float(m.group(1)) if m else None


def _collect(out: RunOutcome, sc: SidecarProcess, run_id: str, slack: Receiver,
             pd: Receiver) -> None:
    for req in pd.accepted():
        body = req.json
        if body["event_action"] == "trigger":
            out.dedup_triggers[body["dedup_key"]] += 1
            out.triggers[body["payload"]["custom_details"]["alertname"]] += 1
        elif body["event_action"] == "resolve":
            out.resolves[body["dedup_key"]] += 1
    out.slack = Counter()
    for req in slack.accepted():
        # "[FIRING:2] run killed: TrainingNanInf, TrainingGradExplosion": which alerts went
        # out with which status. How they were grouped into messages depends on arrival
        # timing (a replayed spool brings several findings into one group wait), so only
        # the (status, alert) multiset is compared between runs.
        head = req.json["text"].split("\n")[0]
        status = head[1:head.index(":")]
        for name in head.split(": ", 1)[1].split(", "):
            if name.strip() not in TIME_DEPENDENT_ALERTS:
                out.slack[(status, name.strip())] += 1
    found = httpx.get(f"{sc.url}/v1/runs/{run_id}/findings", params={"limit": 10_000},
                      timeout=10).json()["findings"]
    out.findings = {(f["type"], f["step"], f.get("layer")) for f in found
                    if f["type"] not in TIME_DEPENDENT}
    out.loss_ema = _loss_ema(sc.url, run_id)


def run_trainer(tmp: Path, run_id: str, steps: int, kills: int, seed: int,
                gap: tuple[float, float]) -> RunOutcome:
    """One trainer run against a fresh sidecar, killing it ``kills`` times on the way."""
    out, rng = RunOutcome(), random.Random(seed)
    with Receiver("slack") as slack, Receiver("pagerduty") as pd:
        sc = SidecarProcess(tmp / f"data-{run_id}", config=_config(tmp, slack, pd),
                            env={"MONITOR_AGENT_LOG_LEVEL": "warning"})
        sc.start()
        try:
            trainer = _trainer(sc.url, run_id, steps, tmp / f"spool-{run_id}")
            while out.kills < kills and trainer.poll() is None:
                time.sleep(rng.uniform(*gap))  # the gap between kills
                if trainer.poll() is None:
                    sc.kill()
                    out.kills += 1
                    sc.start()
            lines = trainer.communicate(timeout=600)[0].splitlines()
            out.exit_code = trainer.returncode
            out.steps_logged = sum(1 for ln in lines if ln.startswith("step "))
            _replay_leftover_spool(sc.url, tmp / f"spool-{run_id}")
            _wait_for_resolves(pd, timeout=30)
            _collect(out, sc, run_id, slack, pd)
        finally:
            sc.stop()
        with sqlite3.connect(sc.data_dir / "monitor.sqlite") as db:
            out.stored_steps = [s for (s,) in db.execute(
                "SELECT step FROM records WHERE run_id = ? AND kind = 'step' ORDER BY id",
                (run_id,))]
    return out


def kill_loop(tmp: Path, kills: int = 10, steps: int = 2500, seed: int = 7,
              gap: tuple[float, float] = (0.3, 3.0)) -> KillLoopReport:
    """An unharmed reference run, then the same run with ``kills`` SIGKILLs of the sidecar."""
    reference = run_trainer(tmp, "unharmed", steps, 0, seed, gap)
    chaos = run_trainer(tmp, "killed", steps, kills, seed, gap)
    return KillLoopReport(reference, chaos)
