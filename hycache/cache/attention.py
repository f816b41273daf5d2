"""Full-attention group manager: block tables, full-block and mid-block keys, copy-on-write.

KV is append-only, so a block keyed at position n (the hash of [0, n)) serves any hit at or
below n: attention hits are downward-closed, which lets the coordinator ask attention first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hycache.cache.block_pool import NULL_BLOCK, BlockPool, CacheKey, KeyLookup
from hycache.cache.boundaries import ATTENTION_KIND, Boundaries
from hycache.hashing import PrefixHashes


def find_attention_hit(
    hashes: PrefixHashes, lookup: KeyLookup, group: int, block_size: int, unit: int, limit: int
) -> tuple[int, list[int]]:
    """Longest n <= limit (a multiple of the unit) whose KV is cached, and the blocks holding
    [0, n). Full blocks are scanned left to right; then the first unmatched block is searched
    for a mid-block key, highest position first. Pure: `lookup` (the pool's, or one that also
    sees the store) is only read."""
    blocks: list[int] = []
    n = 0
    while n + block_size <= limit:
        b = lookup(CacheKey(group, hashes.at(n + block_size)))
        if b is None:
            break
        blocks.append(b)
        n += block_size
    top = min(limit, n + block_size - unit) // unit * unit
    if top > n and n + block_size <= hashes.num_hashed_tokens:
        # the limit cuts through the next block: its full key vouches for every row of it
        b = lookup(CacheKey(group, hashes.at(n + block_size)))
        if b is not None:
            blocks.append(b)
            return top, blocks
    for m in range(top, n, -unit):
        b = lookup(CacheKey(group, hashes.at(m)))
        if b is not None:
            blocks.append(b)
            return m, blocks
    return n, blocks


@dataclass
class _Table:
    blocks: list[int] = field(default_factory=list)
    num_published_blocks: int = 0
    num_published_units: int = 0  # `limit`: units keyed so far (every unit gets a key)
    mid_keys: list[int] = field(default_factory=list)  # mid-block keys still to publish
    cow_pending: bool = False


class AttentionManager:
    kind = "attention"

    def __init__(self, group: int, pool: BlockPool, bounds: Boundaries) -> None:
        self.group = group
        self.pool = pool
        self.bounds = bounds
        self.block_size = bounds.block_size
        self._tables: dict[str, _Table] = {}

    def find_hit(
        self, hashes: PrefixHashes, limit: int, lookup: KeyLookup | None = None
    ) -> tuple[int, list[int]]:
        return find_attention_hit(
            hashes, lookup or self.pool.lookup, self.group, self.block_size, self.bounds.unit, limit
        )

    def block_table(self, request_id: str) -> list[int]:
        return self._tables[request_id].blocks

    def blocks_needed(self, request_id: str, hit_blocks: list[int], resume: int, total: int) -> int:
        """Blocks an allocation up to `total` tokens takes out of the free queue: fresh blocks,
        the copy-on-write target, and cached hit blocks that leave the queue when adopted."""
        table = self._tables.get(request_id)
        if table is not None:
            return max(math.ceil(total / self.block_size) - len(table.blocks), 0) + (
                1 if table.cow_pending else 0
            )
        used = hit_blocks[: math.ceil(resume / self.block_size)] if resume else []
        need = sum(1 for b in used if self.pool.ref_cnt[b] == 0)
        need += 1 if resume % self.block_size else 0
        return need + max(math.ceil(total / self.block_size) - len(used), 0)

    def adopt(self, request_id: str, hit_blocks: list[int], resume: int, num_prompt: int) -> None:
        """Start the request's table from the hit blocks covering [0, resume), referenced now so
        that no allocation in this step can evict them, and plan its prompt's mid-block keys."""
        table = self._tables[request_id] = _Table()
        if not self.bounds.keys_every_unit:
            table.mid_keys = [p for p in self.bounds.attention_keys(num_prompt) if p > resume]
        if resume:
            table.num_published_units = resume // self.bounds.unit
            table.blocks = list(hit_blocks[: math.ceil(resume / self.block_size)])
            self.pool.touch(table.blocks)
            table.num_published_blocks = resume // self.block_size
            table.cow_pending = resume % self.block_size != 0

    def grow(self, request_id: str, total: int, copies: list[tuple[int, int]]) -> None:
        """Cover `total` tokens. A mid-block resume first gets a private copy of its last block:
        (src, dst) is appended to `copies`, and `src` stays referenced until the caller has
        handed the copy to the runner."""
        table = self._tables[request_id]
        if table.cow_pending:
            table.cow_pending = False
            src = table.blocks[-1]
            (dst,) = self.pool.allocate(1)
            copies.append((src, dst))
            table.blocks[-1] = dst
        missing = math.ceil(total / self.block_size) - len(table.blocks)
        if missing > 0:
            table.blocks.extend(self.pool.allocate(missing))

    def publish(self, request_id: str, hashes: PrefixHashes, num_verified: int) -> None:
        """Key every full block of verified (and hashed) tokens, and the mid-block positions:
        every unit under `limit`, else the prompt's planned mid-block keys."""
        table = self._tables[request_id]
        b, u = self.block_size, self.bounds.unit
        hashed = min(num_verified, hashes.num_hashed_tokens)
        while (table.num_published_blocks + 1) * b <= hashed:
            j = table.num_published_blocks
            pos = (j + 1) * b
            key = CacheKey(self.group, hashes.at(pos))
            self.pool.add_key(table.blocks[j], key, pos, ATTENTION_KIND)
            table.num_published_blocks += 1
        if self.bounds.keys_every_unit:
            while (table.num_published_units + 1) * u <= hashed:
                table.num_published_units += 1
                pos = table.num_published_units * u
                if pos % b:
                    self._add_mid_key(table, hashes, pos)
            return
        while table.mid_keys and table.mid_keys[0] <= hashed:
            self._add_mid_key(table, hashes, table.mid_keys.pop(0))

    def _add_mid_key(self, table: _Table, hashes: PrefixHashes, pos: int) -> None:
        block = table.blocks[pos // self.block_size]
        self.pool.add_key(block, CacheKey(self.group, hashes.at(pos)), pos, ATTENTION_KIND)

    def free(self, request_id: str, protect: int = 0) -> None:
        """Release the request's blocks, tail first; `protect`: those keyed at or below it
        into the protected queue (a protected path, `BlockPool.free`)."""
        table = self._tables.pop(request_id, None)
        if table is not None:
            self.pool.free((b for b in reversed(table.blocks) if b != NULL_BLOCK), False, protect)

    def num_requests(self) -> int:
        return len(self._tables)
