from __future__ import annotations

import pytest

from hycache.cache.block_pool import (
    PROTECT_ALL,
    BlockPool,
    CacheKey,
    IntegrityError,
    NoFreeBlocksError,
)


def key(i: int) -> CacheKey:
    return CacheKey(0, i.to_bytes(16, "little"))


def test_null_block_is_never_handed_out() -> None:
    pool = BlockPool(5)
    assert 0 not in pool.allocate(4)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    pool.check_integrity()


def test_keyed_frees_go_to_the_tail_unkeyed_to_the_head() -> None:
    pool = BlockPool(5)
    a, b, _c, _d = pool.allocate(4)
    pool.add_key(a, key(1), 4)
    pool.free([a])  # keyed: tail
    pool.free([b])  # unkeyed: head
    assert pool.allocate(1) == [b]
    assert pool.lookup(key(1)) == a
    assert pool.allocate(1) == [a]  # evicted now
    assert pool.lookup(key(1)) is None
    pool.check_integrity()


def test_request_tail_blocks_are_evicted_first() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    for i, b in enumerate(blocks):
        pool.add_key(b, key(i), i)
    pool.free(reversed(blocks))
    assert pool.allocate(1) == [blocks[-1]]
    assert pool.lookup(key(0)) == blocks[0]


def test_touch_reclaims_a_cached_block_and_events_are_sent() -> None:
    pool = BlockPool(3)
    events = []
    pool.subscribe(events.append)
    (a,) = pool.allocate(1)
    assert pool.add_key(a, key(5), 8)
    assert not pool.add_key(a, key(5), 8)  # first writer wins
    pool.free([a])
    pool.touch([a])
    assert pool.ref_cnt[a] == 1 and not pool.is_free(a)
    pool.free([a])
    pool.allocate(2)
    assert [e.kind for e in events] == ["stored", "removed"]
    pool.check_integrity()


def test_double_free_is_caught() -> None:
    pool = BlockPool(3)
    (a,) = pool.allocate(1)
    pool.free([a])
    with pytest.raises(IntegrityError):
        pool.free([a])


def test_several_keys_per_block() -> None:
    pool = BlockPool(3)
    (a,) = pool.allocate(1)
    pool.add_key(a, key(1), 4)
    pool.add_key(a, key(2), 8)
    assert pool.lookup(key(1)) == pool.lookup(key(2)) == a
    pool.free([a])
    pool.allocate(2)
    assert pool.lookup(key(1)) is None and pool.lookup(key(2)) is None
    pool.check_integrity()


def test_low_priority_pages_are_evicted_after_unkeyed_and_before_other_cached_blocks() -> None:
    """...while they are worth no more than the LRU head (kind chance times position, here
    one kind: the deeper cached block stays; `test_admission` has the other case)."""
    pool = BlockPool(6)
    cached, snap, hit_snap, unkeyed, _ = pool.allocate(5)
    for i, b in enumerate((cached, snap, hit_snap)):
        pool.add_key(b, key(i), 8 - i)
    pool.free([cached])
    pool.free([snap, hit_snap], low_priority=True)
    pool.free([unkeyed])
    pool.check_integrity()
    pool.touch([hit_snap])  # a hit proves the page useful: it rejoins the ordinary LRU queue
    pool.free([hit_snap])
    pool.check_integrity()
    assert pool.allocate(1) == [unkeyed]
    assert pool.allocate(1) == [snap] and pool.lookup(key(1)) is None
    assert pool.allocate(1) == [cached]
    assert pool.allocate(1) == [hit_snap]
    pool.check_integrity()


def test_refresh_requeues_free_cached_blocks_as_if_freed_now() -> None:
    pool = BlockPool(5)
    a, b, c, d = pool.allocate(4)
    for i, x in enumerate((a, b, c)):
        pool.add_key(x, key(i), i)
    pool.free([a, b, c])  # LRU: a, b, c
    pool.refresh([d, a])  # d is referenced: left alone; a moves behind c
    assert pool.hits[a] == 0 and pool.ref_cnt[d] == 1  # not a hit, no reference taken
    assert pool.allocate(3) == [b, c, a]
    pool.check_integrity()


