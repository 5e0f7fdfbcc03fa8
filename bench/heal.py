"""Healing without a person (issue 43): one CPU training job under one failure schedule, in
three arms and a fault-free run, measured in one run of this script.

    python -m bench.heal                      # 24 min per arm: about 1 h 40 min
    python -m bench.heal --minutes 6 --every 90 --response 120 --collective-timeout 180

The job: ``torchrun --max-restarts=50`` of two gloo ranks (bench/heal_job.py, written as
docs/actions.md "Healing" says), a paced step (``--step-time``), a checkpoint every
``--ckpt-every`` steps, a real sidecar in this process. The schedule: every ``--every``
seconds of training, the next fault of ``kill`` (a rank SIGKILLed), ``stop`` (a rank
SIGSTOPped: frozen, no report of its own) and ``stuck`` (a rank's training thread blocked:
its watchdog reports), in turn; a fault is injected only while the job trains (never during
a recovery). The arms:

- **torchrun**: its ``--max-restarts`` alone. A crash restarts the group at once; a hang
  waits for the collective timeout (``--collective-timeout``; NCCL's default is 600 s).
- **person**: the monitor pages (hangs are found in about a minute); a person who acts
  ``--response`` seconds after the page (kills the job's workers, torchrun restarts them)
  unless the job recovered meanwhile. Each act is a person action.
- **heal**: the packaged rules: the monitor restarts the job on the hang, every rank
  leaves with exit 75 and torchrun runs the group again from the last clean checkpoint.

Reported per arm: wall time, ETTR (the fault-free run's wall over the arm's, for the same
steps; and the monitor's own goodput ratio), time to recover (fault to the first step of
the relaunched job) p50/p99 per fault kind, and after detection (the page, or torchrun's
own for a crash), person actions. Goals (the issue): 0 person actions; time to recover p99
<= 60 s after detection; the healing arm's ETTR within 5 points of the fault-free run's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from monitor_agent.serving.embedded import EmbeddedServer, free_port
from monitor_agent.settings import Settings

REPO = Path(__file__).resolve().parents[1]
JOB = Path(__file__).with_name("heal_job.py")
KINDS = ("kill", "stop", "stuck")
NOTIFY_RULES = """
routes: {page: [console]}
rules:
  - {name: TrainingHung, match: {types: [hang]}, severity: critical, fingerprint: [],
     cooldown: 30m, resolve_after: 3m}
"""


@dataclass
class Fault:
    kind: str
    at: float  # wall time injected
    launch: int  # the job's launch it hit
    detected: float | None = None  # the page (a crash: torchrun's own, at once)
    recovered: float | None = None  # the first step of a later launch
    acted: bool = False  # a person acted on it


@dataclass
class Arm:
    name: str
    wall: float = 0.0
    exit_code: int = -1
    faults: list[Fault] = field(default_factory=list)
    person_actions: int = 0
    goodput: float | None = None
    monitor: dict[str, Any] = field(default_factory=dict)


def _steps(out: Path) -> list[tuple[float, int, int]]:
    """(wall time, launch, step) of rank 0's log."""
    rows = []
    with contextlib.suppress(FileNotFoundError):
        for line in (out / "steps-r0.log").read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                rows.append((float(parts[0]), int(parts[1]), int(parts[2])))
    return rows


def _workers(run: str) -> dict[int, int]:
    """{local rank: pid} of the job's training processes now."""
    found: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(item.split("=", 1) for item in (proc / "environ").read_bytes().decode(
                errors="replace").split("\0") if "=" in item)
        except OSError:
            continue
        if env.get("TORCHELASTIC_RUN_ID") == run and "LOCAL_RANK" in env:
            found[int(env["LOCAL_RANK"])] = int(proc.name)
    return found


