"""Ghosts: the keys of the blocks a pool evicted last, and what they would have given.

A `Ghosts` list follows one pool's key events (`BlockPool.subscribe`): the keys of the last
`depth` keyed blocks evicted (1/`GHOST_FRACTION` of the pool) stay listed, each with its
eviction's serial number (`BlockPool.num_evicted` then): what a slightly larger pool would
still hold. `ghost_gain` looks an admission up again as if they were still cached; the extra
tokens price a page (`Admission.record_ghost_hit`, `Admission.page_value`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from hycache.cache.attention import AttentionManager
from hycache.cache.block_pool import NULL_BLOCK, BlockEvent, BlockPool, CacheKey
from hycache.cache.boundaries import Boundaries
from hycache.cache.coordinator import CacheHit, find_joint_hit
from hycache.cache.retention.rule import GHOST_FRACTION
from hycache.cache.ssm import SSMManager
from hycache.request import Request


class Ghosts:
    """The keys `pool` evicted last (see the module docstring). Subscribes to the pool's key
    events at construction; a "removed" event (an eviction) lists its key, and drops the keys
    of evictions older than `depth`."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.depth = max(1, (pool.num_blocks - 1) // GHOST_FRACTION)
        self.keys: OrderedDict[CacheKey, int] = OrderedDict()  # key -> its eviction's serial
        pool.subscribe(self._on_event, weak=True)  # the pool does not keep us alive

    def _on_event(self, event: BlockEvent) -> None:
        if event.kind != "removed":  # keys are removed only when their block is evicted
            return
        serial = self.pool.num_evicted
        self.keys[event.key] = serial
        self.keys.move_to_end(event.key)
        oldest = serial - self.depth
        while self.keys and next(iter(self.keys.values())) <= oldest:
            self.keys.popitem(last=False)

    def __contains__(self, key: CacheKey) -> bool:
        """`key` was on a block evicted among the last `depth` and is not cached now. Pure."""
        return key in self.keys and self.pool.lookup(key) is None


def ghost_gain(
    req: Request,
    hit: CacheHit,
    ghosts: Ghosts,
    attention: Sequence[AttentionManager],
    ssm: Sequence[SSMManager],
    bounds: Boundaries,
    pool_for: Callable[[int], BlockPool],
) -> int:
    """How many tokens deeper `req`'s hit would have been had the ghosts' pool still held
    them (0: no deeper). Pure: the pools are only read."""

    def lookup(key: CacheKey) -> int | None:
        pool = pool_for(key.group)
        found = pool.lookup(key)
        if found is None and pool is ghosts.pool and key in ghosts:
            return NULL_BLOCK  # a stand-in: the joint hit only reads its position
        return found

    ghost = find_joint_hit(attention, ssm, req.hashes, req.num_tokens, bounds, lookup)
    return max(ghost.resume_point - hit.resume_point, 0)
