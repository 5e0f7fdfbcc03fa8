"""What the detectors share and are not detectors themselves: the base class and repeat
limiter (``common``), the run context (``context``), robust statistics (``stats``),
per-layer and per-module state (``layer_stats``, ``layer_bands``, ``slots``), snapshot
helpers (``state``), the training phase (``phase``) and the non-finite parameter scan
(``nonfinite``). A detector imports from here, never from a sibling detector.

Example::

    from monitor_agent.detectors.support.common import DetectorBase, fmt
    from monitor_agent.detectors.support.stats import Window, amp_overflow, finite
"""
