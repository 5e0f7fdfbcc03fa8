"""Chaos and soak: the sidecar under kills, failing receivers, full disks, load and attack.

Prints the figures issue 7 asks for (no timing asserts; tests/reliability/ asserts the
behaviour with small versions of the same harness functions).

    python -m bench.chaos                                 # every section, full size
    python -m bench.chaos --sections soak --soak-seconds 600
    python -m bench.chaos --sections kills --kills 10
    python -m bench.chaos --sections fuzz --schemathesis-examples 2000
    python -m bench.chaos --sections cardinality --cardinality 1000000

    python -m bench.chaos --sections amplification --amplification-cases 2000
    python -m bench.chaos --sections readers --readers-records 48
    python -m bench.chaos --sections flood --flood-runs 0 120 5100 10000

    python -m bench.chaos --sections cpu --cpu-checkpoints 20000 --cpu-ranks 256
    python -m bench.chaos --sections peer --peer-dead 20 --peer-seconds 40

Sections: kills, notify, disk, soak, churn, cardinality, fuzz, amplification, readers, flood,
cpu, peer.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from tests.sidecar_process import SidecarProcess

SECTIONS = ("kills", "notify", "disk", "soak", "churn", "cardinality", "fuzz", "amplification",
            "readers", "flood", "cpu", "peer")
QUIET = {"MONITOR_AGENT_LOG_LEVEL": "warning"}


def measure_capacity(tmp: Path, seconds: float) -> float:
    """Records/s of bench/ingest.py's GPT-2-small payload, 8 clients, on a fresh sidecar."""
    from bench import ingest

    with SidecarProcess(tmp / "capacity", env=QUIET) as sc:
        per = int(seconds * 1000 / ingest.BATCH / 8) + 10
        bodies = [ingest.sidecar_bodies(c, per) for c in range(8)]
        result = ingest.drive(lambda i, k: sc.url + "/v1/records", bodies,
                              {"content-type": "application/x-ndjson",
                               "content-encoding": "gzip"}, seconds, ingest.BATCH)
    return result["records_s"]


def section_kills(args: argparse.Namespace, tmp: Path) -> None:
    from tests.reliability.kill_loop import kill_loop

    (tmp / "kills").mkdir()
    report = kill_loop(tmp / "kills", kills=args.kills, steps=args.kill_steps)
    print(report.summary())


def section_notify(args: argparse.Namespace, tmp: Path) -> None:
    from tests.reliability.notify_outage import notify_outage

    (tmp / "notify").mkdir()
    report = notify_outage(tmp / "notify", outage_seconds=args.outage_seconds, runs=20)
    print(report.summary())


def section_disk(args: argparse.Namespace, tmp: Path) -> None:
    import subprocess

    from tests.reliability.disk_full import disk_full

    point = tmp / "mnt"
    point.mkdir()
    try:
        print(disk_full(point).line())
    except subprocess.CalledProcessError as exc:
        print(f"skipped: cannot mount a tmpfs here ({exc.stderr.decode().strip()})")
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def section_churn(args: argparse.Namespace, tmp: Path) -> None:
    from tests.reliability.churn import churn, churn_env

    with SidecarProcess(tmp / "churn", env=churn_env(ttl=2.0)) as sc:
        for wave in range(1, 4):  # the same again: memory is reused, not grown
            report = churn(sc.url, sc.proc.pid, runs=args.churn_runs, ttl=2.0,
                           prefix=f"wave{wave}")
            print(f"wave {wave}: {report.line()}", flush=True)


def section_cardinality(args: argparse.Namespace, tmp: Path) -> None:
    from tests.reliability.cardinality import label_bomb, layer_bomb, run_bomb

    n = args.cardinality
    for name, attack in (("layers", lambda url, pid: layer_bomb(url, pid, names=n)),
                         ("runs", lambda url, pid: run_bomb(url, pid, runs=n)),
                         ("labels", lambda url, pid: label_bomb(url, pid, values=n))):
        with SidecarProcess(tmp / f"bomb-{name}", env=QUIET) as sc:
            print(attack(sc.url, sc.proc.pid).line(), flush=True)


