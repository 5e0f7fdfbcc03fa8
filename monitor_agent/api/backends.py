"""``Backends``: the parts of the app that exist only once the databases are open.

serving/app.py's lifespan sets ``Services.backends`` to one, once storage opened; until then
``Services`` answers 503 for each of them (api/services.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from monitor_agent.alerting import Alerting
from monitor_agent.pipeline.engine import Engine
from monitor_agent.reads.exposition import Exposition
from monitor_agent.reads.queries import RunQueries


@dataclass(frozen=True, slots=True)
class Backends:
    """What exists only once the databases are open."""

    engine: Engine
    queries: RunQueries
    alerting: Alerting
    exposition: Exposition
