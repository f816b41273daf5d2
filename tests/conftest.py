"""Session settings for every test directory: under pytest-xdist (`make test` runs `-n 2`)
each worker gets its share of the CPU's threads, so two workers running torch do not
oversubscribe the cores."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
