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

Reported per arm: wall time, ETTR (productive time over wall: the job's steps once each
at the arm's own median step; the points behind the fault-free run's; the fault-free run's
wall over the arm's, a stricter reading; and the monitor's own goodput ratio), time to recover (fault to the first step of
the relaunched job) p50/p99 per fault kind, and after detection (the page, or torchrun's
own for a crash), person actions, and where each fault's wall goes (detection, decision,
the ranks leaving, the relaunch's start, imports, rendezvous, DDP, the monitor, the resume
plan, the checkpoint load, the first step; and the training done again), from the job's
own stamps (heal_job.py). The checkpoint interval (``--ckpt-every``, default: measured) is
Young's rule from the job's own checkpoint cost and the schedule's time between faults
(``checkpoint_interval``), the same in every arm. Goals (the issue): 0 person actions; time to recover p99
<= 60 s after detection; the healing arm's ETTR within 5 points of the fault-free run's.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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
FAULTY = ("torchrun", "person", "heal")  # the arms the schedule's faults hit
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
    pids: list[int] = field(default_factory=list)  # the launch's workers when it hit
    decided: float | None = None  # the monitor's restart decision (the heal arm)
    left: float | None = None  # every worker of the launch it hit gone
    phases: dict[str, float] = field(default_factory=dict)  # the next launch's start
    redone: float = 0.0  # seconds of training done again (last step -> the resume's)


@dataclass
class Arm:
    name: str
    wall: float = 0.0
    exit_code: int = -1
    faults: list[Fault] = field(default_factory=list)
    person_actions: int = 0
    goodput: float | None = None
    monitor: dict[str, Any] = field(default_factory=dict)
    productive: float = 0.0  # its steps, each once, at its own median plain step's wall


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
    rules = None if name == "heal" else NOTIFY_RULES  # heal: the packaged rules
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
        decisions = sorted(a["created_at"] for a in httpx.get(
            f"{srv.url}/v1/runs/{run}/actions", timeout=30).json().get("actions", [])
            if a["action"] in ("restart", "exclude"))
    _recoveries(arm, out)
    _breakdown(arm, out, decisions)
    arm.productive = args.steps * _step_wall(_steps(out))
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
        if arm.name in FAULTY and training and not _open(arm) and trained >= args.every:
            kind = KINDS[turn % len(KINDS)]
            pids = _inject(kind, run, out, steps[-1][1])
            if pids:
                arm.faults.append(Fault(kind, time.time(), steps[-1][1],
                                        time.time() if kind == "kill" else None, pids=pids))
                turn, trained = turn + 1, 0.0
        _detect(arm, url, run)
        if arm.name == "person":
            _person(arm, args, run, out)
        _recovered(arm, out)
        _left(arm)


def _left(arm: Arm) -> None:
    """When every worker of the launch a fault hit was gone (its launcher reaped it)."""
    for fault in arm.faults:
        if fault.left is None and not any(_alive(pid) for pid in fault.pids):
            fault.left = time.time()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _open(arm: Arm) -> bool:
    return any(f.recovered is None for f in arm.faults)