def test_refresh_leaves_unkeyed_and_low_priority_blocks_in_place() -> None:
    pool = BlockPool(5)
    a, b, c, _ = pool.allocate(4)
    pool.add_key(a, key(1), 2)
    pool.add_key(b, key(2), 1)  # worth less than a: the low-priority queue goes first
    pool.free([a])
    pool.free([b], low_priority=True)
    pool.free([c])  # unkeyed: head
    pool.refresh([c, b])
    assert pool.allocate(3) == [c, b, a]
    pool.check_integrity()


def test_refresh_rescores_a_scored_block() -> None:
    pool = BlockPool(5, value=lambda _key, _pos: 0.0)
    a, b, c, _ = pool.allocate(4)
    for i, x in enumerate((a, b, c)):
        pool.add_key(x, key(i), i)
    pool.free([a, b, c])
    pool.refresh([a])
    assert pool.allocate(3) == [b, c, a]
    pool.check_integrity()


def test_demote_sends_free_cached_blocks_to_the_low_priority_queue() -> None:
    pool = BlockPool(6)
    a, b, c, d, e = pool.allocate(5)
    for i, x in enumerate((a, b, c, d)):
        pool.add_key(x, key(i), 4 - i)  # c is worth less than a, the LRU head
    pool.free([a, b, c])
    pool.demote([c, e])  # e is referenced: left alone
    assert pool.ref_cnt[e] == 1
    assert pool.allocate(3) == [c, a, b]  # the demoted block goes first
    pool.check_integrity()


def test_demote_leaves_a_scored_pool_alone() -> None:
    pool = BlockPool(4, value=lambda _key, _pos: 0.0)
    a, b, _ = pool.allocate(3)
    pool.add_key(a, key(1), 1)
    pool.add_key(b, key(2), 2)
    pool.free([a, b])
    pool.demote([b])
    assert pool.allocate(2) == [a, b]
    pool.check_integrity()


def test_the_low_priority_head_is_weighed_by_what_its_hit_saves() -> None:
    """A low-priority entry deeper than the LRU head but whose hit saves only a few tokens
    (`saving`: the drop scheme's junction saves a unit) goes first; weighed by its position
    it would hold the whole low-priority queue behind it."""
    pool = BlockPool(5)
    head, low, _, _ = pool.allocate(4)
    pool.add_key(head, key(1), 8, "a")
    pool.add_key(low, key(2), 64, "drop")
    pool.free([head])
    pool.free([low], low_priority=True)
    assert pool.worth(low) > pool.worth(head)  # by position: the LRU head goes first
    assert pool.peek_victim() == head
    pool.saving = lambda kind, position: 4 if kind == "drop" else position
    assert pool.worth(low) < pool.worth(head)
    assert pool.peek_victim() == low
    assert pool.allocate(1) == [low]
    pool.check_integrity()


def _reused_and_one_off(pool: BlockPool) -> tuple[int, int, list[int]]:
    """Block `hot` keyed and hit once, then `cold` keyed and never hit, both freed (hot last,
    so plain LRU evicts cold first anyway; then hot is freed again before more one-offs)."""
    hot, cold = pool.allocate(2)
    pool.add_key(hot, key(1), 4)
    pool.add_key(cold, key(2), 4)
    pool.free([hot])
    pool.touch([hot])  # a second request reuses it
    pool.free([cold, hot])
    rest = pool.allocate(3)  # one-off prompts, freed after hot
    for i, b in enumerate(rest):
        pool.add_key(b, key(10 + i), 4)
    pool.free(rest)
    return hot, cold, rest


@pytest.mark.parametrize(
    "knobs",
    [{}, {"protect": True}, {"protect_hits": True}],
    ids=["plain", "declared", "reused"],
)
def test_a_reused_block_outlives_one_off_blocks_only_when_protected(
    knobs: dict[str, bool],
) -> None:
    """A hit protects a block by itself only with `protect_hits` (`protect_reused`); with the
    protected queue alone (`protect_declared`) only the owner's `protect` does."""
    pool = BlockPool(8, **knobs)
    hot, cold, rest = _reused_and_one_off(pool)
    pool.check_integrity()
    assert pool.peek_victim() == cold
    order = pool.allocate(pool.num_free)
    evicted = [b for b in order if b in (hot, cold, *rest)]
    if knobs.get("protect_hits"):  # every block never reused goes first
        assert evicted == [cold, *rest, hot]
    else:  # LRU: hot was freed before the one-offs
        assert evicted == [cold, hot, *rest]
    pool.check_integrity()


