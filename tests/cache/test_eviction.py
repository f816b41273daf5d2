"""`flop-aware` eviction: the scored free queue of the block pool, the value of an entry, and
the config and cost model that feed it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.cache.block_pool import BlockPool, CacheKey
from hycache.cache.eviction import FlopValue, prefill_flops
from hycache.cache.manager import CacheManager
from hycache.config import (
    CacheConfig,
    CacheKnobs,
    Eviction,
    GroupKind,
    RecomputeCost,
    SpeculativeConfig,
)


def key(i: int, group: int = 0) -> CacheKey:
    return CacheKey(group, i.to_bytes(16, "little"))


def by_position(values: dict[int, float]):
    """A value function reading the entry's value off its position."""
    return lambda _key, position: values[position]


def test_eviction_follows_the_score_and_ties_fall_back_to_lru() -> None:
    n = 9
    # position -> value, in pool turnovers; blocks are freed in order 1..8
    values = {1: 0.0, 2: 5.0, 3: 0.0, 4: 2.0, 5: 2.0, 6: 0.5, 7: 0.0, 8: 10.0}
    pool = BlockPool(n, by_position(values))
    blocks = pool.allocate(n - 1)
    for pos, b in enumerate(blocks, start=1):
        pool.add_key(b, key(pos), pos)
    for b in blocks:
        pool.free([b])
    pool.check_integrity()
    order = [pool.allocate(1)[0] for _ in range(n - 1)]
    freed_at = {b: i for i, b in enumerate(blocks, start=1)}
    scores = {b: freed_at[b] / (n - 1) + values[freed_at[b]] for b in blocks}
    assert order == sorted(blocks, key=lambda b: (scores[b], freed_at[b]))
    # equal values: least recently freed first (1, 3, 7 are worth 0; 4 and 5 are worth 2)
    assert order.index(blocks[0]) < order.index(blocks[2]) < order.index(blocks[6])
    assert order.index(blocks[3]) < order.index(blocks[4])
    pool.check_integrity()


def test_a_more_valuable_free_block_outlives_a_less_valuable_one_under_pressure() -> None:
    pool = BlockPool(4, by_position({1: 0.0, 2: 3.0}))
    cheap, dear, _ = pool.allocate(3)
    pool.add_key(dear, key(2), 2)
    pool.add_key(cheap, key(1), 1)
    pool.free([dear])  # freed first: LRU would evict it first
    pool.free([cheap])
    (b,) = pool.allocate(1)
    assert b == cheap and pool.lookup(key(1)) is None
    assert pool.lookup(key(2)) == dear
    lru = BlockPool(4)
    cheap, dear, _ = lru.allocate(3)
    lru.add_key(dear, key(2), 2)
    lru.add_key(cheap, key(1), 1)
    lru.free([dear])
    lru.free([cheap])
    assert lru.allocate(1) == [dear]  # the baseline does the opposite


def test_unkeyed_then_snapshots_then_scored() -> None:
    pool = BlockPool(6, lambda _k, _p: 0.0)
    cached, snap, unkeyed, _, _ = pool.allocate(5)
    pool.add_key(cached, key(1), 2)
    pool.add_key(snap, key(2), 1)  # worth no more than the scored head: it goes first
    pool.free([cached])
    pool.free([snap], low_priority=True)
    pool.free([unkeyed])
    pool.check_integrity()
    assert pool.allocate(3) == [unkeyed, snap, cached]
    pool.check_integrity()


def test_snapshots_can_be_scored_like_the_rest() -> None:
    pool = BlockPool(4, by_position({1: 0.0, 2: 4.0}), snapshots_first=False)
    cached, snap, _ = pool.allocate(3)
    pool.add_key(cached, key(1), 1)
    pool.add_key(snap, key(2), 2)
    pool.free([snap], low_priority=True)
    pool.free([cached])
    pool.check_integrity()
    assert pool.allocate(1) == [cached]  # the snapshot is worth more
    assert pool.lookup(key(2)) == snap


def test_a_hit_takes_a_block_out_of_the_heap_and_a_new_free_rescores_it() -> None:
    pool = BlockPool(4, lambda _k, _p: 0.0)
    a, b, _ = pool.allocate(3)
    pool.add_key(a, key(1), 1)
    pool.add_key(b, key(2), 2)
    pool.free([a])
    pool.free([b])
    pool.touch([a])  # a hit: `a` leaves the free queue, its heap entry goes stale
    assert pool.hits[a] == 1 and not pool.is_free(a)
    pool.check_integrity()
    pool.free([a])  # freed again: now the most recent
    pool.check_integrity()
    assert pool.allocate(1) == [b]
    assert pool.allocate(1) == [a]
    assert pool.evicted[(0, False, True)] == 1 and pool.evicted[(0, False, False)] == 1


def test_the_heap_sheds_stale_entries() -> None:
    pool = BlockPool(3, lambda _k, _p: 0.0)
    a, _ = pool.allocate(2)
    pool.add_key(a, key(1), 1)
    for _ in range(500):
        pool.free([a])
        pool.touch([a])
    assert len(pool._heap) <= 2 * len(pool._scored) + 65
    pool.free([a])
    pool.check_integrity()


