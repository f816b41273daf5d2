"""The store interface every second-tier backend implements, and its counters.

A store holds immutable objects under string names: batched `exists`, `get`, `put`, `remove`.
Backends never raise for an unreachable or full store: a failed `get` is a miss, a failed
`put` is refused (False), and both are counted in `StoreStats` (the first failure of a kind is
logged once). Values are framed and checksummed by `hycache.store.codec`, so a backend may be
a dumb byte store.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

log = logging.getLogger("hycache.store")


@dataclass
class StoreStats:
    exists_calls: int = 0
    exists_keys: int = 0
    get_keys: int = 0
    get_hits: int = 0
    get_misses: int = 0
    corrupt: int = 0  # objects read back that failed their checksum, size or key check
    puts: int = 0
    put_bytes: int = 0
    put_refused: int = 0  # full store, too large, or the backend refused
    removed: int = 0
    errors: int = 0  # calls the backend could not answer (unreachable, timed out)
    _warned: set[str] = field(default_factory=set, repr=False)

    def warn_once(self, kind: str, message: str) -> None:
        """Log `message` the first time a failure of `kind` happens; count every time."""
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s (further failures of this kind are counted, not logged)", message)

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


class KVStore(ABC):
    """A second cache tier: named immutable objects. Every call is batched."""

    name: str = "store"

    def __init__(self) -> None:
        self.stats = StoreStats()

    @abstractmethod
    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Which keys name a stored object (False for all when the store is unreachable)."""

    @abstractmethod
    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        """The stored bytes of each key, None for a miss (or an unreachable store)."""

    @abstractmethod
    def put(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        """Store each (key, value); False where refused. A key already stored keeps its first
        value (objects are immutable) and counts as stored."""

    @abstractmethod
    def remove(self, keys: Sequence[str]) -> int:
        """Remove keys; returns how many were removed."""

    @property
    @abstractmethod
    def capacity_bytes(self) -> int:
        """Bytes this process gives the store (0: unknown or none)."""

    @property
    @abstractmethod
    def used_bytes(self) -> int:
        """Bytes of objects this process can account for (0 when the backend cannot tell)."""

    def close(self) -> None:  # noqa: B027 - optional for backends
        """Release connections and memory."""
