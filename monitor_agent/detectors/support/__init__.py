"""What the detectors share and are not detectors themselves: the base class and repeat
limiter (``common``), the run context (``context``), robust statistics (``stats``),
per-layer and per-module state (``layer_stats``, ``layer_bands``, ``slots``), snapshot
helpers (``state``), the training phase (``phase``) and the non-finite parameter scan
(``nonfinite``). A detector imports what it needs from these modules (``DetectorBase`` and
``fmt`` from ``support.common``, ``Window`` and ``finite`` from ``support.stats``), never
from a sibling detector.
"""
