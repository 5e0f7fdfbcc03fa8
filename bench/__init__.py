"""The benchmarks: one script per measured figure (bench/README.md), run from the
repository root as ``python -m bench.X`` (``--help`` says what each one takes).

They print numbers; tests assert behaviour. What several scripts share is a public name in
one module (``bench.harness``: the client-cost model and step; ``bench.precision``: the
scoring of labelled traces; ``bench.ingest``, ``bench.cluster_load``: their payloads), and
the test suite's helpers (a real sidecar, receivers, the namespace cluster) are imported as
``tests.X``. No script edits ``sys.path`` or imports another's private names
(``tests/test_bench.py``). The recorders of the traces the detection figures are measured
on live with the corpora, in ``scripts/traces/``.
"""
