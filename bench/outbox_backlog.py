"""Outbox under a backlog: what a fresh page pays for N undeliverable messages ahead of it.

A real outbox (SQLite file) and a real local PagerDuty receiver. N messages of other runs
are queued and in backoff (their receiver failed them); one fresh page is queued behind
them. We time ``deliver_next`` choosing and delivering the fresh one (order is kept per
alert, so the backlog does not block it; it only costs the scan that finds it), and a
``deliver_next`` that finds nothing due (what each sender loop costs during an outage).

    python -m bench.outbox_backlog [--pending 100 1000 10000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from monitor_agent.alerting.db import open_alert_db
from monitor_agent.metrics.delivery import DeliveryMetrics
from monitor_agent.notify.channel_settings import OutboxSettings
from monitor_agent.notify.outbox import Outbox
from monitor_agent.notify.pagerduty import PagerDutyNotifier
from tests.notify.sample_events import event, note
from tests.receivers import Receiver

KEY = "0123456789abcdef0123456789abcdef"


def measure(pending: int, repeat: int, receiver: Receiver, tmp: Path) -> tuple[float, float]:
    now = time.time()
    outbox = Outbox(open_alert_db(tmp / f"a{pending}.sqlite"),
                    {"pagerduty": PagerDutyNotifier(KEY, receiver.url)},
                    OutboxSettings(max_pending=pending + repeat + 1),
                    DeliveryMetrics(CollectorRegistry(), ["pagerduty"]), clock=lambda: now)
    with outbox.db.tx() as conn:
        for i in range(pending):
            outbox.enqueue(conn, "pagerduty", note(event(fingerprint=f"old{i}")), now)
        conn.execute("UPDATE outbox SET attempts = 1, next_at = ?", (now + 3600,))
    idle, fresh = [], []
    with httpx.Client() as client:
        for i in range(repeat):
            t0 = time.perf_counter()
            outbox.deliver_next("pagerduty", client)
            idle.append(time.perf_counter() - t0)
            with outbox.db.tx() as conn:
                outbox.enqueue(conn, "pagerduty", note(event(fingerprint=f"new{i}")), now)
            t0 = time.perf_counter()
            outbox.deliver_next("pagerduty", client)
            fresh.append(time.perf_counter() - t0)
    outbox.db.close()
    assert len(receiver.accepted()) >= repeat, "the fresh pages were not delivered"
    return statistics.median(idle), statistics.median(fresh)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pending", type=int, nargs="+", default=[100, 1000, 10000])
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    print(f"{'pending in backoff':>20} {'idle scan ms':>14} {'fresh page delivered ms':>25}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.pending:
            with Receiver("pagerduty") as receiver:
                idle, fresh = measure(n, args.repeat, receiver, Path(tmp))
            print(f"{n:>20} {idle * 1e3:>14.2f} {fresh * 1e3:>25.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
