"""A really full disk: the sidecar's data dir on a small tmpfs, records posted until it
refuses, then the tmpfs grown. Shared by tests/reliability/test_disk_trouble.py and
bench/chaos.py. Needs mount rights (root).

Example::

    report = disk_full(mountpoint)   # mountpoint: an existing, empty directory
    print(report.line())
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field

import httpx

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer


def sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True, capture_output=True)


def steps(run: str, start: int, n: int = 20) -> dict:
    blob = {f"layer{i}": {"grad_norm": 1.0, "param_norm": 1.0} for i in range(200)}
    return {"records": [{"kind": "step", "run_id": run, "step": s, "time": float(s),
                         "loss": 1.0, "layers": blob} for s in range(start, start + n)]}


def wait_ready(url: str, timeout: float = 15.0) -> float:
    """Seconds until /readyz says 200, which bench/chaos.py reports (AssertionError after
    ``timeout``, scaled)."""
    def ready() -> None:
        res = httpx.get(url + "/readyz")
        assert res.status_code == 200, res.text

    start = time.monotonic()
    eventually(ready, timeout=timeout, interval=0.05, what="/readyz 200 again")
    return time.monotonic() - start


@dataclass
class DiskReport:
    accepted: int = 0              # records acknowledged before the disk filled
    stored: int = 0                # records the sidecar holds for the run afterwards
    refusal: int = 0               # HTTP status of the first refused write
    refusal_detail: str = ""
    readyz: int = 0                # /readyz status while full
    readyz_reason: str = ""
    recovered_after_s: float = -1  # from growing the disk to ready again
    accepted_after: int = 0        # records of the write after recovery (the refused one again)
    duplicates_after: int = 0      # ... of those, already stored by the refused write
    statuses: list[int] = field(default_factory=list)

    def line(self) -> str:
        return (f"disk full: {self.accepted} records acknowledged, {self.stored} stored "
                f"(acknowledged == stored: {self.accepted == self.stored}); then HTTP "
                f"{self.refusal} '{self.refusal_detail[:60]}', /readyz {self.readyz}; "
                f"space freed -> ready in {self.recovered_after_s:.2f} s, next write "
                f"accepted {self.accepted_after}, duplicates {self.duplicates_after}")


def disk_full(mountpoint, size: str = "3m", mount: bool = True) -> DiskReport:
    """``mount``: mount the tmpfs here (False: the caller did, at ``size``)."""
    if mount:
        sh(f"mount -t tmpfs -o size={size} tmpfs {mountpoint}")
    settings = load_settings(data_dir=mountpoint, tick_interval_seconds=0.1,
                             max_body_bytes=512 * 1024)
    report, step = DiskReport(), 1
    with LiveServer(settings) as srv:
        while step < 20_000:
            r = httpx.post(srv.url + "/v1/records", json=steps("full", step), timeout=10)
            report.statuses.append(r.status_code)
            if r.status_code != 200:
                report.refusal, report.refusal_detail = r.status_code, r.json()["detail"]
                break
            report.accepted += r.json()["accepted"]
            step += 20
        ready = httpx.get(srv.url + "/readyz")
        report.readyz, report.readyz_reason = ready.status_code, ready.json().get("reason", "")
        stored = httpx.get(srv.url + "/v1/runs/full/records", params={"limit": 10_000})
        report.stored = len(stored.json()["records"])
        sh(f"mount -o remount,size=64m {mountpoint}")
        report.recovered_after_s = wait_ready(srv.url)
        again = httpx.post(srv.url + "/v1/records", json=steps("full", step), timeout=10)
        if again.status_code == 200:
            report.accepted_after = again.json().get("accepted", 0)
            report.duplicates_after = again.json().get("duplicates", 0)
    return report
