"""A fake clock, finding makers and an Alerting service wired to local receivers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from monitor_agent.alerting import Alerting, AlertingSettings, RunContext
from monitor_agent.records.types import Finding, Severity
from tests.eventually import eventually
from tests.receivers import Receiver

ROUTING_KEY = "R0UT1NGKEY-secret-0123456789abcd"
T0 = 1_700_000_000.0


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def nan(run_id: str = "r1", step: int = 10, layer: str | None = None, **kw: Any) -> Finding:
    return Finding(type="nan_inf", severity=Severity.CRITICAL, run_id=run_id, step=step,
                   message="loss is NaN", layer=layer, value=float("nan"), threshold=2.3,
                   suggestions=("lower the learning rate", "check the batch"), **kw)


def spike(run_id: str = "r1", step: int = 10) -> Finding:
    return Finding(type="loss_spike", severity=Severity.WARNING, run_id=run_id, step=step,
                   message="loss 4.2 is 2.0x its EMA", value=4.2, threshold=2.1)


class Harness:
    """An Alerting service on a file database, delivering to local receivers."""

    def __init__(self, tmp: Path, clock: FakeClock, slack: Receiver, pd: Receiver,
                 **settings: Any) -> None:
        self.clock, self.slack, self.pd = clock, slack, pd
        self.db_path = tmp / "alerts.sqlite"
        self.settings = AlertingSettings(
            grafana_url="http://grafana.test:3000", group_wait_seconds=0,
            slack={"webhook_url": slack.url + "/services/T0/B0/secret", "min_interval_seconds": 0},
            pagerduty={"routing_key": ROUTING_KEY, "url": pd.url + "/v2/enqueue"},
            outbox={"backoff_base_seconds": 0.01, "backoff_cap_seconds": 0.05},
            **settings,
        )
        self.registry = CollectorRegistry()
        self.alerting = self.open()

    def open(self) -> Alerting:
        self.registry = CollectorRegistry()
        self.alerting = Alerting(self.settings, self.db_path, self.registry, clock=self.clock)
        self.alerting.start()
        return self.alerting

    def restart(self) -> Alerting:
        self.alerting.stop(timeout=5)
        self.alerting.db.close()
        return self.open()

    def handle(self, *findings: Finding, run: str = "r1") -> None:
        self.alerting.handle(RunContext(run, project="proj", labels={"team": "nlp"}),
                             list(findings), self.clock())

    def tick(self, advance: float = 0.0) -> None:
        """Let what is due now go out, then move the clock and tick."""
        self.drain()
        self.alerting.tick(self.clock.advance(advance))

    def drain(self, timeout: float = 10.0, advance: bool = False) -> None:
        """Wait until due groups were flushed and the outbox delivered (or gave up on) all."""
        due = self.settings.group_wait_seconds == 0

        def drained() -> bool:
            # Pending alerts first, then the outbox: a flush commits an alert's firing with
            # the message it queues, so once none is pending each is counted. Read the other
            # way round, a flush between the two reads left a warning unsent (a flake of
            # test_silence_mutes_then_releases).
            if not (due and self.alerting.list_alerts("pending")) \
                    and not self.alerting.outbox.pending:
                return True
            if advance:  # let backoff delays pass on the fake clock
                self.clock.advance(1.0)
            return False

        eventually(drained, timeout=timeout, interval=0.01,
                   what="the due alerts flushed and the outbox drained")

    def decisions(self) -> dict[str, float]:
        out = {}
        for metric in self.registry.collect():
            if metric.name == "monitor_agent_alert_decisions":
                for s in metric.samples:
                    if s.name.endswith("_total"):
                        out[s.labels["reason"]] = s.value
        return out
