"""Session settings for every test directory.

- Under pytest-xdist (`make test` runs `-n 2`) each worker gets its share of the CPU's
  threads, so two workers running torch do not oversubscribe the cores.
- After a test that grew the process by more than `COLLECT_AFTER_GROWTH` resident bytes,
  Python's cyclic collector runs: it counts objects, not bytes, so an engine caught in a
  reference cycle would otherwise hold its GBs across the next tests, in both workers at
  once. A safety net: the engines the bench builds and an engine with a store hold none
  (`tests/bench/test_closed_loop.py`, `tests/store/test_store_engine.py` check it without it).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

COLLECT_AFTER_GROWTH = 512 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")


def pytest_configure(config: pytest.Config) -> None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


@pytest.fixture(autouse=True)
def _collect_cycles_after_a_big_test() -> Iterator[None]:
    if not os.path.exists("/proc/self/statm"):
        yield
        return
    before = _resident_bytes()
    yield
    if _resident_bytes() - before > COLLECT_AFTER_GROWTH:
        gc.collect()
