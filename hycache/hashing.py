"""Chained, seeded prefix hashes in match units (architecture §4.1): the keys a request
carries (`Request.hashes`) and the cache and the store match on. Below both, so a request is
hashed without importing the cache.

Unit k's hash covers (hash of unit k-1, its u tokens, the request's extra keys), so it
fingerprints the whole prefix [0, k*u). xxh3-128 with a configurable seed: two processes (or an
engine and an external store) with the same seed agree on every key.

Lookahead keys (§4.5: the `lookahead`/`limit` policies) also cover the token after the unit:
key(n) = H(hash of [0, n), token n), so it exists only once token n is known.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

Hash = bytes  # 16-byte digest


def extra_key_bytes(cache_salt: str | None = None, extra: Sequence[str] = ()) -> bytes:
    """Encode a request's extra keys (cache salt, adapter id, ...) once, unambiguously."""
    parts = [cache_salt or "", *extra]
    return b"\x1f".join(p.encode() for p in parts) if any(parts) else b""


class PrefixHashes:
    """The unit hashes of a growing token sequence, computed incrementally.

    `at(n)` is the key of position n (a positive multiple of the unit): the hash of [0, n), or
    with `lookahead` the hash of [0, n]. `num_hashed_tokens` is the last position with a key.
    Tokens are appended with `extend`; only completed units are hashed.
    """

    __slots__ = ("_extra", "_hashes", "_look", "_next", "_pending", "lookahead", "seed", "unit")

    def __init__(
        self, unit: int, seed: int = 0, extra: bytes = b"", lookahead: bool = False
    ) -> None:
        self.unit = unit
        self.seed = seed
        self.lookahead = lookahead
        self._extra = extra
        self._hashes: list[Hash] = []
        self._next: list[bytes] = []  # token k*u (8 bytes) once known, for unit k
        self._look: list[Hash] = []  # lookahead keys, computed on first use
        self._pending: list[int] = []

    def __len__(self) -> int:
        return len(self._next) if self.lookahead else len(self._hashes)

    @property
    def extra(self) -> bytes:
        """The extra keys every hash covers (`extra_key_bytes`: the cache salt first)."""
        return self._extra

    @property
    def num_hashed_tokens(self) -> int:
        return len(self) * self.unit

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        arr = np.asarray(tokens, dtype=np.int64)
        if self._pending:
            arr = np.concatenate([np.asarray(self._pending, dtype=np.int64), arr])
        u = self.unit
        base = len(self._hashes)  # arr[0] is token base*u
        n_units = len(arr) // u
        self._pending = arr[n_units * u :].tolist()
        # the token after unit k (position k*u) lies at arr[(k - base) * u]
        for k in range(len(self._next) + 1, base + n_units + 1):
            i = (k - base) * u
            if i >= len(arr):
                break
            self._next.append(arr[i : i + 1].tobytes())
        if not n_units:
            return
        data = arr[: n_units * u].tobytes()
        parent = self._hashes[-1] if self._hashes else b""
        width = u * 8
        digest = xxhash.xxh3_128_digest
        seed, extra, out = self.seed, self._extra, self._hashes
        for k in range(n_units):
            parent = digest(parent + data[k * width : (k + 1) * width] + extra, seed)
            out.append(parent)

    def prefix_hash(self, n: int) -> Hash:
        """The hash of the tokens [0, n) alone, whatever the key scheme (with `lookahead`, `at(n)`
        also covers token n): what names the content of a prefix to the outside (KV events).
        n must be a positive multiple of the unit whose unit is complete."""
        return self._hashes[n // self.unit - 1]

    @property
    def num_prefix_hashed_tokens(self) -> int:
        """The last position with a `prefix_hash` (complete units; lookahead keys may lag it)."""
        return len(self._hashes) * self.unit

    def at(self, n: int) -> Hash:
        """The key of position n; n must be a positive multiple of the unit, hashed."""
        k = n // self.unit - 1
        if not self.lookahead:
            return self._hashes[k]
        look = self._look
        while len(look) <= k:
            j = len(look)
            look.append(xxhash.xxh3_128_digest(self._hashes[j] + self._next[j], self.seed))
        return look[k]