def _sidecar(tmp: Path, rules: str | None) -> EmbeddedServer:
    alerting: dict[str, Any] = {"group_wait_seconds": 0.2}
    if rules is not None:
        (tmp / "rules.yaml").write_text(rules)
        alerting["rules_file"] = str(tmp / "rules.yaml")
    return EmbeddedServer(Settings(port=free_port(), data_dir=tmp / "sidecar",
                                   tick_interval_seconds=0.5, alerting=alerting,
                                   detectors={"hang_settle_seconds": 2.0}))


def run_arm(name: str, args: argparse.Namespace, tmp: Path) -> Arm:
    arm, out = Arm(name), tmp / name
    out.mkdir(parents=True)
    rules = None if name == "heal" else NOTIFY_RULES
    run = f"heal-{name}-{os.getpid()}"
    with _sidecar(out, rules) as srv:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MONITOR_AGENT_URL": srv.url,
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # pytorch/pytorch#135712
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "client")])}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               "--nproc-per-node=2", "--max-restarts=50", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id={run}",
               "--monitor-interval=0.5", str(JOB), "--run-id", run, "--out", str(out),
               "--steps", str(args.steps), "--step-time", str(args.step_time),
               "--ckpt-every", str(args.ckpt_every),
               "--collective-timeout", str(args.collective_timeout),
               "--watchdog-floor", str(args.watchdog_floor)]
        start = time.time()
        with (out / "torchrun.log").open("w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            _drive(arm, args, proc, srv.url, run, out, start)
            arm.exit_code = proc.wait()
        arm.wall = time.time() - start
        report = httpx.get(f"{srv.url}/v1/runs/{run}/goodput", timeout=30).json()
        arm.goodput = report.get("goodput_ratio")
        arm.monitor = report.get("ettr") or {}
    _recoveries(arm, out)
    return arm


def _drive(arm: Arm, args: argparse.Namespace, proc: subprocess.Popen[bytes], url: str,
           run: str, out: Path, start: float) -> None:
    """Inject the schedule while the job runs; in the person arm, act on pages."""
    trained, turn = 0.0, 0  # seconds of training since the last fault
    last = time.time()
    while proc.poll() is None:
        time.sleep(0.5)
        now, steps = time.time(), _steps(out)
        training = bool(steps) and now - steps[-1][0] < 5 * args.step_time + 2.0
        trained += (now - last) if training and not _open(arm) else 0.0
        last = now
        if arm.name != "baseline" and training and not _open(arm) and trained >= args.every:
            kind = KINDS[turn % len(KINDS)]
            if _inject(kind, run, out, steps[-1][1]):
                arm.faults.append(Fault(kind, time.time(), steps[-1][1],
                                        time.time() if kind == "kill" else None))
                turn, trained = turn + 1, 0.0
        _detect(arm, url, run)
        if arm.name == "person":
            _person(arm, args, run, out)
        _recovered(arm, out)


def _open(arm: Arm) -> bool:
    return any(f.recovered is None for f in arm.faults)


def _inject(kind: str, run: str, out: Path, launch: int) -> bool:
    workers = _workers(run)
    if 1 not in workers:
        return False
    if kind == "stuck":
        (out / f"stuck-{launch}").write_text("1")
    else:
        os.kill(workers[1], signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    return True


def _detect(arm: Arm, url: str, run: str) -> None:
    """A hang's detection: the monitor's page (its alert going out)."""
    pending = [f for f in arm.faults if f.detected is None]
    if not pending:
        return
    with contextlib.suppress(httpx.HTTPError, ValueError):
        alerts = httpx.get(f"{url}/v1/alerts", params={"run_id": run}, timeout=5).json()
        paged = [a for a in alerts.get("alerts", []) if a["alertname"] == "TrainingHung"
                 and a["state"] in ("firing", "resolved")]
        for fault in pending:
            seen = [a["started_at"] for a in paged if a["started_at"] >= fault.at]
            if seen:
                fault.detected = min(seen)


def _person(arm: Arm, args: argparse.Namespace, run: str, out: Path) -> None:
    """The on-call person: ``response`` seconds after the page, if the job has not
    recovered, ends its workers (torchrun runs them again)."""
    for fault in arm.faults:
        if fault.acted or fault.recovered is not None or fault.detected is None:
            continue
        if time.time() - fault.detected >= args.response:
            for pid in _workers(run).values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            fault.acted = True
            arm.person_actions += 1


def _recovered(arm: Arm, out: Path) -> None:
    steps = _steps(out)
    for fault in arm.faults:
        if fault.recovered is None:
            later = [t for t, launch, _ in steps if launch > fault.launch and t > fault.at]
            if later:
                fault.recovered = min(later)


def _recoveries(arm: Arm, out: Path) -> None:
    _recovered(arm, out)
    with contextlib.suppress(OSError):
        (out / "faults.json").write_text(json.dumps([f.__dict__ for f in arm.faults],
                                                    indent=1))


def _q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(math.ceil(q * len(ordered)) - 1, 0))]