# -- properties: random operation sequences --------------------------------------------------

OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "key", "free", "free_low", "touch"]), st.integers(0, 99)),
    max_size=80,
)


def _replay(pool: BlockPool, ops: list[tuple[str, int]]) -> list[object]:
    """Apply `ops` (each with a number choosing its target), checking integrity after each;
    returns what every operation observed, for comparing two pools."""
    held: list[int] = []  # one entry per reference we hold
    seen: list[object] = []
    next_key = 0
    for op, x in ops:
        if op == "alloc":
            n = 1 + x % 3
            if n <= pool.num_free:
                got = pool.allocate(n)
                held.extend(got)
                seen.append(tuple(got))
        elif op == "key" and held:
            b = held[x % len(held)]
            next_key += 1
            pool.add_key(b, key(next_key), 1 + x)
        elif op in ("free", "free_low") and held:
            b = held.pop(x % len(held))
            pool.free([b], low_priority=op == "free_low")
        elif op == "touch":
            cached = sorted({b for k, b in pool._key_to_block.items()})
            if cached:
                b = cached[x % len(cached)]
                pool.touch([b])
                held.append(b)
        pool.check_integrity()
        seen.append((pool.num_free, tuple(sorted(pool._key_to_block.values()))))
    pool.free(held)
    pool.check_integrity()
    assert pool.num_free == pool.num_blocks - 1  # nothing leaked
    assert all(r == 0 for r in pool.ref_cnt)
    return seen


@settings(max_examples=200, deadline=None)
@given(ops=OPS)
def test_a_zero_value_is_exactly_lru(ops: list[tuple[str, int]]) -> None:
    assert _replay(BlockPool(8, lambda _k, _p: 0.0), ops) == _replay(BlockPool(8), ops)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, snapshots_first=st.booleans())
def test_scored_pools_are_deterministic_and_leak_nothing(
    ops: list[tuple[str, int]], snapshots_first: bool
) -> None:
    def value(_k: CacheKey, p: int) -> float:
        return (p % 7) / 3  # many ties

    a = _replay(BlockPool(8, value, snapshots_first=snapshots_first), ops)
    b = _replay(BlockPool(8, value, snapshots_first=snapshots_first), ops)
    assert a == b


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.floats(0, 5), min_size=2, max_size=7))
def test_every_eviction_takes_the_lowest_score(values: list[float]) -> None:
    n = len(values) + 1
    pool = BlockPool(n, by_position(dict(enumerate(values, start=1))))
    blocks = pool.allocate(n - 1)
    for pos, b in enumerate(blocks, start=1):
        pool.add_key(b, key(pos), pos)
        pool.free([b])
    chance = pool.reuse.chance("")  # every entry is of one kind: the value's weight
    scores = [(i / (n - 1) + chance * v, i) for i, v in enumerate(values, start=1)]
    order = [pool.allocate(1)[0] for _ in blocks]
    assert order == [blocks[i - 1] for _, i in sorted(scores)]


# -- the value of an entry ---------------------------------------------------------------------

COST = RecomputeCost(token_flops=100.0, pair_flops=2.0, ssm_fraction=0.75)
GROUPS = (GroupKind.ATTENTION, GroupKind.SSM)


def test_prefill_flops_adds_the_attention_pairs() -> None:
    # tokens 2, 3 at contexts 2, 3: 2 * 100 + 2 * (3 + 4)
    assert prefill_flops(COST, 2, 4) == 2 * 100 + 2 * 7
    assert prefill_flops(COST, 0, 4) == prefill_flops(COST, 0, 2) + prefill_flops(COST, 2, 4)


def test_a_state_saves_the_ssm_share_of_its_whole_prefix_a_block_its_own_rows() -> None:
    v = FlopValue(COST, GROUPS, block_size=4, alpha=2.0)
    assert v.saved_flops(1, 12) == 0.75 * 100 * 12
    # the block [8, 12) keyed at 12: its 4 rows, attention over contexts 8..11
    assert v.saved_flops(0, 12) == 0.25 * 100 * 4 + 2 * (9 + 10 + 11 + 12)
    # a mid-block key at 10 holds rows [8, 10)
    assert v.saved_flops(0, 10) == 0.25 * 100 * 2 + 2 * (9 + 10)
    ref = prefill_flops(COST, 0, 4)
    assert v(CacheKey(1, b""), 12) == pytest.approx(2.0 * 0.75 * 100 * 12 / ref)
    # every entry of one hit at 12 (three blocks and the state) adds up to its whole prefill
    total = sum(v.saved_flops(0, p) for p in (4, 8, 12)) + v.saved_flops(1, 12)
    assert total == pytest.approx(prefill_flops(COST, 0, 12))


