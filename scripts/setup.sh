#!/usr/bin/env bash
# Install the sidecar, the client and everything the tests need (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
py=${PYTHON:-python3}
# torch first and pinned: any other spec pulls gigabytes of CUDA wheels.
"$py" -m pip install -q "torch==2.13.0"
"$py" -m pip install -q -e ".[dev]" -e "./client"
# Only after torch, so they reuse the pinned CPU build.
"$py" -m pip install -q "torch==2.13.0" "transformers>=4.40" "accelerate>=1.1" "lightning>=2.2"
