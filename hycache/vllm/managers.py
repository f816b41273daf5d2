"""`limit`'s cache-side mechanisms inside vLLM's `KVCacheManager` (`hycache.vllm.Scheduler`).

vLLM's scheduler builds its `KVCacheManager` inline, and its coordinator builds one manager per
KV cache group. `install` re-classes the two managers of a hybrid model in place (their state is
kept) as the subclasses `manager_classes` builds over vLLM's own (taken from
`hycache.vllm.compat` on first use, so this module imports without vLLM); the coordinator,
block pool and lookup stay vLLM's own:

    FullAttentionManager ──▶ UnitKeyedAttention   keys on every prompt unit of every block it
                                                  caches (the lookahead keys vLLM computes),
                                                  so a sibling's lookup observes its junction
                                                  to the unit: `floor((P-1)/u)*u`
    MambaManager         ──▶ StopKeepingMamba     keeps (and keys) the state at each stop the
                                                  scheduler made for the request, on the unit
                                                  grid or the block grid, beside vLLM's own

Where the stops lie is the scheduler's business (`hycache.vllm.scheduler`), which takes them
from `hycache.cache.boundaries` and records them on the request (`stops_of`); nothing here
derives a position.

vLLM's block pool keeps one "primary" key per block plus secondary ones, and drops a block's
keys when a longer partial key arrives (`BlockPool.cache_partial_block`). A block being filled
gets a longer unit key every unit, so `_key_unit` keeps the longest key primary and re-inserts
the shorter ones as secondary keys: attention KV is append-only, so each still holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from hycache.vllm import compat

if TYPE_CHECKING:
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.request import Request

STOPS_ATTR = "hycache_stops"  # set on each vLLM request by the scheduler


def stops_of(request: Request) -> tuple[int, ...]:
    """The stops the scheduler made (and the Mamba group keeps) for this request's prompt."""
    return getattr(request, STOPS_ATTR, ())


