"""The second cache tier: a store of attention blocks and SSM checkpoints behind the device pool.

    open_store("host", gb=4.0)                          # the embedded host-RAM LRU
    open_store("mooncake://127.0.0.1:50051", gb=4.0)    # a Mooncake master shared by processes

What goes in, when, and how a lookup uses it lives with the cache (`hycache.cache.mirror`);
this package owns the backends, the object names and the value framing.
"""

from __future__ import annotations

from hycache.store.base import KVStore, StoreStats
from hycache.store.host import HostStore

GB = 2**30
MAX_STORE_GB = float(2**20)  # 1 PiB: more than any one process (or simulated store) holds


def check_store_gb(gb: float) -> float:
    """The one rule for a store's size in GiB (`--kv-store-gb` of generate, serve, bench and
    simulate, `LLM(kv_store_gb=...)`, the simulated tier): a number > 0 and at most
    `MAX_STORE_GB`. Raises ValueError with the same message everywhere."""
    if not 0 < gb <= MAX_STORE_GB:  # NaN fails too
        raise ValueError(
            f"kv-store-gb: must be a number > 0 and at most {MAX_STORE_GB:.0f} (GiB), got {gb:g}"
        )
    return gb


def open_store(spec: str, gb: float) -> KVStore:
    """`host` or `mooncake://HOST:PORT`, with `gb` GiB of this process's memory."""
    check_store_gb(gb)
    if spec == "host":
        return HostStore(int(gb * GB))
    if spec.startswith("mooncake://"):
        from hycache.store.mooncake import MooncakeStore

        return MooncakeStore(spec, int(gb * GB))
    raise ValueError(f"kv-store: expected 'host' or 'mooncake://HOST:PORT', got {spec!r}")


__all__ = [
    "GB",
    "MAX_STORE_GB",
    "HostStore",
    "KVStore",
    "StoreStats",
    "check_store_gb",
    "open_store",
]
