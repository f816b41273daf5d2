"""Admission (hycache.cache.retention): a state takes a page only while its kind's observed
chance of a hit, times what a hit saves, beats what the page displaces."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.cache.block_pool import BlockPool, CacheKey
from hycache.cache.boundaries import ATTENTION_KIND, Boundaries, StateKind
from hycache.cache.manager import CacheManager
from hycache.cache.retention.ghosts import Ghosts
from hycache.cache.retention.policy import AdmissionPolicy, KeepEverything
from hycache.cache.retention.rule import ADMIT_EXPLORE, Admission
from hycache.config import CacheKnobs, GroupKind, Policy
from hycache.sched.executor import run_to_completion
from hycache.sched.scheduler import Scheduler
from tests.helpers import RecordingExecutor, make_config, new_request, tokens


def key(i: int) -> CacheKey:
    return CacheKey(0, i.to_bytes(16, "little"))


def _cached(pool: BlockPool, pos: int, kind: str) -> int:
    (b,) = pool.allocate(1)
    pool.add_key(b, key(pos), pos, kind)
    pool.free([b])
    return b


def test_nothing_is_displaced_until_the_pool_has_evicted_a_cached_entry() -> None:
    pool = BlockPool(8)
    adm = Admission(pool)
    _cached(pool, 400, ATTENTION_KIND)
    pool.reuse.resolved[StateKind.TAIL] = 100  # tails never hit
    assert adm.displaced() == 0.0
    assert all(adm.admit(StateKind.TAIL, 10) for _ in range(3 * ADMIT_EXPLORE))


def test_under_pressure_a_state_must_outweigh_the_entry_it_displaces() -> None:
    pool = BlockPool(8)
    adm = Admission(pool)
    _cached(pool, 40, ATTENTION_KIND)
    pool.evicted[(0, False, False)] += 1  # the pool has filled once
    pool.reuse.hit[ATTENTION_KIND] = pool.reuse.resolved[ATTENTION_KIND] = 8  # 0.9
    assert adm.displaced() == 0.9 * 40
    # the unit below the tail, hit half the time: worth 0.5 * n
    assert adm.admit(StateKind.BELOW_TAIL, 80)  # 40 >= 36
    assert not adm.admit(StateKind.BELOW_TAIL, 64)  # 32 < 36
    # refused states are still explored, one in ADMIT_EXPLORE per kind
    decisions = [adm.admit(StateKind.GRID, 8) for _ in range(4 * ADMIT_EXPLORE)]
    assert sum(decisions) == 4 and decisions[ADMIT_EXPLORE - 1]
    assert adm.refused[StateKind.GRID] == 4 * ADMIT_EXPLORE


def test_junction_and_replay_states_displace_any_cached_entry_but_no_running_page() -> None:
    """The states a `-split` arm's stops keep are kept by `limit` too, whatever cached entry
    they push out, so `limit` never keeps less than `limit-split`; a page the running
    requests are about to need is still refused."""
    pool = BlockPool(8)
    adm = Admission(pool)
    _cached(pool, 40_000, ATTENTION_KIND)
    pool.evicted[(0, False, False)] += 1
    pool.reuse.hit[ATTENTION_KIND] = pool.reuse.resolved[ATTENTION_KIND] = 8
    pool.reuse.resolved[StateKind.JUNCTION] = pool.reuse.resolved[StateKind.REPLAY] = 50
    assert adm.displaced() > adm.worth(StateKind.JUNCTION, 64)
    for _ in range(2 * ADMIT_EXPLORE):
        assert adm.admit(StateKind.JUNCTION, 64) and adm.admit(StateKind.REPLAY, 64)
    assert adm.refused[StateKind.JUNCTION] == adm.refused[StateKind.REPLAY] == 0
    assert not adm.admit(StateKind.BELOW_TAIL, 64)  # any other kind is compared
    empty = Admission(BlockPool(8))
    empty.pool.evicted[(0, False, False)] += 1
    assert not empty.admit(StateKind.JUNCTION, 4096, reserve=7)


def test_under_pressure_a_rare_kind_is_refused_even_over_a_cheap_victim() -> None:
    """Under pressure a prompt state of a kind hit less than `DEMOTE_RATIO` times as often as
    attention blocks (the kinds whose released states are demoted) is refused, explored ones
    too, however little the victim is worth; before pressure it is kept, kinds above the bar
    are still compared with the victim, and junction / replay states and snapshots keep
    their own rules."""
    pool = BlockPool(8)
    adm = Admission(pool)
    _cached(pool, 40, ATTENTION_KIND)
    pool.reuse.hit[ATTENTION_KIND] = pool.reuse.resolved[ATTENTION_KIND] = 8  # 0.9: bar 0.45
    pool.reuse.resolved[StateKind.BELOW_TAIL] = 8  # 0.1: rare
    pool.reuse.hit[StateKind.DROP_REPLAY], pool.reuse.resolved[StateKind.DROP_REPLAY] = 5, 8
    pool.reuse.resolved[StateKind.JUNCTION] = pool.reuse.resolved[StateKind.SNAPSHOT] = 50
    assert adm.admit(StateKind.BELOW_TAIL, 4096)  # nothing evicted yet: a free page
    pool.evicted[(0, False, False)] += 1
    assert adm.worth(StateKind.BELOW_TAIL, 4096) > adm.displaced() == 0.9 * 40
    assert adm.refuses_rare(StateKind.BELOW_TAIL)
    assert not any(adm.admit(StateKind.BELOW_TAIL, 4096) for _ in range(4 * ADMIT_EXPLORE))
    assert adm.refused[StateKind.BELOW_TAIL] == 4 * ADMIT_EXPLORE
    assert adm.admit(StateKind.DROP_REPLAY, 4096)  # 0.6 >= 0.45: compared, and worth more
    assert adm.admit(StateKind.JUNCTION, 64)
    assert not adm.refuses_rare(StateKind.SNAPSHOT) and adm.admit(StateKind.SNAPSHOT, 4096)


def test_a_rare_kind_is_admitted_again_once_attention_blocks_are_hit_as_rarely() -> None:
    """The bar follows the attention blocks' chance: when it falls to within `DEMOTE_RATIO`
    of the kind's, the kind is no longer rare and is compared with the victim again."""
    pool = BlockPool(8)
    adm = Admission(pool)
    _cached(pool, 40, ATTENTION_KIND)
    pool.evicted[(0, False, False)] += 1
    pool.reuse.hit[ATTENTION_KIND] = pool.reuse.resolved[ATTENTION_KIND] = 8
    pool.reuse.resolved[StateKind.BELOW_TAIL] = 8  # 0.1
    assert not adm.admit(StateKind.BELOW_TAIL, 4096)
    pool.reuse.hit[ATTENTION_KIND] = 0  # attention blocks: 0.1, bar 0.05
    assert not adm.refuses_rare(StateKind.BELOW_TAIL)
    assert adm.admit(StateKind.BELOW_TAIL, 4096)  # 409.6 >= 0.1 * 40
    assert not adm.admit(StateKind.BELOW_TAIL, 32)  # 3.2 < 4: the victim comparison


