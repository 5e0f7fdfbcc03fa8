"""Cardinality bombs against a running sidecar: distinct layer names, run ids or label
values by the hundred thousand, with the sidecar's resident memory watched throughout.

Example::

    result = layer_bomb(sidecar.url, sidecar.proc.pid, names=1_000_000)
    print(result.line())
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from dataclasses import dataclass, field

import httpx

from monitor_agent.records import wire
from tests.reliability.process_probe import ProcessProbe

NDJSON_GZIP = {"content-type": "application/x-ndjson", "content-encoding": "gzip"}


@dataclass
class BombResult:
    """What one attack did to the sidecar."""

    attack: str
    distinct: int
    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    statuses: Counter = field(default_factory=Counter)
    accepted: int = 0
    rejected: int = 0
    series_on_metrics: int = 0
    alive: bool = True

    def line(self) -> str:
        mib = 1 << 20
        return (f"{self.attack}: {self.distinct:,} distinct -> HTTP {dict(self.statuses)}, "
                f"{self.accepted:,} records accepted, {self.rejected:,} rejected; RSS "
                f"{self.rss_before / mib:.0f} -> peak {self.rss_peak / mib:.0f} -> "
                f"{self.rss_after / mib:.0f} MiB; {self.series_on_metrics:,} series on "
                f"/metrics; sidecar alive: {self.alive}")


def _send(http: httpx.Client, url: str, records: list[dict], result: BombResult) -> None:
    body = gzip.compress(b"\n".join(wire.dumps(r) for r in records), 1)
    r = http.post(url + "/v1/records", content=body, headers=NDJSON_GZIP)
    result.statuses[r.status_code] += 1
    if r.status_code == 200:
        answer = r.json()
        result.accepted += answer["accepted"]
        result.rejected += len(answer["rejected"])
    else:
        result.rejected += len(records)


def _attack(url: str, pid: int, name: str, distinct: int, batches) -> BombResult:
    result = BombResult(name, distinct)
    probe = ProcessProbe(pid)
    result.rss_before = probe.sample().rss_bytes
    with probe.watching(0.05), httpx.Client(timeout=120) as http:
        for records in batches:
            _send(http, url, records, result)
        text = http.get(url + "/metrics").text
        result.series_on_metrics = sum(1 for ln in text.splitlines() if ln and ln[0] != "#")
        result.alive = http.get(url + "/healthz").status_code == 200
    result.rss_peak = probe.peak_rss_bytes
    result.rss_after = probe.sample().rss_bytes
    return result


def layer_bomb(url: str, pid: int, names: int, per_record: int = 2000,
               per_batch: int = 25) -> BombResult:
    """One run whose every step reports ``per_record`` layer names never seen before."""
    def batches():
        step, sent = 1, 0
        while sent < names:
            records = []
            for _ in range(per_batch):
                if sent >= names:
                    break
                n = min(per_record, names - sent)
                layers = {f"bomb.{sent + i}.weight": {"grad_norm": 1.0} for i in range(n)}
                records.append({"kind": "step", "run_id": "layer-bomb", "step": step,
                                "time": float(step), "loss": 1.0, "layers": layers})
                step, sent = step + 1, sent + n
            yield records
    return _attack(url, pid, "layer names", names, batches())


def run_bomb(url: str, pid: int, runs: int, per_batch: int = 10_000) -> BombResult:
    """``runs`` distinct run ids, one step each."""
    def batches():
        for start in range(0, runs, per_batch):
            yield [{"kind": "step", "run_id": f"run-bomb-{i}", "step": 1, "time": 1.0,
                    "loss": 1.0} for i in range(start, min(runs, start + per_batch))]
    return _attack(url, pid, "run ids", runs, batches())


def label_bomb(url: str, pid: int, values: int, per_record: int = 1000,
               per_batch: int = 50) -> BombResult:
    """Run records whose labels carry ``values`` distinct label values in all."""
    def batches():
        sent, n = 0, 0
        while sent < values:
            records = []
            for _ in range(per_batch):
                if sent >= values:
                    break
                labels = {f"k{i}": f"v{sent + i}" for i in range(min(per_record, values - sent))}
                records.append({"kind": "run", "run_id": f"label-bomb-{n}", "labels": labels})
                sent, n = sent + len(labels), n + 1
            yield records
    return _attack(url, pid, "label values", values, batches())


def metric_count(text: str, name: str) -> int:
    return len(re.findall(rf"^{name}{{", text, re.M))