def _key_unit(pool: BlockPool, request: Request, block: Any, pos: int, group: int) -> None:
    """Make `block` reachable from the unit key at `pos` without dropping its other keys."""
    unit_hash = request.block_hashes[pos // pool.hash_block_size - 1]
    key = compat.make_block_hash_with_group_id(unit_hash, group)
    if block.block_hash == key or pool.cached_block_hash_to_block.contain(key, block.block_id):
        return
    if block.block_hash is None or (block.block_hash_num_tokens or 0) > pos:
        pool._insert_block_hash(key, block, num_tokens=pos)
        return
    # a longer key than the primary: it becomes the primary, the others stay as secondaries
    older = pool._remove_cached_block_hashes(block)
    pool._insert_block_hash(key, block, num_tokens=pos)
    for old in older:
        pool._insert_block_hash(old, block, num_tokens=None)


def key_units(manager: Any, request: Request, num_tokens: int, blocks_before: int) -> None:
    """After vLLM's attention manager cached `request`'s blocks up to `num_tokens` (it had
    `blocks_before` cached): key every unit boundary not yet keyed that is not a block end."""
    rid = request.request_id
    if not manager.kv_cache_spec.prefix_cacheable or rid not in manager.req_to_blocks:
        return
    u, b = manager.block_pool.hash_block_size, manager.block_size
    # prompt units only: a unit inside an answer is where a chat's next turn meets it, and a
    # junction stop there would serve nobody (the next turn resumes at this prompt's tail, and
    # no decode-side state is kept); vLLM's full-block keys still cover answers
    hashed = min(num_tokens, request.num_prompt_tokens, len(request.block_hashes) * u) // u * u
    blocks = manager.req_to_blocks[rid]
    keyed = manager._num_keyed_units.get(rid)
    if keyed is None:
        # first call: units below the hit are keyed on the blocks the request hit
        keyed = blocks_before * b // u
    # a block promoted to full this call lost its unit keys (`cache_full_blocks`)
    first = min(keyed * u, blocks_before * b)
    for pos in range(first // u * u + u, hashed + 1, u):
        if pos % b == 0:
            continue
        block = blocks[pos // b] if pos // b < len(blocks) else None
        if block is not None and not block.is_null:
            _key_unit(manager.block_pool, request, block, pos, manager.kv_cache_group_id)
    manager._num_keyed_units[rid] = max(keyed, hashed // u)


def block_grid_stops(request: Request, block_size: int) -> tuple[int, ...]:
    """The request's stops on the block grid: more reachable boundaries for vLLM's sparse
    retention mask."""
    return tuple(s for s in stops_of(request) if s % block_size == 0)


def keys_a_sub_block_stop(manager: Any, request: Request, num_tokens: int) -> bool:
    """Whether a chunk ending at `num_tokens` ended at one of the request's sub-block stops
    (and vLLM exports no checkpoint of its own for the request this step)."""
    return (
        num_tokens % manager.block_size != 0
        and num_tokens in stops_of(request)
        and request.request_id not in manager._checkpoints
    )


# how many sub-block stop states a Mamba manager remembers (the newest; a forgotten one only
# makes a later hit on it count as stock's, keeping vLLM's tail stop)
STOP_STATES_REMEMBERED = 1 << 16


def remember_stop_state(manager: Any, request: Request, num_tokens: int) -> None:
    """Record that the state keyed at `num_tokens` of `request`'s prefix is one of the
    plugin's sub-block stops (`resumes_at_a_stop_state`)."""
    known: dict[Any, None] = manager.__dict__.setdefault("_hycache_stop_states", {})
    known[request.block_hashes[num_tokens // manager.block_pool.hash_block_size - 1]] = None
    if len(known) > STOP_STATES_REMEMBERED:
        del known[next(iter(known))]


def forget_stop_states(kv_cache_manager: Any) -> None:
    """Forget every recorded stop state (`remember_stop_state`): the prefix cache was reset,
    and a state keyed the same way later is not one of ours unless a stop makes it again."""
    for m in kv_cache_manager.coordinator.single_type_managers:
        m.__dict__.pop("_hycache_stop_states", None)


def resumes_at_a_stop_state(kv_cache_manager: Any, request: Request, hit: int) -> bool:
    """Whether `request`'s hit `hit` (mid-block) is a state one of the plugin's sub-block
    stops kept, not one stock vLLM keeps (a prompt's tail checkpoint)."""
    u = kv_cache_manager.coordinator.single_type_managers[0].block_pool.hash_block_size
    if hit <= 0 or hit % u or hit // u > len(request.block_hashes):
        return False
    key = request.block_hashes[hit // u - 1]
    return any(
        key in m.__dict__.get("_hycache_stop_states", {})
        for m in kv_cache_manager.coordinator.single_type_managers
    )


@cache
def manager_classes() -> tuple[type, type]:
    """(UnitKeyedAttention, StopKeepingMamba): subclasses of the installed vLLM's
    `FullAttentionManager` and `MambaManager`."""
    attention, mamba = compat.manager_bases()

    class UnitKeyedAttention(attention):  # type: ignore[misc,valid-type]
        """vLLM's full-attention manager, plus a key on every unit of the tokens it caches."""

        _num_keyed_units: dict[str, int]

        def cache_blocks(
            self,
            request: Request,
            num_tokens: int,
            retention_interval: int | None = None,
            *,
            replay_boundaries: Sequence[int],
        ) -> None:
            blocks_before = self.num_cached_block.get(request.request_id, 0)
            super().cache_blocks(
                request,
                num_tokens,
                retention_interval=retention_interval,
                replay_boundaries=replay_boundaries,
            )
            key_units(self, request, num_tokens, blocks_before)

        def pop_blocks_for_free(self, request_id: str) -> list[Any]:
            self._num_keyed_units.pop(request_id, None)
            return super().pop_blocks_for_free(request_id)  # type: ignore[no-any-return]

    class StopKeepingMamba(mamba):  # type: ignore[misc,valid-type]
        """vLLM's Mamba manager (align mode), also keeping the states at the request's
        stops."""

        def cache_blocks(
            self,
            request: Request,
            num_tokens: int,
            retention_interval: int | None = None,
            *,
            replay_boundaries: Sequence[int],
        ) -> None:
            super().cache_blocks(
                request,
                num_tokens,
                retention_interval=retention_interval,
                replay_boundaries=(
                    *replay_boundaries,
                    *block_grid_stops(request, self.block_size),
                ),
            )

        def _cache_partial_tail_block(
            self, request: Request, num_tokens: int, retention_interval: int | None
        ) -> Any:
            """A chunk that ended at a sub-block stop: key its state as vLLM keys a junction
            it observed itself (`shared_prefix_checkpoint`), at that stop."""
            if not keys_a_sub_block_stop(self, request, num_tokens):
                return super()._cache_partial_tail_block(request, num_tokens, retention_interval)
            remember_stop_state(self, request, num_tokens)
            saved = self.shared_prefix_checkpoint, request.shared_prefix_boundary
            self.shared_prefix_checkpoint, request.shared_prefix_boundary = True, num_tokens
            try:
                return super()._cache_partial_tail_block(request, num_tokens, retention_interval)
            finally:
                self.shared_prefix_checkpoint, request.shared_prefix_boundary = saved

    for cls in (UnitKeyedAttention, StopKeepingMamba):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return UnitKeyedAttention, StopKeepingMamba


def hybrid_managers(kv_cache_manager: Any) -> tuple[Any, Any] | None:
    """The (attention, Mamba) managers of a hybrid model's `KVCacheManager`, exactly vLLM's
    classes; None for any other model."""
    attention_cls, mamba_cls = compat.manager_bases()
    found = {type(m): m for m in kv_cache_manager.coordinator.single_type_managers}
    if attention_cls in found and mamba_cls in found:
        return found[attention_cls], found[mamba_cls]
    return None


def install(kv_cache_manager: Any) -> None:
    """Re-class the attention and Mamba managers of a hybrid `KVCacheManager` in place."""
    attention_cls, mamba_cls = compat.manager_bases()
    unit_keyed, stop_keeping = manager_classes()
    for manager in kv_cache_manager.coordinator.single_type_managers:
        if type(manager) is attention_cls:
            manager.__class__ = unit_keyed
            manager._num_keyed_units = {}
        elif type(manager) is mamba_cls:
            manager.__class__ = stop_keeping