def test_a_drop_junction_state_is_worth_one_unit() -> None:
    """The drop scheme's junction sits a unit above the request's own junction state, so a
    hit on it saves `u` tokens, wherever it lies (`Boundaries.hit_saving`)."""
    b = Boundaries(block_size=4416, unit=64, drafter=True, policy=Policy.LIMIT)
    assert b.hit_saving(StateKind.DROP_JUNCTION, 57_600) == 64
    assert b.hit_saving(StateKind.JUNCTION, 57_536) == 57_536
    assert b.state_kind(57_600, 64_016, (57_536, 57_600), (57_600,)) is StateKind.DROP_JUNCTION
    assert b.state_kind(57_536, 64_016, (57_536, 57_600), (57_600,)) is StateKind.JUNCTION


def test_the_chance_of_a_kind_follows_hits_and_evictions() -> None:
    pool = BlockPool(4)
    hit = _cached(pool, 8, StateKind.JUNCTION)
    lost = _cached(pool, 12, StateKind.JUNCTION)
    assert pool.reuse.chance(StateKind.JUNCTION) == 0.5  # the prior
    pool.touch([hit])
    pool.touch([hit])  # a second hit on the same keying counts once
    assert pool.reuse.chance(StateKind.JUNCTION) == 2 / 3
    pool.free([hit])
    pool.allocate(pool.num_free)  # evicts both: `lost` was never hit
    assert pool.reuse.resolved[StateKind.JUNCTION] == 2
    assert pool.reuse.chance(StateKind.JUNCTION) == 2 / 4
    assert pool.kind[lost] == ""  # an evicted block loses its kind with its keys


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["alloc", "key", "free", "free_low", "touch"]), st.integers(0, 9)
        ),
        max_size=60,
    ),
    scored=st.booleans(),
)
def test_peek_victim_is_the_first_cached_entry_the_pool_evicts(
    ops: list[tuple[str, int]], scored: bool
) -> None:
    """Whatever the history, `peek_victim` names the first keyed block that allocations take
    once the unkeyed free blocks are gone (None when no free block is keyed)."""
    pool = BlockPool(10, (lambda _k, p: (p % 3) / 2) if scored else None)
    held: list[int] = []
    n = 0
    for op, i in ops:
        if op == "alloc" and pool.num_free:
            held.extend(pool.allocate(1))
        elif op == "key" and held:
            n += 1
            pool.add_key(held[i % len(held)], key(n), n, ATTENTION_KIND)
        elif op in ("free", "free_low") and held:
            pool.free([held.pop(i % len(held))], low_priority=op == "free_low")
        elif op == "touch":
            cached = [b for b in range(1, 10) if pool.is_free(b) and pool.keys[b]]
            if cached:
                b = cached[i % len(cached)]
                pool.touch([b])
                held.append(b)
    victim = pool.peek_victim()
    keyed = {b for b in range(1, 10) if pool.keys[b]}
    taken = pool.allocate(pool.num_free)
    assert victim == next((b for b in taken if b in keyed), None)


