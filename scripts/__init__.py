"""The repository's own tools that are neither the product nor a benchmark: ``setup.sh``
and ``test.sh`` (the README's install and test commands) and ``traces/``, the recorders of
the test corpora, run from the repository root as ``python -m scripts.traces.X``."""