def _fmt(x: float | None, unit: str = "s") -> str:
    return "-" if x is None else f"{x:.0f} {unit}" if unit == "s" else f"{x:.1%}"


def report(arms: list[Arm], args: argparse.Namespace) -> str:
    base = next((a for a in arms if a.name == "baseline"), None)
    lines = [f"# heal: {args.steps} steps of {args.step_time} s, a fault every "
             f"{args.every:.0f} s of training ({', '.join(KINDS)} in turn), collective "
             f"timeout {args.collective_timeout:.0f} s, a person acts {args.response:.0f} s "
             "after the page", "",
             "| arm | exit | wall | ETTR (vs fault-free) | goodput (monitor) | faults | "
             "person actions |", "|---|---|---|---|---|---|---|"]
    for arm in arms:
        ettr = base.wall / arm.wall if base is not None and arm.wall else None
        lines.append(f"| {arm.name} | {arm.exit_code} | {arm.wall:.0f} s | {_fmt(ettr, '%')} "
                     f"| {_fmt(arm.goodput, '%')} | {len(arm.faults)} | "
                     f"{arm.person_actions} |")
    lines += ["", "| arm | fault | n | time to recover p50 / p99 | after detection p50 / p99 |",
              "|---|---|---|---|---|"]
    for arm in arms:
        for kind in KINDS:
            mine = [f for f in arm.faults if f.kind == kind and f.recovered is not None]
            if not mine:
                continue
            total = [f.recovered - f.at for f in mine if f.recovered is not None]
            after = [f.recovered - (f.detected or f.at) for f in mine
                     if f.recovered is not None]
            lines.append(f"| {arm.name} | {kind} | {len(mine)} | {_fmt(_q(total, 0.5))} / "
                         f"{_fmt(_q(total, 0.99))} | {_fmt(_q(after, 0.5))} / "
                         f"{_fmt(_q(after, 0.99))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=24.0,
                   help="the fault-free job's length (sets --steps)")
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--ckpt-every", type=int, default=300)
    p.add_argument("--every", type=float, default=180.0,
                   help="seconds of training between two faults")
    p.add_argument("--response", type=float, default=600.0,
                   help="seconds from a page to the person's action")
    p.add_argument("--collective-timeout", type=float, default=600.0)
    p.add_argument("--watchdog-floor", type=float, default=10.0)
    p.add_argument("--arms", default="baseline,torchrun,person,heal")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if not args.steps:
        args.steps = int(args.minutes * 60 / (args.step_time * 1.3))
    arms = []
    with tempfile.TemporaryDirectory(prefix="heal-bench-") as tmp:
        for name in args.arms.split(","):
            arm = run_arm(name, args, Path(tmp))
            arms.append(arm)
            print(f"{name}: exit {arm.exit_code}, {arm.wall:.0f} s, {len(arm.faults)} "
                  f"faults, {arm.person_actions} person actions", flush=True)
    text = report(arms, args)
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps([{**a.__dict__, "faults": [f.__dict__ for f in
                                                                    a.faults]}
                                         for a in arms], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
