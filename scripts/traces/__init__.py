"""The recorders of ``tests/traces/``: real CPU training runs through the real client, and
the labels written from what each recording measurably did (README.md). They measure
nothing themselves; run from the repository root, e.g. ``python -m
scripts.traces.record_traces --labels``."""