def test_the_protected_queue_is_bounded_and_hands_back_its_oldest() -> None:
    pool = BlockPool(65, protect_hits=True)  # at most 64 // PROTECTED_FRACTION = 4 protected
    *blocks, one_off = pool.allocate(7)
    for i, b in enumerate([*blocks, one_off]):
        pool.add_key(b, key(i), 4)
    pool.free(blocks)
    pool.touch(blocks)
    pool.free(blocks)  # all hit: the first two go back to the ordinary queue's recent end
    pool.free([one_off])  # freed after them: evicted after them, before the protected four
    pool.check_integrity()
    assert pool.protected_cap == 4
    order = [b for b in pool.allocate(pool.num_free) if b in (*blocks, one_off)]
    assert order == [*blocks[:2], one_off, *blocks[2:]]


def test_a_reused_path_is_protected_whole_its_new_blocks_and_states_too() -> None:
    """`free(..., protect=PROTECT_ALL)` (a request that resumed from a hit, `PROTECT_PATHS`): its
    cached blocks join the protected queue though never hit, a decode snapshot too (not the
    low-priority queue); `refresh(..., protect=PROTECT_ALL)` moves a released state there. Without
    a protected queue (or unkeyed blocks) nothing changes."""
    pool = BlockPool(65, protect=True)
    new, snap, state, one_off = pool.allocate(4)
    for i, b in enumerate((new, snap, state, one_off)):
        pool.add_key(b, key(i), 4)
    pool.free([state, one_off])  # a checkpoint freed the step it is written; a one-off
    pool.free([new], protect=PROTECT_ALL)
    pool.free([snap], low_priority=True, protect=PROTECT_ALL)
    pool.refresh([state], protect=PROTECT_ALL)
    pool.check_integrity()
    assert pool.peek_victim() == one_off
    order = [b for b in pool.allocate(pool.num_free) if b in (new, snap, state, one_off)]
    assert order == [one_off, new, snap, state]
    plain = BlockPool(65)
    (b,) = plain.allocate(1)
    plain.add_key(b, key(9), 4)
    plain.free([b], protect=PROTECT_ALL)  # no protected queue: the ordinary LRU
    plain.check_integrity()
    assert plain.peek_victim() == b


def test_a_declared_prefix_is_protected_up_to_its_end_only() -> None:
    """`protect` as a position (a hit on a prefix the request declared, `protect_declared`):
    a block with a key at or below it joins the protected queue (a block the prefix ends in,
    keyed mid-block there, too); the request's own suffix, keyed past it, and its decode
    snapshot stay in their ordinary queues. Refresh alike."""
    pool = BlockPool(65, protect=True)
    head, end_block, suffix, snap, state, deep_state = pool.allocate(6)
    pool.add_key(head, key(0), 8)
    pool.add_key(end_block, key(1), 12)  # the declared prefix ends mid-block, at 12
    pool.add_key(end_block, key(2), 16)
    pool.add_key(suffix, key(3), 24)
    pool.add_key(snap, key(4), 26)
    pool.add_key(state, key(5), 12)
    pool.add_key(deep_state, key(6), 20)
    pool.free([state, deep_state])  # checkpoints freed the step they are written
    pool.free([suffix, end_block, head], protect=12)
    pool.free([snap], low_priority=True, protect=12)
    pool.refresh([deep_state, state], protect=12)
    pool.check_integrity()
    assert pool.num_protected == 3
    mine = (head, end_block, suffix, snap, state, deep_state)
    order = [b for b in pool.allocate(pool.num_free) if b in mine]
    # the protected three go after every ordinary cached block, least recently freed first
    assert [b for b in order if b in (head, end_block, state)] == [end_block, head, state]
    assert order.index(end_block) > max(order.index(suffix), order.index(deep_state))

