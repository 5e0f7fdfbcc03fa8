#!/usr/bin/env bash
# The test suite: unit, integration (real uvicorn, SQLite, HTTP receivers) and the
# Prometheus/Alertmanager binaries. Benchmarks and soaks live in bench/.
#
# Three worker processes (pytest-xdist), one test file to a worker: most of the suite waits
# on subprocesses, sockets and browsers, so on 2 cores three workers take about 11 minutes
# where one took 22. The shared CPU makes every wait slower, so the waits of
# tests/eventually.py are stretched (MONITOR_TEST_TIME_SCALE); a passing wait returns as soon
# as its condition holds, so this costs nothing. TEST_WORKERS=0 runs in one process. The
# slowest tests are listed at the end (--durations): where the suite's minutes go.
set -euo pipefail
cd "$(dirname "$0")/.."
export MONITOR_TEST_TIME_SCALE="${MONITOR_TEST_TIME_SCALE:-2}"
exec "${PYTHON:-python3}" -m pytest -q -n "${TEST_WORKERS:-3}" --dist loadfile --durations=25 "$@"