def test_peek_victim_matches_the_allocation_order() -> None:
    pool = BlockPool(8)
    unkeyed = pool.allocate(2)
    old = _cached(pool, 4, ATTENTION_KIND)
    _cached(pool, 8, ATTENTION_KIND)
    pool.free(unkeyed)
    assert pool.peek_victim() == old
    assert old not in pool.allocate(2)  # unkeyed ones go first
    low = _cached_low(pool, 12)
    # a decode snapshot goes first only while it is worth no more than the LRU head: at the
    # prior (0.5 each) the snapshot at 12 outweighs the attention block at 4
    assert pool.peek_victim() == old
    pool.reuse.resolved[StateKind.SNAPSHOT] = 20  # snapshots never hit: 1/22 * 12 < 0.5 * 4
    assert pool.peek_victim() == low
    taken = pool.allocate(pool.num_free)
    assert taken.index(low) < taken.index(old)


def test_a_snapshot_hit_more_often_than_what_the_lru_evicts_outlives_it() -> None:
    """On a chat a decode snapshot is the next turn's hit: it is not evicted before stale
    cached entries of kinds nobody hits (the low-priority queue used to go first always)."""
    pool = BlockPool(6)
    stale = [_cached(pool, 64 * (i + 1), StateKind.BELOW_TAIL) for i in range(3)]
    pool.reuse.resolved[StateKind.BELOW_TAIL] = 50  # never hit
    snap = _cached_low(pool, 1024)
    pool.reuse.hit[StateKind.SNAPSHOT] = pool.reuse.resolved[StateKind.SNAPSHOT] = 9
    taken = pool.allocate(pool.num_free - 1)
    assert set(stale) <= set(taken) and snap not in taken
    assert pool.keys[snap]


def test_the_pool_remembers_what_it_evicted_last_as_ghosts() -> None:
    pool = BlockPool(33)  # ghost depth 2
    ghosts = Ghosts(pool)
    assert ghosts.depth == 2
    _cached(pool, 4, StateKind.TAIL)
    pool.allocate(pool.num_free - 3)  # the unkeyed ones: nothing evicted
    second, third = _cached(pool, 8, StateKind.TAIL), _cached(pool, 12, StateKind.TAIL)
    assert pool.num_evicted == 0 and not ghosts.keys
    pool.allocate(1)  # evicts `first`
    assert pool.num_evicted == 1 and key(4) in ghosts
    pool.allocate(2)  # evicts the other two: `first` is now 3 evictions deep
    assert pool.num_evicted == 3
    assert [key(p) in ghosts for p in (4, 8, 12)] == [False, True, True]
    (b,) = [x for x in range(1, 33) if pool.ref_cnt[x]][:1]
    pool.add_key(b, key(12), 12, StateKind.TAIL)  # cached again: no longer a ghost
    assert key(12) not in ghosts
    assert not pool.keys[second] and not pool.keys[third]


