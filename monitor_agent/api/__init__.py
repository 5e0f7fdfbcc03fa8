"""HTTP routers, one per resource, over the plumbing they share (body, record_batch,
deps, models, ...); no router imports another (tests/test_architecture.py)."""
