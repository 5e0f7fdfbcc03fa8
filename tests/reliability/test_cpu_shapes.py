"""One client cannot make the engine's work per record grow with its run (issue 35, class
3), over real HTTP (uvicorn, SQLite): a checkpoint flood and walk-back resumes, small,
with another run posting meanwhile. Held by operation counts, not timings; bench/chaos.py
``--sections cpu`` times the full-size shapes."""

from __future__ import annotations

import os
from pathlib import Path

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer
from tests.reliability.cpu_shapes import checkpoint_flood, walk_back


def test_a_checkpoint_flood_and_walk_back_resumes_cost_per_record_what_they_always_do(
        tmp_path: Path):
    every = 16
    with LiveServer(load_settings(data_dir=tmp_path, snapshot_every_steps=every)) as srv:
        engine = srv.app.state.services.engine
        flood = checkpoint_flood(srv.url, os.getpid(), checkpoints=600, batch=200,
                                 interval=0.02)
        ledger = engine.registry.get("flood").state.ledger
        # One judgement a checkpoint: re-judging every entry on each add made it 180,300.
        assert ledger.judgements == 600 and ledger.last_clean_step == 600
        assert flood.victim.seconds and flood.records == 1200

        before = engine.replayed
        walks, ranks = 10, 2
        resumed = walk_back(srv.url, os.getpid(), steps=200, ranks=ranks, walks=walks,
                            batch=8 * ranks, interval=0.02)
        # Each resume replays what lies between the newest snapshot below its start and
        # its start: about the snapshot distance (it was the whole history, 400 records).
        assert engine.replayed - before <= walks * (every + 8) * ranks
        assert len(resumed.requests) == walks and resumed.victim.seconds
        run = engine.registry.get("walk")
        assert run.state.last_step == 200 - walks
        assert run.attempts.current == walks + 1
