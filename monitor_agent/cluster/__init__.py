"""One run, one brain: a multi-node run judged, paged and acted on by one sidecar.

Each node's sidecar ingests its own ranks' records (the training step's path stays a
loopback POST) and forwards a compact digest of them to the run's *leader*, the sidecar of
node 0, which holds the cross-rank judgement, the run's pages and its actions
(docs/architecture.md, "One run, one brain").
"""