def test_a_page_is_priced_by_the_ghosts_over_the_life_it_would_have() -> None:
    pool = BlockPool(33)
    adm = Admission(pool)
    assert adm.page_value() == 0.0  # nothing evicted: a page displaces nothing
    pool.num_evicted = 10
    adm.record_ghost_hit(400)  # 400 tokens the last 2 evicted blocks would have saved
    assert adm.page_value() == 400 / (2 * 10) * pool.num_free
    adm.record_hold(30)  # a snapshot saw 30 evictions while its request held it
    adm.record_hold(10)
    assert adm.page_value(StateKind.SNAPSHOT) == 400 / (2 * 10) * (pool.num_free + 20)


def test_under_pressure_a_snapshot_is_compared_with_a_page_not_the_next_victim() -> None:
    """The victim is evicted at the next allocation anyway: a snapshot displaces one page of
    cache for as long as it is held. A snapshot less likely hit than a cached entry is kept
    while pages are worth little (no ghost was ever hit), refused once they are not."""
    pool = BlockPool(33)
    adm = Admission(pool)
    snap = StateKind.SNAPSHOT
    _cached(pool, 40_000, ATTENTION_KIND)
    pool.evicted[(0, False, False)] += 1
    pool.num_evicted = 100
    pool.reuse.hit[ATTENTION_KIND] = pool.reuse.resolved[ATTENTION_KIND] = 8
    pool.reuse.resolved[snap] = 8  # chance 0.1: worth 0.1 * 1000 = 100
    assert adm.entry_worth(pool.peek_victim()) > adm.worth(snap, 1000)
    assert adm.admit(snap, 1000)  # the old rule refused it against the victim
    adm.record_ghost_hit(2 * 100 * 10)  # now a page is worth 10 per free page ahead
    assert adm.displaced(snap, 1000) == 10 * pool.num_free > adm.worth(snap, 1000)
    assert not adm.admit(snap, 1000)


@given(hits=st.integers(0, 20), misses=st.integers(0, 20), free=st.integers(1, 6))
def test_a_held_snapshot_takes_a_running_page_only_if_mostly_hit(
    hits: int, misses: int, free: int
) -> None:
    """A snapshot page is held until its request finishes: while no more pages are free than
    the running requests hold, it is kept only when snapshots are hit more often than not,
    even before the pool has evicted anything; at the prior (0.5) it is not."""
    pool = BlockPool(8)
    pool.allocate(7 - free)
    adm = Admission(pool, explore=10**6)
    pool.reuse.hit[StateKind.SNAPSHOT] = hits
    pool.reuse.resolved[StateKind.SNAPSHOT] = hits + misses
    chance = pool.reuse.chance(StateKind.SNAPSHOT)
    assert adm.admit(StateKind.SNAPSHOT, 640, reserve=free) == (chance > 0.5)
    assert adm.admit(StateKind.SNAPSHOT, 640, reserve=free - 1)  # room beyond their needs


def test_exploration_never_takes_a_page_the_running_requests_need() -> None:
    pool = BlockPool(8)
    adm = Admission(pool)
    pool.evicted[(0, False, False)] += 1  # under pressure, nothing cached
    decisions = [adm.admit(StateKind.TAIL, 64, reserve=7) for _ in range(4 * ADMIT_EXPLORE)]
    assert not any(decisions)


def _cached_low(pool: BlockPool, pos: int) -> int:
    (b,) = pool.allocate(1)
    pool.add_key(b, key(pos), pos, StateKind.SNAPSHOT)
    pool.free([b], low_priority=True)
    return b


def test_state_kind_names_why_each_prompt_state_is_kept() -> None:
    from hycache.config import CacheConfig, SpeculativeConfig

    cache = CacheConfig(
        CacheKnobs(block_size=4416, prefix_match_unit=64), num_blocks=64, max_model_len=70000
    )
    b = Boundaries.from_config(cache, SpeculativeConfig(num_speculative_tokens=3))
    t = 64_016  # the worked example: replay 61,824, drop replay 57,408, tail 64,000
    assert b.state_kind(64_000, t) is StateKind.TAIL
    assert b.state_kind(61_824, t) is StateKind.REPLAY
    assert b.state_kind(63_936, t) is StateKind.BELOW_TAIL
    assert b.state_kind(57_408, t) is StateKind.DROP_REPLAY
    assert b.state_kind(57_536, t, (57_536,)) is StateKind.JUNCTION
    assert b.state_kind(4416 - 64, t) is StateKind.GRID