def section_fuzz(args: argparse.Namespace, tmp: Path) -> None:
    import re
    import subprocess

    with SidecarProcess(tmp / "fuzz", env=QUIET) as sc:
        proc = subprocess.run(
            ["schemathesis", "run", f"{sc.url}/openapi.json", "--checks", "not_a_server_error",
             "--max-examples", str(args.schemathesis_examples), "--seed", "1", "--no-color",
             "--request-timeout", "10", "--generation-database", "none"],
            capture_output=True, text=True, cwd=tmp)
        alive = sc.proc.poll() is None
    out = proc.stdout + proc.stderr
    summary = [ln for ln in out.splitlines() if re.search(r"generated|passed|failed|error", ln,
                                                          re.I)]
    print("\n".join(summary[-8:]))
    print(f"schemathesis exit {proc.returncode}; sidecar alive afterwards: {alive}")


def section_amplification(args: argparse.Namespace, tmp: Path) -> None:
    """Bytes sent vs RSS held and bytes stored, per request: the issue's attacks and the
    fuzz corpus (goal: nothing held above 10x what was sent, no request above 64 MiB)."""
    import dataclasses

    from tests.reliability.amplification import Report, attack_cases, measure, shape_cases
    from tests.reliability.record_fuzz import fuzz_cases, rss_mib, seed_records

    attacks = attack_cases() + shape_cases()
    corpus = list(fuzz_cases(seed_records(), limit=args.amplification_cases))
    with SidecarProcess(tmp / "amplification", env=QUIET) as sc:
        report = measure(sc.url, sc.proc.pid, sc.data_dir / "monitor.sqlite", attacks + corpus)
        # Held RSS that is the allocator keeping freed memory is reused, not grown: send
        # the largest accepted record again with new steps and watch RSS.
        again = [dataclasses.replace(big, name=f"{big.name} #{i}", body=big.body.replace(
            b'"step": 80,', f'"step": {100 + i},'.encode())) for i in range(20)
            for big in attacks if big.name.startswith("20k layers")]
        before = rss_mib(sc.proc.pid)
        repeat = measure(sc.url, sc.proc.pid, sc.data_dir / "monitor.sqlite", again)
        growth = rss_mib(sc.proc.pid) - before
    print(report.table({c.name for c in attacks}))
    print("-- attacks and fuzz corpus together:")
    print(report.summary())
    print("-- fuzz corpus alone:")
    print(Report(report.rows[len(attacks):]).summary())
    print(f"20 more 20k-layer records ({sum(r.sent for r in repeat.rows)} B sent, statuses "
          f"{sorted({r.status for r in repeat.rows})}): RSS grew {growth:.1f} MiB in all")
    amplification_over_time(args, tmp)


def amplification_over_time(args: argparse.Namespace, tmp: Path) -> None:
    """Shapes that cost over many requests: a new layer name every step (stored: what the
    chart history grew by), the counted shapes sent again (held: RSS growth once the
    budgets are full), and six ``{}`` bodies at once (peak: the six together)."""
    import dataclasses

    import httpx

    from tests.reliability.amplification import (
        Report,
        in_parallel,
        layer_names_over_time,
        measure,
        shape_cases,
    )

    with SidecarProcess(tmp / "amplification-time", env=QUIET) as sc:
        drift = layer_names_over_time(sc.url, sc.proc.pid, sc.data_dir / "history.sqlite",
                                      steps=args.name_drift_steps)
        shapes = shape_cases()
        measure(sc.url, sc.proc.pid, sc.data_dir / "monitor.sqlite", shapes)  # fill budgets
        again = measure(sc.url, sc.proc.pid, sc.data_dir / "monitor.sqlite", [
            dataclasses.replace(c, name=f"{c.name} (again)") for c in shapes])
        parallel = in_parallel(sc.url, sc.proc.pid, shapes[0], copies=6)
        t0 = time.perf_counter()
        ranks = len(httpx.get(sc.url + "/v1/runs/rank-bomb", timeout=120).json()["ranks"])
        detail_ms = (time.perf_counter() - t0) * 1000
    report = Report([drift, *again.rows, parallel])
    print(report.table({r.name for r in report.rows}))
    print(f"GET /v1/runs/rank-bomb after 20k rank records: {ranks} ranks, {detail_ms:.0f} ms")


