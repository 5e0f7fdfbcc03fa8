"""Anomaly detectors: one small class per finding type, run together per training run by
``DetectorSuite``.

Layout: each module here is one detector (``update_ratio.py``: the high/low pair) and
declares, next to its logic, its knobs (a ``SharedSettings`` subclass), its type and usual
severity, and its suggestions. ``catalogue.DETECTOR_CLASSES`` is the one registry: the suite
runs what it lists, ``FINDING_TYPES`` / ``USUAL_SEVERITY`` are read from it, and
``DetectorSettings`` (settings.py: flat) is composed from its settings models. What the
detectors share lives in ``support/``; a detector never imports another detector.

Adding a detector: write ``detectors/<type>.py`` (its settings model: knobs with defaults,
limits and descriptions; its ``DetectorBase`` subclass; suggestions), list its class in
``catalogue.DETECTOR_CLASSES``, add its test.

One suite per run, a knob changed by its flat name; records go in, findings come out::

    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings(spike_z=8))
    >>> suite.settings.spike_z
    8.0
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "loss": 2.0 if s < 3 else "NaN"}) for s in (1, 2, 3)]
    >>> [(f.type, f.step, f.severity.label) for rec in steps for f in suite.update(rec)]
    [('nan_inf', 3, 'critical')]
"""

from monitor_agent.detectors.catalogue import FINDING_TYPES
from monitor_agent.detectors.settings import DetectorSettings
from monitor_agent.detectors.suite import DetectorSuite

__all__ = ["FINDING_TYPES", "DetectorSettings", "DetectorSuite"]