def _run(admission: bool, seed: int, num_blocks: int) -> Scheduler:
    """Distinct prompts under one shared system prompt, through a small pool: nothing is ever
    resent, so tail checkpoints are never hit."""
    b, u = 16, 4
    cfg = make_config(
        block_size=b,
        unit=u,
        policy="limit",
        max_model_len=8 * b,
        budget=4 * b,
        num_blocks=num_blocks,
        max_num_seqs=4,
    )
    cfg = replace(cfg, cache=cfg.cache.with_knobs(admission=admission))
    sched = Scheduler(cfg)
    ex = RecordingExecutor(num_speculative_tokens=3, acceptance_rate=0.6, seed=seed)
    rng = random.Random(seed)
    system = tokens(rng, 2 * b)
    for i in range(40):
        prompt = system + tokens(rng, rng.randrange(b, 5 * b))
        sched.add_request(new_request(cfg, f"q{i}", prompt, max_tokens=rng.randrange(1, 8)))
        if i % 4 == 3:
            run_to_completion(sched, ex, check=True)
    run_to_completion(sched, ex, check=True)
    return sched


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6), num_blocks=st.integers(24, 60))
def test_admission_keeps_the_cache_sound_and_keys_only_states_it_kept(
    seed: int, num_blocks: int
) -> None:
    """With admission on and a small pool: integrity, nothing leaked, and every SSM key sits on
    a page of a named kind at a position a checkpoint belongs (or a decode snapshot)."""
    sched = _run(True, seed, num_blocks)
    cache = sched.cache
    cache.check_integrity()
    assert cache.num_live_requests == 0
    pool = cache.state_pool
    assert pool.num_free == pool.num_blocks - 1  # nothing leaked
    ssm = {i for i, g in enumerate(cache.config.groups) if g is GroupKind.SSM}
    kinds = set(StateKind)
    for blk in range(1, pool.num_blocks):
        for k, pos in pool.keys[blk]:
            if k.group in ssm:
                assert pool.kind[blk] in kinds
                assert pos % cache.bounds.unit == 0 and pos > 0


def test_admission_stops_keeping_tail_checkpoints_nobody_resends() -> None:
    """Under pressure, tails (never hit here) lose their pages to what is hit; without
    admission every one is kept."""
    on, off = _run(True, 7, 30), _run(False, 7, 30)
    assert isinstance(on.cache.retention, AdmissionPolicy)
    assert isinstance(off.cache.retention, KeepEverything)
    assert on.cache.retention.rule.refused[StateKind.TAIL] > 0
    tails_on = on.cache.state_pool.reuse.resolved[StateKind.TAIL]
    tails_off = off.cache.state_pool.reuse.resolved[StateKind.TAIL]
    assert tails_on < tails_off
    assert on.cache.stats().hit_tokens >= 0.9 * off.cache.stats().hit_tokens


def test_with_nothing_cached_a_page_is_refused_only_when_running_requests_need_it() -> None:
    pool = BlockPool(8)
    adm = Admission(pool)
    pool.evicted[(0, False, False)] += 1  # under pressure, and no free block carries a key
    assert pool.peek_victim() is None and pool.num_free == 7
    assert adm.displaced(StateKind.TAIL, reserve=3) == 0.0  # free memory beyond their needs
    assert adm.displaced(StateKind.TAIL, reserve=7) == float("inf")
    assert not adm.admit(StateKind.JUNCTION, 4096, reserve=7)


