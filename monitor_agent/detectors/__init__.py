"""Anomaly detectors: one small class per finding type behind one protocol, run together
per training run by ``DetectorSuite``.

Example::

    from monitor_agent.detectors import DetectorSettings, DetectorSuite, FINDING_TYPES

    suite = DetectorSuite(DetectorSettings())
    findings = suite.update(record)
"""

from monitor_agent.detectors.catalogue import FINDING_TYPES
from monitor_agent.detectors.settings import DetectorSettings
from monitor_agent.detectors.suite import DetectorSuite

__all__ = ["FINDING_TYPES", "DetectorSettings", "DetectorSuite"]
