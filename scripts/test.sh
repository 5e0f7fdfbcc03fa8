#!/usr/bin/env bash
# The test suite: unit, integration (real uvicorn, SQLite, HTTP receivers) and the
# Prometheus/Alertmanager binaries. Benchmarks and soaks live in bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m pytest -q "$@"
