"""The test suite, a package so that its helpers have one name each, ``tests.X``.

Tests and benchmarks alike import the shared helpers by that name (``from
tests.sidecar_process import SidecarProcess``, ``from tests.eventually import eventually``,
``tests.netcluster``, ``tests.reliability.soak``): from the repository root, where
``pytest`` and ``python -m bench.X`` run, no ``sys.path`` edit is needed. A folder's own
helpers that nothing outside it uses (``alert_harness``, ``synth_records``, ...) are still
imported by their plain name next to the tests that use them (pytest puts that folder on
the path).
"""