def reader_shapes(run_id: str) -> list:
    """Readers that send a GET and never read: the issue's shapes (30 and 540 clients of a
    large run's records), and every other read route that can answer a lot."""
    from tests.reliability.stalled_readers import Shape, records_path

    return [Shape("records limit=10000", records_path(run_id), 30),
            Shape("records limit=10000, 540 clients", records_path(run_id), 540),
            Shape("findings limit=10000", f"/v1/runs/{run_id}/findings?limit=10000", 30),
            Shape("runs list", "/v1/runs", 30),
            Shape("runs page (UI)", "/v1/ui/runs", 30),
            Shape("alerts limit=10000", "/v1/alerts?limit=10000", 30),
            Shape("series (charts)", f"/v1/runs/{run_id}/series?points=10000", 30),
            Shape("matrix grad_norm (charts)",
                  f"/v1/runs/{run_id}/matrix/grad_norm?points=10000", 30),
            Shape("metrics", "/metrics", 30)]


def section_readers(args: argparse.Namespace, tmp: Path) -> None:
    """Bytes sent vs peak and held RSS per shape of reader that never reads (budget: 64
    MiB of peak RSS for all read answers together), then one client reading the whole run."""
    import httpx

    from tests.reliability.amplification import peak_mib, reset_peak
    from tests.reliability.record_fuzz import rss_mib
    from tests.reliability.stalled_readers import (
        attack,
        close_all,
        records_path,
        seed_run,
        seed_runs,
        stored_mib,
    )

    layers = 6000  # ~0.6 MiB a record as stored
    with SidecarProcess(tmp / "readers", env=QUIET) as sc:
        seed_run(sc.url, "big", records=args.readers_records, layers=layers)
        seed_runs(sc.url, args.readers_runs)
        print(f"stored: {stored_mib(sc.data_dir, 'big'):.1f} MiB of records "
              f"({args.readers_records} records x {layers} layers) and {args.readers_runs} "
              "more runs; budget 64 MiB peak", flush=True)
        for shape in reader_shapes("big"):
            row = attack(sc.url, sc.port, sc.proc.pid, shape, settle=3.0)
            close_all(row.sockets)
            verdict = "ok" if row.peak_mib <= 64 else "OVER BUDGET"
            print(f"{row.line()}  {verdict}", flush=True)
            time.sleep(2.0)  # let the closed readers' answers end before the next shape
        before = rss_mib(sc.proc.pid)
        reset_peak(sc.proc.pid)
        path, pages, got = records_path("big"), 0, 0
        while path is not None:
            page = httpx.get(sc.url + path, timeout=120).json()
            path, pages, got = page["next"], pages + 1, got + len(page["records"])
        print(f"one client reading the whole run: {got} records in {pages} pages, peak "
              f"+{peak_mib(sc.proc.pid) - before:.1f} MiB")


def section_flood(args: argparse.Namespace, tmp: Path) -> None:
    """The page flood (issue 35, class 4): N made-up runs page a NaN each through ingest,
    then a run that has trained for a while pages its own. The real page's latency and
    what each channel sent before it (Slack at its 1 message/s), the real alert's delivery
    state, and what the flood cost each receiver once the outbox drained.

    The real run is ``--flood-age`` s old, and ``new_run_seconds`` is set below that (the
    default, 300 s, would make the bench wait five minutes before each flood).

    Measured on a 2-core VM, real page latency (Slack / PagerDuty), before the outbox's
    flood rules (notify/fairness.py) and after (docs/alerting.md, "What a flood cannot
    do"); with no flood it is 0.06 s on both:

    =========  ===========================================  ===========================
    made-up    before                                       after
    =========  ===========================================  ===========================
    120        119.8 s (119 messages ahead) / 0.06 s         0.33 s / 0.06 s, 0 ahead
    5,100      not in 60 s: 4,911 / 3,716 still queued       0.06 s / 0.06 s, 0 ahead
               ahead
    10,000     not in 60 s: 5,692 / 4,245 still queued       0.06 s / 0.06 s, 0 ahead
               ahead (Slack's ~95 min: past max_age);
               15,766 flood messages refused "outbox full"
    =========  ===========================================  ===========================

    The flood itself cost each channel 120 / 5,100 / 10,000 messages before, and at most
    12 after (10 pages alone and one summary a minute). Ingesting the 10,000 runs took
    250-470 s before (the "before" runs shared the machine with other work; the senders
    also scanned a ~10,000-row queue under the database lock ingest needs) and 46 s after.
    """
    from tests.reliability.page_flood import page_flood

    for n in args.flood_runs:
        report = page_flood(tmp / f"flood-{n}", runs=n, age=args.flood_age,
                            wait=args.flood_wait, drain=args.flood_drain,
                            outbox=f"new_run_seconds: {args.flood_age / 2:g}")
        print(report.line(), flush=True)