def test_a_held_snapshot_is_given_back_before_a_running_request_is_short() -> None:
    """A decode snapshot is speculative; a preemption recomputes a request. When a running
    request's next step finds no page, the snapshot another request holds goes back (counted
    as a snapshot never hit, its request keeps none) and the step fits."""
    cfg = make_config(block_size=16, unit=4, policy="limit", num_blocks=16, k=2, max_model_len=32)
    cache = CacheManager(cfg.cache, cfg.speculative)
    rng = random.Random(0)
    a = new_request(cfg, "a", tokens(rng, 16), max_tokens=8)
    b = new_request(cfg, "b", tokens(rng, 16), max_tokens=64)
    alloc = cache.allocate(a, 0, 16, 2, cache.lookup(a))  # samples: a snapshot page
    assert alloc is not None and alloc.states[0].snapshot is not None
    assert cache.allocate(b, 0, 16, 2, cache.lookup(b)) is not None
    for r in (a, b):
        r.num_computed_tokens = 16
        cache.commit(r)
    pool = cache.state_pool
    others = pool.allocate(pool.num_free)  # whatever else runs holds every other page
    # b decodes into its third block: no page is free but a's snapshot
    grown = cache.allocate(b, 16, 17, 31, num_drafts=0)
    assert grown is not None
    assert not cache.will_snapshot(a, 16, 2)  # a keeps no snapshot from now on
    assert pool.reuse.resolved[StateKind.SNAPSHOT] == 1 and pool.reuse.hit[StateKind.SNAPSHOT] == 0
    cache.free(a)
    cache.free(b)
    pool.free(others)
    cache.check_integrity()
    assert pool.num_free == pool.num_blocks - 1


def test_an_admission_the_ghosts_would_have_served_deeper_is_recorded() -> None:
    """A state evicted shortly before a request that needed it: the request resumes lower,
    and admission learns what one more page would have saved."""
    cfg = make_config(block_size=16, unit=4, policy="limit", num_blocks=24, k=2, max_model_len=64)
    cache = CacheManager(cfg.cache, cfg.speculative)
    assert isinstance(cache.retention, AdmissionPolicy)
    rule = cache.retention.rule
    rng = random.Random(1)
    prompt = tokens(rng, 48)
    a = new_request(cfg, "a", prompt, max_tokens=1)
    assert cache.allocate(a, 0, 48, 2, cache.lookup(a)) is not None
    a.num_computed_tokens = 48
    cache.commit(a)
    cache.free(a)
    resumed = cache.lookup(new_request(cfg, "probe", [*prompt, 7, 7, 7, 7], max_tokens=1))
    assert resumed.resume_point > 0
    # whatever else runs takes pages one by one until the prompt's deepest hit is gone
    again = new_request(cfg, "again", [*prompt, 7, 7, 7, 7], max_tokens=1)
    pool, taken = cache.state_pool, []
    while cache.lookup(again).resume_point == resumed.resume_point:
        taken += pool.allocate(1)
    pool.free(taken)
    assert pool.num_evicted > 0 and rule.ghost_saved == 0
    hit = cache.lookup(again)
    assert hit.resume_point < resumed.resume_point
    assert cache.allocate(again, hit.resume_point, again.num_tokens, 2, hit) is not None
    assert rule.ghost_saved == resumed.resume_point - hit.resume_point


def _pages_to_come(cache: CacheManager) -> int:
    assert isinstance(cache.retention, AdmissionPolicy)
    return cache.retention.ledger.pages_to_come(cache.num_waiting)


def test_a_snapshot_at_the_prior_waits_for_room_the_requests_to_come_do_not_need() -> None:
    """Before anything is evicted and before any snapshot is resolved (chance 0.5), a
    snapshot page is held only while the free pages exceed what the running requests lack
    and what the waiting ones will take when they join (up to `max_num_seqs`): the first wave
    of a workload that fills the pool must not hold pages nobody may use."""
    cfg = make_config(block_size=16, unit=4, policy="limit", num_blocks=40, k=2, max_model_len=64)
    rng = random.Random(2)
    prompt = tokens(rng, 32)
    decisions = {}
    for seqs in (0, 2, 8):
        cache = CacheManager(cfg.cache, cfg.speculative, 8)
        cache.num_waiting = seqs
        a = new_request(cfg, "a", prompt, max_tokens=16)
        assert cache.allocate(a, 0, 16, 0, cache.lookup(a)) is not None  # a first chunk
        a.num_computed_tokens = 16
        cache.commit(a)
        # a lacks 3 of the 4 blocks it ends with (50 tokens); 39 pages, 2 taken
        assert _pages_to_come(cache) == 1 + 3 + min(seqs, 7) * 5
        alloc = cache.allocate(a, 16, 32, 2)  # the chunk that samples
        assert alloc is not None
        decisions[seqs] = alloc.states[0].snapshot is not None
    assert decisions == {0: True, 2: True, 8: False}
    cache.num_waiting = 100  # no more than max_num_seqs - 1 join a
    assert _pages_to_come(cache) == 1 + 1 + 7 * 5
