"""A batch of Mooncake puts (one flush of the mirror) is bounded (issue 34): a failed transfer
(a dead peer's segment) skips the rest of the batch, a deadline covers the whole batch, and
the log names the cause. A stand-in client plays the native one; no master is needed."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

pytest.importorskip("mooncake.store", reason="mooncake-transfer-engine not installed")

from hycache.store.master import free_port
from hycache.store.mooncake import (
    NO_AVAILABLE_HANDLE,
    TRANSFER_FAIL,
    MooncakeStore,
)


class FakeClient:
    """Answers each put with `rc` after `delay` seconds, counting the calls."""

    def __init__(self, rc: int, delay: float = 0.0) -> None:
        self.rc = rc
        self.delay = delay
        self.calls = 0

    def put(self, key: str, value: bytes) -> int:
        self.calls += 1
        time.sleep(self.delay)
        return self.rc

    def close(self) -> None:
        pass


def store_with(client: Any, **kw: Any) -> MooncakeStore:
    store = MooncakeStore(f"mooncake://127.0.0.1:{free_port()}", 1 << 20, **kw)  # no master
    store._client, store._retry_at, store._suspect = client, 0.0, False
    return store


ITEMS = [(f"k{i}", b"x" * 64) for i in range(20)]


def test_a_failed_transfer_skips_the_rest_of_the_flush(caplog: pytest.LogCaptureFixture) -> None:
    client = FakeClient(TRANSFER_FAIL)
    store = store_with(client)
    try:
        with caplog.at_level(logging.WARNING, logger="hycache.store"):
            assert store.put(ITEMS) == [False] * len(ITEMS)
        assert client.calls == 1  # one failed transfer, not one per object
        assert store.stats.put_refused == len(ITEMS)
        text = caplog.text
        assert "transfer failed" in text and "store full" not in text
    finally:
        store.close()


def test_a_full_store_is_named_as_such(caplog: pytest.LogCaptureFixture) -> None:
    client = FakeClient(NO_AVAILABLE_HANDLE)
    store = store_with(client)
    try:
        with caplog.at_level(logging.WARNING, logger="hycache.store"):
            assert store.put(ITEMS[:3]) == [False] * 3
        assert client.calls == 3 and "full" in caplog.text
    finally:
        store.close()


def test_a_flush_has_one_deadline_over_all_its_puts() -> None:
    """Each put answers (slowly) within the per-call deadline; the flush's own deadline stops
    the batch after a few of them, whatever its length."""
    client = FakeClient(0, delay=0.05)
    store = store_with(client, call_timeout=5.0, flush_timeout=0.12)
    try:
        out = store.put(ITEMS)
        assert 1 <= client.calls < len(ITEMS) // 2
        assert out[: client.calls] == [True] * client.calls
        assert not any(out[client.calls :])
        assert store.stats.put_refused == len(ITEMS) - client.calls
    finally:
        store.close()