def section_soak(args: argparse.Namespace, tmp: Path) -> None:
    from tests.reliability.soak import soak

    capacity = args.capacity or measure_capacity(tmp, args.capacity_seconds)
    rate = capacity / 2
    print(f"ingest capacity {capacity:.0f} records/s (GPT-2-small payload); soak offers "
          f"{rate:.0f} records/s over {args.soak_runs} runs x 148 tensors for "
          f"{args.soak_seconds:.0f} s")
    env = {**QUIET, "MONITOR_AGENT_RETENTION_STEPS": "500"}  # bounded disk for a long soak
    with SidecarProcess(tmp / "soak", env=env) as sc:
        report = soak(sc.url, sc.proc.pid, args.soak_seconds, runs=args.soak_runs, rate=rate,
                      window=args.soak_window)
    print(report.table())
    first, last = report.windows[0], report.windows[-1]
    print(f"soak: {report.sent_records} records stored, {report.errors} failed requests; "
          f"RSS {first.footprint.rss_mib:.1f} -> {last.footprint.rss_mib:.1f} MiB; "
          f"p99 ingest {first.p99_ms:.1f} -> {last.p99_ms:.1f} ms; "
          f"/metrics {first.render_ms:.1f} -> {last.render_ms:.1f} ms; "
          f"fds {first.footprint.open_files} -> {last.footprint.open_files}; "
          f"threads {first.footprint.threads} -> {last.footprint.threads}")


def section_cpu(args: argparse.Namespace, tmp: Path) -> None:
    """One client against the engine's CPU (issue 35, class 3): a checkpoint flood,
    walk-back resumes and many ranks at rate, each on a fresh sidecar, with another run
    posting a step every 50 ms meanwhile: the worst per-record engine time, and that other
    run's ingest latency during the attack (tests/reliability/cpu_shapes.py).

    Before and after, the same 2-core machine, the committed code before the fix against
    the fix (8,000 checkpoints, 20 walk-backs, 10 steps at 256 ranks); after, full size:

    - checkpoint flood: last batch of 1,000 16.4 s (8.2 ms a record, the ledger
      re-judging every entry on each add), the other run's p99 16.4 s -> 0.37 s (0.21 ms
      a record, flat), p99 0.33 s; at 20,000 checkpoints 0.38 s, p99 0.41 s;
    - walk-back resumes on 2,000 steps x 8 ranks: 2.9 s a resume (4.4 s worst, the
      whole history replayed), p99 4.4 s -> 0.16 s (0.58 s the first, which replays the
      span of the request it lands in), p99 0.53 s; 50 of them: mean 0.12 s;
    - 256 ranks at 1 step/s, every GPU at its power cap: 1.4 s of sidecar CPU a training
      step (5.5 ms a record; gpu_health's per-record median over every peer's window),
      p99 0.58 s (the ranks' 256 requests queued ahead) -> 0.34-0.38 s a step (1.3-1.5 ms
      a record, mostly HTTP for one record a request), p99 83-86 ms.

    What is left of the other run's wait is the one call of the attacking run it comes
    after (one engine call is not cut short): see docs/architecture.md, "What a record
    costs"."""
    from tests.reliability.cpu_shapes import checkpoint_flood, ranks_at_rate, walk_back

    shapes = (
        ("flood", lambda url, pid: checkpoint_flood(url, pid, checkpoints=args.cpu_checkpoints,
                                                    batch=args.cpu_batch)),
        ("walk", lambda url, pid: walk_back(url, pid, steps=args.cpu_walk_steps,
                                            ranks=args.cpu_walk_ranks, walks=args.cpu_walks)),
        ("ranks", lambda url, pid: ranks_at_rate(url, pid, ranks=args.cpu_ranks,
                                                 steps=args.cpu_rank_steps, rate=1.0)),
    )
    for name, attack in shapes:
        with SidecarProcess(tmp / f"cpu-{name}", env=QUIET) as sc:
            print(attack(sc.url, sc.proc.pid).line(), flush=True)


