"""A pytest plugin for a CUDA machine: every tensor a test makes without naming a device is
made on the GPU (``torch.set_default_device("cuda")``), so the client's own training-shape
tests, written the way users write their loops, run their models, optimizers and
statistics on the device. ``bench.gpu_check --sections shapes`` runs them with it::

    python -m pytest -p bench.on_cuda tests/client/test_training_shapes.py
"""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    if not torch.cuda.is_available():
        raise pytest.UsageError("bench.on_cuda needs a CUDA GPU")
    torch.set_default_device("cuda")