def _inject(kind: str, run: str, out: Path, launch: int) -> list[int]:
    """The fault, on local rank 1; the launch's workers then ([]: none injected)."""
    workers = _workers(run)
    if 1 not in workers:
        return []
    if kind == "stuck":
        (out / f"stuck-{launch}").write_text("1")
    else:
        os.kill(workers[1], signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    return sorted(workers.values())


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


def _phases(out: Path) -> dict[int, dict[str, float]]:
    """{launch: {phase: wall time}} of the job's start-up (heal_job.py), the latest rank's
    (the job trains once its slowest rank is there); ``resumed``: the step it loaded."""
    found: dict[int, dict[str, float]] = {}
    for log in out.glob("phases-r*.log"):
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            mine = found.setdefault(int(parts[0]), {})
            mine[parts[1]] = max(mine.get(parts[1], 0.0), float(parts[2]))
            if parts[1] == "loaded" and len(parts) > 3:
                mine["resumed"] = float(parts[3])
    return found


SEGMENTS = (  # (name, from, to): where a fault's wall goes, in order
    ("detect", "at", "detected"), ("decide", "detected", "decided"),
    ("leave", "decided", "left"), ("start", "left", "proc"), ("imports", "proc", "imported"),
    ("rendezvous", "imported", "joined"), ("ddp", "joined", "built"),
    ("monitor", "built", "ready"), ("plan", "ready", "planned"),
    ("load", "planned", "loaded"), ("first step", "loaded", "recovered"))


def _breakdown(arm: Arm, out: Path, decisions: list[float]) -> None:
    """Each fault's stamps: the decision after it, the next launch's start-up phases, and
    the training done again (its launch's last step back to the step it resumed from)."""
    steps, phases = _steps(out), _phases(out)
    step_wall = _step_wall(steps)
    for fault in arm.faults:
        after = [d for d in decisions if d >= fault.at
                 and (fault.recovered is None or d <= fault.recovered)]
        fault.decided = after[0] if after and arm.name == "heal" else None
        later = sorted(n for n in phases if n > fault.launch)
        if later:
            fault.phases = phases[later[0]]
        last = max((st for _, launch, st in steps if launch == fault.launch), default=0)
        resumed = fault.phases.get("resumed")
        if resumed is not None:
            fault.redone = max(0.0, (last - resumed) * step_wall)


def _step_wall(steps: list[tuple[float, int, int]]) -> float:
    """The median wall between two consecutive steps of one launch (a step that saved is
    one of several: the median is the plain step's)."""
    walls = sorted(b - a for (a, la, sa), (b, lb, sb) in itertools.pairwise(steps)
                   if la == lb and sb == sa + 1)
    return walls[len(walls) // 2] if walls else 0.0


def _segments(fault: Fault) -> dict[str, float]:
    """Seconds of each of ``SEGMENTS`` for one fault (a stamp it lacks: the segment joins
    the next), and ``redone``."""
    stamps = {"at": fault.at, "detected": fault.detected, "decided": fault.decided,
              "left": fault.left, "recovered": fault.recovered, **fault.phases}
    out, since = {}, fault.at
    for name, _, to in SEGMENTS:
        when = stamps.get(to)
        if when is None:
            continue
        out[name], since = max(0.0, when - since), max(since, when)
    out["redone"] = fault.redone
    return out


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
             "after the page", "", args.ckpt_why + ".", "",
             "ETTR is productive time over wall (the issue's, and Meta's, definition): "
             "productive, the job's steps once each at the arm's own median plain step "
             "(saves, start-ups, waits and re-done steps are not productive); `points`: "
             "the fault-free run's ETTR minus the arm's. `vs fault-free`: the fault-free "
             "run's wall over the arm's, a stricter reading (it charges the arm the "
             "fault-free run's own start-up and saves again). `goodput (monitor)`: the "
             "monitor's own ledger's ratio.", "",
             "| arm | exit | wall | ETTR | points | vs fault-free | goodput (monitor) | "
             "faults | person actions |", "|---|---|---|---|---|---|---|---|---|"]
    base_ettr = base.productive / base.wall if base is not None and base.wall else None
    for arm in arms:
        ettr = arm.productive / arm.wall if arm.wall else None
        behind = (f"{(base_ettr - ettr) * 100:.1f}" if base_ettr is not None
                  and ettr is not None else "-")
        vs = base.wall / arm.wall if base is not None and arm.wall else None
        lines.append(f"| {arm.name} | {arm.exit_code} | {arm.wall:.0f} s | {_fmt(ettr, '%')} "
                     f"| {behind} | {_fmt(vs, '%')} | {_fmt(arm.goodput, '%')} | "
                     f"{len(arm.faults)} | {arm.person_actions} |")
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
    names = [n for n, _, _ in SEGMENTS] + ["redone"]
    lines += ["", "Where a fault's wall goes (median seconds per fault kind; `leave`: "
              "until every worker of the launch it hit was gone; `redone`: training done "
              "again since the checkpoint resumed from; `ddp`: the data and the DDP model built, "
              "mostly DDP's first import of torch._dynamo):", "",
              "| arm | fault | " + " | ".join(names) + " | sum |",
              "|---|---|" + "---|" * (len(names) + 1)]
    for arm in arms:
        for kind in KINDS:
            mine = [_segments(f) for f in arm.faults if f.kind == kind
                    and f.recovered is not None]
            if not mine:
                continue
            cells = [_q([m.get(n, 0.0) for m in mine], 0.5) or 0.0 for n in names]
            lines.append(f"| {arm.name} | {kind} | " + " | ".join(f"{c:.1f}" for c in cells)
                         + f" | {sum(cells):.0f} |")
    return "\n".join(lines)


def checkpoint_interval(args: argparse.Namespace, tmp: Path) -> tuple[int, str]:
    """Young's rule for the interval between checkpoints that loses the least time to
    saves and re-done work together: sqrt(2 x C x MTBF), C the job's own checkpoint cost
    (measured: a short run of the same job saving every 5 steps, rank 0's save and the
    barrier after it), MTBF the schedule's mean time between faults (``--every`` seconds
    of training: the wall between two faults is longer, so this errs short). In steps of
    the job's own measured step wall. Every arm uses it (the fault-free one pays the same
    saves)."""
    probe = argparse.Namespace(**{**vars(args), "steps": 100, "ckpt_every": 5})
    run_arm("calibrate", probe, tmp)
    out = tmp / "calibrate"
    costs = sorted(float(x) for x in (out / "ckpt-cost.log").read_text().split())
    cost = costs[len(costs) // 2]
    step_wall = _step_wall(_steps(out))
    tau = math.sqrt(2 * cost * args.every)
    every = max(1, round(tau / step_wall))
    why = (f"checkpoint every {every} steps: Young's sqrt(2 x C x MTBF) = sqrt(2 x "
           f"{cost * 1000:.1f} ms x {args.every:.0f} s) = {tau:.2f} s, at the job's "
           f"measured {step_wall * 1000:.0f} ms a step (C: median of {len(costs)} saves "
           "of the same job, the save and its barrier; MTBF: the schedule's --every)")
    return every, why


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=24.0,
                   help="the fault-free job's length (sets --steps)")
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--ckpt-every", type=int, default=0,
                   help="steps between checkpoints (0: Young's rule, measured: "
                        "checkpoint_interval)")
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
        if not args.ckpt_every:
            args.ckpt_every, args.ckpt_why = checkpoint_interval(args, Path(tmp))
        else:
            args.ckpt_why = f"checkpoint every {args.ckpt_every} steps (--ckpt-every)"
        print(args.ckpt_why, flush=True)
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