def section_peer(args: argparse.Namespace, tmp: Path) -> None:
    """The peer door and the leader link under attack (issue 48, classes 3 and 6): a real
    2-node run's NaN page latency (node 1's NaN, paged by node 0's sidecar) alone, with
    ``--peer-dead`` leaders that never answer followed by node 1's sidecar, and with those
    and a flood of node exchanges at the leader's peer door under the write token; then
    the share of an honest client's ingest (4 requests a second) refused while the peer
    door is flooded with exchanges whose one finding is malformed (``"layer": ["a"]``),
    under the link's credential (tests/reliability/peer_chaos.py).

    Before and after, the same 2-core machine (shared, load 15-30), the committed code
    before the fix (833dc7e) against the fix, default sizes:

    - the NaN page alone 0.1 s -> 0.1 s; beside 20 dead leaders 40.1 s -> 0.1 s (a link
      serving leaders one after another waited each one's post_timeout_seconds); with a
      peer-door flood too 39.2 s -> 0.1 s (the flood's exchanges 200 -> 401);
    - honest ingest refused during the malformed-finding flood: 135 of 160 (84%, /readyz
      not ready 138 times) -> 0 of 159 (0%; the flood's exchanges 503 -> 422)."""
    from tests.reliability.peer_chaos import malformed_flood, page_latency

    for dead, flood in ((0, False), (args.peer_dead, False), (args.peer_dead, True)):
        (tmp / f"peer-{dead}-{flood}").mkdir()
        print(page_latency(tmp / f"peer-{dead}-{flood}", dead=dead, flood=flood,
                           trials=args.peer_trials).line(), flush=True)
    (tmp / "peer-malformed").mkdir()
    print(malformed_flood(tmp / "peer-malformed", seconds=args.peer_seconds).line(), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--kill-steps", type=int, default=2500)
    ap.add_argument("--outage-seconds", type=float, default=120.0)
    ap.add_argument("--soak-seconds", type=float, default=600.0)
    ap.add_argument("--soak-runs", type=int, default=50)
    ap.add_argument("--soak-window", type=float, default=60.0)
    ap.add_argument("--capacity", type=float, default=0.0,
                    help="records/s; 0 measures it as bench/ingest.py does")
    ap.add_argument("--capacity-seconds", type=float, default=5.0)
    ap.add_argument("--churn-runs", type=int, default=5000)
    ap.add_argument("--cardinality", type=int, default=1_000_000)
    ap.add_argument("--schemathesis-examples", type=int, default=2000)
    ap.add_argument("--amplification-cases", type=int, default=2000)
    ap.add_argument("--readers-records", type=int, default=48,
                    help="records of 6000 layers (~0.6 MiB each) the readers ask for")
    ap.add_argument("--readers-runs", type=int, default=5000,
                    help="small runs stored beside them (the runs lists)")
    ap.add_argument("--name-drift-steps", type=int, default=5000,
                    help="steps of the one-new-layer-name-a-step run (amplification)")
    ap.add_argument("--flood-runs", type=int, nargs="+", default=[0, 120, 5100, 10000],
                    help="made-up runs per flood (one NaN page each; 0: no flood, the "
                    "real page's normal latency)")
    ap.add_argument("--flood-age", type=float, default=4.0,
                    help="seconds the real run has trained before the flood")
    ap.add_argument("--flood-wait", type=float, default=60.0,
                    help="seconds to wait for the real page")
    ap.add_argument("--flood-drain", type=float, default=90.0,
                    help="seconds to let the flood's own messages drain afterwards")
    ap.add_argument("--cpu-checkpoints", type=int, default=20_000)
    ap.add_argument("--cpu-batch", type=int, default=1000, help="checkpoints a request (cpu)")
    ap.add_argument("--cpu-walk-steps", type=int, default=2000)
    ap.add_argument("--cpu-walk-ranks", type=int, default=8)
    ap.add_argument("--cpu-walks", type=int, default=50)
    ap.add_argument("--cpu-ranks", type=int, default=256)
    ap.add_argument("--cpu-rank-steps", type=int, default=30)
    ap.add_argument("--peer-dead", type=int, default=20, help="leaders that never answer")
    ap.add_argument("--peer-trials", type=int, default=3, help="NaN pages timed per setting")
    ap.add_argument("--peer-seconds", type=float, default=40.0,
                    help="seconds of the malformed-finding flood")
    args = ap.parse_args()
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    try:
        for name in chosen:
            print(f"\n== {name} ==", flush=True)
            t0 = time.monotonic()
            globals()[f"section_{name}"](args, tmp)
            print(f"({name}: {time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
