"""The second cache tier: a store of attention blocks and SSM checkpoints behind the device pool.

    open_store("host", gb=4.0)                          # the embedded host-RAM LRU
    open_store("mooncake://127.0.0.1:50051", gb=4.0)    # a Mooncake master shared by processes

What goes in, when, and how a lookup uses it lives with the cache (`hycache.cache.mirror`);
this package owns the backends, the object names and the value framing.
"""

from __future__ import annotations

import math

from hycache.store.base import KVStore, StoreStats
from hycache.store.host import HostStore

GB = 2**30


def open_store(spec: str, gb: float) -> KVStore:
    """`host` or `mooncake://HOST:PORT`, with `gb` GiB of this process's memory."""
    if not 0 < gb < math.inf:
        raise ValueError(f"kv-store-gb: must be a finite number > 0, got {gb}")
    if spec == "host":
        return HostStore(int(gb * GB))
    if spec.startswith("mooncake://"):
        from hycache.store.mooncake import MooncakeStore

        return MooncakeStore(spec, int(gb * GB))
    raise ValueError(f"kv-store: expected 'host' or 'mooncake://HOST:PORT', got {spec!r}")


__all__ = ["GB", "HostStore", "KVStore", "StoreStats", "open_store"]