def test_the_cost_model_prices_bamba_mostly_in_its_ssm_layers() -> None:
    from hycache.sim.costmodel import CostModel
    from hycache.sim.presets import load_gpu, load_model_spec

    cm = CostModel(
        load_model_spec("bamba-9b"), load_gpu("h200"), speculative=True, num_speculative_tokens=3
    )
    c = cm.recompute_cost()
    assert 0.85 < c.ssm_fraction < 0.95  # 29 of 32 mixers, and the bigger ones
    # 2 FLOPs per active body weight, plus the SSM terms and the drafter's layers
    assert c.token_flops > 2 * cm.model.body_active_params
    assert c.pair_flops == 4 * 32 * 128 * (3 + 1)
    assert cm.without_drafter().recompute_cost().pair_flops == 4 * 32 * 128 * 3


# -- config and cache manager ----------------------------------------------------------------


def test_config_parses_and_checks_the_eviction_fields() -> None:
    c = CacheConfig(
        CacheKnobs(block_size=16, prefix_match_unit=None, eviction="flop-aware", eviction_alpha=0.5)
    )
    assert c.eviction is Eviction.FLOP_AWARE
    assert CacheConfig(CacheKnobs(block_size=16, prefix_match_unit=None)).eviction is Eviction.LRU
    with pytest.raises(ValueError, match="eviction: unknown"):
        CacheConfig(CacheKnobs(block_size=16, prefix_match_unit=None, eviction="lfu"))
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="eviction_alpha"):
            CacheConfig(CacheKnobs(block_size=16, prefix_match_unit=None, eviction_alpha=bad))
    with pytest.raises(ValueError, match="ssm_fraction"):
        RecomputeCost(ssm_fraction=1.5)
    with pytest.raises(ValueError, match="token_flops"):
        RecomputeCost(token_flops=-1.0)


def test_the_cache_manager_scores_only_under_flop_aware() -> None:
    spec = SpeculativeConfig()
    lru = CacheManager(
        CacheConfig(
            CacheKnobs(block_size=16, prefix_match_unit=None), num_blocks=64, max_model_len=256
        ),
        spec,
    )
    assert lru.pool.value is None
    fa = CacheManager(
        CacheConfig(
            CacheKnobs(block_size=16, prefix_match_unit=None, eviction="flop-aware"),
            num_blocks=64,
            num_state_pages=16,
            max_model_len=256,
        ),
        spec,
    )
    assert isinstance(fa.pool.value, FlopValue) and fa.state_pool.value is fa.pool.value


def _snapshot_cache(**kw: object) -> CacheManager:
    from hycache.config import Policy

    knobs = CacheKnobs(block_size=8, prefix_match_unit=4, policy=Policy.LIMIT, **kw)  # type: ignore[arg-type]
    cfg = CacheConfig(knobs, num_blocks=64, num_state_pages=32, max_model_len=128)
    return CacheManager(cfg, SpeculativeConfig(num_speculative_tokens=2))


def test_snapshot_admission_follows_the_observed_reuse() -> None:
    from hycache.cache.boundaries import ATTENTION_KIND, StateKind
    from hycache.cache.retention.policy import AdmissionPolicy
    from hycache.cache.retention.rule import ADMIT_EXPLORE
    from hycache.request import Request, SamplingParams

    snap = StateKind.SNAPSHOT
    for eviction in ("lru", "flop-aware"):
        cache = _snapshot_cache(eviction=eviction)
        pool, policy = cache.state_pool, cache.retention
        assert isinstance(policy, AdmissionPolicy)
        admission = policy.rule
        assert pool.reuse.chance(snap) == 0.5  # the prior
        # nothing evicted yet: nothing is displaced, every snapshot is admitted
        assert all(admission.admit(snap, 8) for _ in range(20))
        # the pool under pressure, a cached attention block first in line, snapshots never hit
        (victim,) = pool.allocate(1)
        pool.add_key(victim, key(9), 8, ATTENTION_KIND)
        pool.free([victim])
        pool.evicted[(0, False, False)] += 1
        # the ghosts priced a page over its life at 4 tokens (one per 31 free pages ahead)
        pool.num_evicted = pool.num_free
        admission.record_ghost_hit(4 * admission.ghost_depth)
        assert admission.page_value(snap) == 4
        pool.reuse.resolved[snap] = 40
        decisions = [admission.admit(snap, 8) for _ in range(4 * ADMIT_EXPLORE)]
        assert sum(decisions) == 4  # one in ADMIT_EXPLORE keeps exploring
        pool.reuse.hit[snap] = 30  # most of them were hit after all
        assert all(admission.admit(snap, 8) for _ in range(20))
        # one decision per request, kept over its steps
        req = Request.new(
            "r", list(range(1, 12)), SamplingParams(max_tokens=8), unit=4, lookahead=True
        )
        pool.reuse.hit[snap] = 0
        first = [cache.will_snapshot(req, req.num_tokens, 2) for _ in range(5)]
        assert len(set(first)) == 1
    off = _snapshot_cache(admission=False)
    off.state_pool.reuse.resolved[snap] = 40
    off.state_pool.evicted[(0, False, False)] += 1
    assert off.will_snapshot(req, req.num_tokens, 2)  # no admission: always, as before
