"""Release aging: where a request's cached SSM states go in the eviction order when it lets go.

A checkpoint goes to the cache the step it is written; the attention blocks of its prefix only
when the request lets go. Aged from its write, LRU evicted the state first and left the
prefix's attention blocks cached but unusable (a hybrid hit needs both: docs/admission.md,
"The default against the split arms"). So at release the states the request keyed that are
still cached are refreshed (`BlockPool.refresh`): they age with those blocks. Those of a kind
rarely hit (`rule.rare_kind`, weighed by what a hit saves: the drop scheme's junction saves a
unit) go to the low-priority queue instead (`BlockPool.demote`); and when a kind falls below
that bar, the states of it that released requests left among the cached blocks are demoted
then.
"""

from __future__ import annotations

from hycache.cache.block_pool import BlockPool, CacheKey
from hycache.cache.retention.rule import demote_bar, rare_kind


class ReleaseAging:
    """Release aging for one SSM group's states in `pool` (see the module docstring)."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self._rare: frozenset[str] = frozenset()  # the kinds below the demotion bar, last seen
        self._refreshed: dict[int, CacheKey] = {}  # released states left among the cached

    def release(self, kept: list[tuple[int, CacheKey]], protect: int = 0) -> None:
        """A request let go of the states it keyed (`kept`: (block, key) pairs, its blocks
        already freed): re-queues those still cached under that key in the pool (demoted or
        refreshed, in eviction order; `protect`: those it reaches refreshed into the protected
        queue, a protected path's, `BlockPool.refresh`), and demotes the released states of a
        kind newly rare."""
        low, rest = self._age(kept)
        self.pool.demote(low)
        self.pool.refresh(rest, protect)
        self._refreshed.update((b, self.pool.keys[b][0][0]) for b in rest)
        self._demote_newly_rare()

    def _rare_kinds(self) -> frozenset[str]:
        """The state kinds whose chance is below the demotion bar. Pure."""
        reuse = self.pool.reuse
        return frozenset(k for k in reuse.resolved if rare_kind(reuse, k))

    def _demote_newly_rare(self) -> None:
        """A kind that has just fallen below the demotion bar: demote the states of it that
        released requests left among the cached blocks. Before the pool first evicts no kind
        is resolved, every kind sits at the prior and every release refreshes its states;
        demoted only at their next release, they held a quarter of the pool for a whole
        turnover on the bench's trace (docs/admission.md). A live request's states are left
        for its release (a preempted request resumes from them)."""
        rare = self._rare_kinds()
        new = rare - self._rare
        self._rare = rare
        pool = self.pool
        # pruned only when used, or when it outgrows the pool (not at every release)
        if not new and len(self._refreshed) <= pool.num_blocks:
            return
        live = {b: k for b, k in self._refreshed.items() if pool.lookup(k) == b}
        self._refreshed = live
        if new:
            pool.demote(b for b in pool.lru_blocks_of(new) if b in live)

    def _age(self, kept: list[tuple[int, CacheKey]]) -> tuple[list[int], list[int]]:
        """The request's states still cached under the key it keyed (a block evicted and
        reused since carries another), in eviction order (the kinds least likely to be hit
        first, then the highest position first, as a request's attention blocks are freed):
        those whose kind's chance times the share of its prefix a hit saves
        (`BlockPool.saving`: a unit of the drop scheme's junction) is below the demotion bar
        (for `BlockPool.demote`), and the others (for `BlockPool.refresh`). Pure."""
        pool = self.pool
        live = {b: key for b, key in kept if pool.lookup(key) == b}
        pos = {b: p for b in live for k, p in pool.keys[b] if k == live[b]}
        # the chance of a hit weighed by what it saves per token of the prefix it covers
        chance = {
            b: pool.reuse.chance(pool.kind[b]) * pool.saving(pool.kind[b], pos[b]) / pos[b]
            for b in live
        }
        order = sorted(live, key=lambda b: (chance[b], -pos[b], b))
        bar = demote_bar(pool.reuse)
        return [b for b in order if chance[b] < bar], [b for b in order if chance[b] >= bar]
