"""All detectors of one run behind one object: what the engine drives, live and offline.

One ``DetectorSuite`` per run sees every rank's records in arrival order. It keeps the
shared ``DetectorContext`` (config, layer order, per-rank loss EMA), runs every enabled
detector, marks findings of ``log_only`` types, and snapshots/restores everything as one
JSON-able dict so a sidecar restart changes nothing. Which detectors exist, and in which
order they judge a record, is catalogue.py's ``DETECTOR_CLASSES``.

A step the client's step guard skipped (``StepRecord.guard_skipped``) never reached the
weights: only ``skip_budget`` judges it as sent; every other detector sees its timing but
not its loss, gradients or layers (``_guarded``), so a skipped NaN or spike neither pages
nor enters the loss EMA, and one skip pages nobody.

A run's records in order, a tick of the clock after an hour of silence, and the state taken
back through JSON by a fresh suite (what a sidecar restart does), which then neither forgets
the loss EMA nor reports the same stall again::

    >>> from monitor_agent.records import wire
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings(log_only={"loss_spike"}))
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "loss": 5.0 if s == 60 else 2.0 + 0.02 * (s % 3)})
    ...          for s in range(1, 61)]
    >>> [(f.type, f.step, f.log_only) for rec in steps for f in suite.update(rec)]
    [('loss_spike', 60, True)]
    >>> [(f.type, f.step, f.severity.label) for f in suite.tick(now=60 + 3600.0)]
    [('stalled', 60, 'error')]
    >>> restored = DetectorSuite(DetectorSettings(log_only={"loss_spike"}))
    >>> restored.restore(wire.loads(wire.dumps(suite.snapshot())))
    >>> restored.ema_loss() == suite.ema_loss(), restored.tick(now=60 + 3700.0)
    (True, [])
"""

from __future__ import annotations

import dataclasses
from typing import Any

from monitor_agent.detectors.catalogue import DETECTOR_CLASSES
from monitor_agent.detectors.nan_inf import NanInfDetector
from monitor_agent.detectors.settings import DetectorSettings
from monitor_agent.detectors.support.base import Detector, Explainer
from monitor_agent.detectors.support.context import DetectorContext
from monitor_agent.records.types import Finding, Record, StepRecord

SNAPSHOT_VERSION = 1


class DetectorSuite:
    """Every enabled detector of one run (see module docstring)."""

    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self.ctx = DetectorContext(self.settings)
        self.detectors: list[Detector] = [
            cls(self.settings, self.ctx)
            for cls in DETECTOR_CLASSES
            if cls.type not in self.settings.disabled
        ]
        self.explainers = [d for d in self.detectors if isinstance(d, Explainer)]
        self.run_scoped = [d for d in self.detectors if getattr(d, "scope", "rank") == "run"]

    def update(self, record: Record, remote: bool = False) -> list[Finding]:
        """Judge one record (any kind, any rank of this run); return its findings.

        ``remote``: a digest another node's sidecar forwarded to this one, the run's leader
        (monitor_agent/cluster): only the cross-rank (``scope = "run"``) detectors judge it;
        that node's sidecar judged the rest and forwards its findings."""
        judged = _guarded(record)
        self.ctx.observe(judged)
        findings: list[Finding] = []
        for det in self.run_scoped if remote else self.detectors:
            findings.extend(det.update(record if det.type == "skip_budget" else judged))
        self.ctx.after(judged)
        findings = self._mark(self._explain(findings))
        self.ctx.saw(findings)
        return findings

    def preview(self, record: StepRecord) -> list[Finding]:
        """The nan_inf finding of a step that arrived ahead of its turn, changing no state
        (``NanInfDetector.preview``); [] when nan_inf is disabled or the step is finite."""
        if record.guard_skipped:
            return []
        for det in self.detectors:
            if isinstance(det, NanInfDetector):
                found = det.preview(record)
                return self._mark([found]) if found is not None else []
        return []

    def tick(self, now: float) -> list[Finding]:
        """Clock-driven checks; ``now`` is on the records' clock (wall time live)."""
        findings: list[Finding] = []
        for det in self.detectors:
            findings.extend(det.tick(now))
        findings = self._mark(findings)
        self.ctx.saw(findings)
        return findings

    def retire(self, ranks: set[int]) -> None:
        """Forget ``ranks``: a relaunched job re-formed with fewer (torchrun's re-rendezvous
        numbers the ranks it has from 0), and these send nothing any more, which is no
        hang, no missing step, no straggler."""
        for det in self.detectors:
            held = getattr(det, "ranks", None)  # DetectorBase's per-rank state
            if isinstance(held, dict):
                for rank in ranks:
                    held.pop(rank, None)
        for rank in ranks:
            self.ctx.state.ranks.pop(str(rank), None)
            self.ctx.front.left(rank)

    def ema_loss(self, rank: int = 0) -> float | None:
        """The bias-corrected EMA of rank ``rank``'s training loss (None before any)."""
        return self.ctx.ema_loss(rank)

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "context": self.ctx.snapshot(),
            "detectors": {det.type: det.snapshot() for det in self.detectors},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Take back a ``snapshot()``; detectors missing from it start fresh."""
        if state.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported detector snapshot version {state.get('version')!r}")
        self.ctx.restore(state["context"])
        saved = state.get("detectors", {})
        for det in self.detectors:
            if det.type in saved:
                det.restore(saved[det.type])

    def _explain(self, findings: list[Finding]) -> list[Finding]:
        """A finding whose cause another detector saw (an LR jump in force) says so in its
        message, where every channel shows it, and first in its evidence."""
        if not findings or not self.explainers:
            return findings
        out = []
        for f in findings:
            cause = next((c for e in self.explainers if (c := e.explain(f)) is not None), None)
            if cause is not None:
                f = dataclasses.replace(f, message=f"{f.message}; likely cause: {cause}",
                                        evidence={"likely_cause": cause, **f.evidence})
            out.append(f)
        return out

    def _mark(self, findings: list[Finding]) -> list[Finding]:
        log_only = self.settings.log_only
        if not log_only:
            return findings
        return [
            dataclasses.replace(f, log_only=True) if f.type in log_only else f for f in findings
        ]


# What a guard-skipped step carries about the weights, which its batch never reached.
_UNAPPLIED = dict(loss=None, grad_norm=None, param_norm=None, update_norm=None, layers=None,
                  grad_hist=None, param_hist=None, grad_quantiles=None, param_quantiles=None,
                  activations=None, grad_norms=None, nonfinite_modules=None,
                  nonfinite_module_count=None, nonfinite_check=None)


def _guarded(record: Record) -> Record:
    """``record``, or for a step the guard skipped, the step without what it would have
    done to the weights (its timing and the skip itself stay)."""
    if isinstance(record, StepRecord) and record.guard_skipped:
        return dataclasses.replace(record, **_UNAPPLIED)  # type: ignore[arg-type]
    return record
