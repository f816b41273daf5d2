"""`host`: the embedded default second tier, a bounded host-RAM LRU in this process.

Capacity is in bytes of stored values. A put evicts least recently used objects until the new
one fits; an object larger than the whole store is refused. `get` (and a repeated `put`) refresh an
object's recency (a hit is a use).

`size_of` (default `len`) says how many bytes a value counts for: the simulator stores tiny
stand-in values that name the size of the block they model (`hycache.sim.tier`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from hycache.store.base import KVStore


class HostStore(KVStore):
    name = "host"

    def __init__(self, capacity_bytes: int, size_of: Callable[[bytes], int] | None = None) -> None:
        super().__init__()
        if capacity_bytes <= 0:
            raise ValueError(
                f"kv_store_gb: the host store needs a capacity > 0, got {capacity_bytes} bytes"
            )
        self._capacity = int(capacity_bytes)
        self._used = 0
        self._objects: OrderedDict[str, bytes] = OrderedDict()
        self._size: Callable[[bytes], int] = size_of or len
        self.evictions = 0

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._objects)

    def exists(self, keys: Sequence[str]) -> list[bool]:
        self.stats.exists_calls += 1
        self.stats.exists_keys += len(keys)
        return [k in self._objects for k in keys]

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for k in keys:
            value = self._objects.get(k)
            if value is None:
                self.stats.get_misses += 1
            else:
                self._objects.move_to_end(k)
                self.stats.get_hits += 1
            out.append(value)
        self.stats.get_keys += len(keys)
        return out

    def put(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        out: list[bool] = []
        for key, value in items:
            if key in self._objects:
                self._objects.move_to_end(key)
                out.append(True)
                continue
            size = self._size(value)
            if size > self._capacity:
                self.stats.put_refused += 1
                self.stats.warn_once(
                    "too-large",
                    f"host store: an object of {size} bytes exceeds the store's "
                    f"{self._capacity} bytes; raise --kv-store-gb",
                )
                out.append(False)
                continue
            while self._used + size > self._capacity:
                _, old = self._objects.popitem(last=False)
                self._used -= self._size(old)
                self.evictions += 1
            self._objects[key] = bytes(value)
            self._used += size
            self.stats.puts += 1
            self.stats.put_bytes += size
            out.append(True)
        return out

    def remove(self, keys: Sequence[str]) -> int:
        n = 0
        for k in keys:
            value = self._objects.pop(k, None)
            if value is not None:
                self._used -= self._size(value)
                n += 1
        self.stats.removed += n
        return n

    def close(self) -> None:
        self._objects.clear()
        self._used = 0
