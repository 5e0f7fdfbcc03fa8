"""The recorders' stand-in for the client's sender: a real ``Monitor`` whose records are
kept in memory as they are made (no sidecar), so a recording is the records the client
would have sent, step for step."""

from __future__ import annotations

import os

from monitor_client import Monitor, MonitorSettings


class Capture:
    """Stands in for the client's sender: materialises each record now, keeps it."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def submit(self, item, urgent: bool = False) -> None:
        self.records.append(item.materialize() if hasattr(item, "materialize") else item)

    def flush(self, timeout: float = 0.0) -> bool:
        return True

    def close(self, timeout: float = 0.0) -> bool:
        return True

    def counters(self):
        return None


def monitor(name: str, config: dict) -> tuple[Monitor, Capture]:
    mon = Monitor(url="http://127.0.0.1:9", project="traces", run_id=name, config=config,
                  settings=MonitorSettings(install_hooks=False,
                                           spool_dir=f"/tmp/record-traces-{os.getpid()}"))
    mon._sender.close(0.1)  # the in-memory capture replaces the HTTP sender
    mon._sender = capture = Capture()
    return mon, capture
