"""Released SSM states of a kind that falls below the demotion bar leave the LRU queue.

Before the pool first evicts, no kind's chance is resolved, so every release refreshes its
states among the cached blocks (`SSMManager.free`). When a kind's chance then falls below
`DEMOTE_RATIO` times the attention blocks', its released states still there are demoted at
once (`SSMManager._demote_newly_rare`): on the bench's trace, tail checkpoints and units
below the tail refreshed at the prior held ~290 of 939 pages for a whole turnover, and LRU
evicted two 30,912-token prefixes before them (docs/admission.md).
"""

from __future__ import annotations

from hycache.cache.block_pool import BlockPool, CacheKey
from hycache.cache.boundaries import ATTENTION_KIND, Boundaries, StateKind
from hycache.cache.ssm import SSMManager
from hycache.hashing import PrefixHashes
from tests.helpers import make_config

UNIT = 4


def _manager(num_blocks: int = 16) -> SSMManager:
    cfg = make_config(block_size=16, unit=UNIT, policy="limit")
    bounds = Boundaries.from_config(cfg.cache, cfg.speculative)
    pool = BlockPool(num_blocks)
    pool.saving = bounds.hit_saving  # as `CacheManager` sets it
    return SSMManager(1, pool, bounds)


def _hashes(seed: int, n: int = 64) -> PrefixHashes:
    h = PrefixHashes(UNIT, seed=seed)
    h.extend(list(range(n)))
    return h


def _keep_state(m: SSMManager, rid: str, hashes: PrefixHashes, pos: int, kind: str) -> int:
    """Request `rid` computes [0, pos + UNIT) in one step that writes a state of `kind` at
    `pos` inside the forward; returns the state's block (cached once the step commits, the
    request still live)."""
    m.adopt(rid, None)
    io = m.plan_step(rid, pos + UNIT, checkpoint=False, internal=(pos,), kinds=(kind,))
    m.commit(rid, hashes, pos + UNIT)
    ((_, block),) = io.writes
    assert m.pool.is_free(block) and m.pool.lookup(CacheKey(1, hashes.at(pos))) == block
    return block


def _attention_entry(pool: BlockPool, position: int) -> int:
    """A free cached attention block keyed at `position` (the LRU queue's newest)."""
    (b,) = pool.allocate(1)
    pool.add_key(b, CacheKey(0, position.to_bytes(16, "little")), position, ATTENTION_KIND)
    pool.free([b])
    return b


def _make_rare(pool: BlockPool, kind: str) -> None:
    """Resolve entries so that `kind` is hit far less often than attention blocks."""
    for _ in range(10):
        pool.reuse.record(kind, hit=False)
        pool.reuse.record(ATTENTION_KIND, hit=True)


def _release(m: SSMManager, rid: str, hashes: PrefixHashes, end: int) -> None:
    m.adopt(rid, None)
    m.plan_step(rid, end, checkpoint=False)
    m.commit(rid, hashes, end)
    m.free(rid, hashes)


def test_a_kind_turned_rare_demotes_its_released_states_refreshed_before() -> None:
    m = _manager()
    pool = m.pool
    older = _attention_entry(pool, 48)
    ha = _hashes(1)
    tail = _keep_state(m, "a", ha, 32, StateKind.TAIL)
    m.free("a", ha)  # nothing resolved yet: refreshed, kept behind `older` in LRU order
    _make_rare(pool, StateKind.TAIL)
    _release(m, "b", _hashes(2), 8)  # the next release sees the tail kind below the bar
    assert pool.peek_victim() == tail
    order = [b for b in pool.allocate(pool.num_free) if b in (older, tail)]
    assert order == [tail, older]
    pool.check_integrity()


def test_without_the_sweep_the_same_state_would_wait_its_turn_in_lru() -> None:
    """The control: the kind stays above the bar, so the refreshed state keeps its LRU place
    (evicted after the older entry, before the younger)."""
    m = _manager()
    pool = m.pool
    older = _attention_entry(pool, 48)
    ha = _hashes(1)
    tail = _keep_state(m, "a", ha, 32, StateKind.TAIL)
    m.free("a", ha)
    younger = _attention_entry(pool, 40)
    _release(m, "b", _hashes(2), 8)
    order = [b for b in pool.allocate(pool.num_free) if b in (older, tail, younger)]
    assert order == [older, tail, younger]


def test_a_live_requests_states_are_left_for_its_release() -> None:
    """A request still running (or preempted and waiting to resume from its own states) keeps
    its states in place; they are aged when it lets go."""
    m = _manager()
    pool = m.pool
    older = _attention_entry(pool, 48)
    ha = _hashes(1)
    tail = _keep_state(m, "a", ha, 32, StateKind.TAIL)  # "a" stays live
    _make_rare(pool, StateKind.TAIL)
    _release(m, "b", _hashes(2), 8)
    assert pool.is_free(tail)
    order = [b for b in pool.allocate(pool.num_free) if b in (older, tail)]
    assert order == [older, tail]


def test_a_state_whose_page_was_reused_is_not_demoted() -> None:
    """A released state evicted since is forgotten: its page, now keyed by a live request's
    state of the same kind, keeps its LRU place until that request lets go."""
    m = _manager(num_blocks=4)
    pool = m.pool
    ha = _hashes(1)
    tail = _keep_state(m, "a", ha, 32, StateKind.TAIL)
    m.free("a", ha)
    taken = pool.allocate(pool.num_free)  # every page, the tail state's too: evicted
    assert tail in taken and pool.lookup(CacheKey(1, ha.at(32))) is None
    pool.add_key(tail, CacheKey(1, _hashes(3).at(16)), 16, StateKind.TAIL)
    pool.free(taken)
    _make_rare(pool, StateKind.TAIL)
    _release(m, "b", _hashes(2), 8)
    assert tail in pool.lru_blocks_of([StateKind.TAIL])
    pool.check_integrity()


def test_a_state_whose_hit_saves_a_unit_is_demoted_at_release() -> None:
    """The drop scheme's junction (a hit saves `u` tokens over the junction a unit below) is
    demoted when its request lets go, though its kind is hit as often as a replay boundary,
    which stays among the cached blocks."""
    m = _manager()
    pool = m.pool
    older = _attention_entry(pool, 48)
    ha, hb = _hashes(1), _hashes(2)
    drop = _keep_state(m, "a", ha, 32, StateKind.DROP_JUNCTION)
    replay = _keep_state(m, "b", hb, 32, StateKind.REPLAY)
    for kind in (StateKind.DROP_JUNCTION, StateKind.REPLAY, ATTENTION_KIND):
        for hit in (True, False):
            pool.reuse.record(kind, hit=hit)
    m.free("a", ha)
    m.free("b", hb)
    order = [b for b in pool.allocate(pool.num_free) if b in (older, drop, replay)]
    assert order == [drop, older, replay]


def test_the_cache_manager_prices_its_pools_hits_with_the_boundaries() -> None:
    from hycache.cache.manager import CacheManager

    cfg = make_config(block_size=16, unit=UNIT, policy="limit")
    cache = CacheManager(cfg.cache, cfg.speculative)
    for pool in cache.pools:
        assert pool.saving(StateKind.DROP_JUNCTION, 64) == UNIT
        assert pool.saving(StateKind.REPLAY, 64) == 64
