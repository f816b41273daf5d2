"""The engine on a second tier (`host`): a prefix evicted from the device pool is resumed from
the store at the position the device cache would have given, with tokens identical to no
caching; bad objects and a full store cost hits, never correctness or blocks."""

from __future__ import annotations

import pytest

from hycache.engine.engine import LLM
from tests.helpers import GEOMETRY, SP, assert_no_leaks, family, noise, replay


@pytest.mark.parametrize(
    ("policy", "k"), [("limit", 2), ("limit", 0), ("lookahead", 2), ("junction", 2), ("replay", 0)]
)
def test_a_sibling_resumes_from_the_store_where_the_device_would_have(policy: str, k: int) -> None:
    kw = {**GEOMETRY, "policy": policy, "num_speculative_tokens": k}
    fam = family()
    want = LLM("tiny", enable_prefix_caching=False, **kw).generate([fam[2]], SP)[0].token_ids
    device = replay(LLM("tiny", **kw), evict=False)  # a pool big enough to keep everything
    assert device.hit_tokens > 0
    small = replay(LLM("tiny", num_blocks=40, **kw))
    assert small.hit_tokens < device.hit_tokens  # the noise evicted the family's prefix
    tiered = LLM("tiny", num_blocks=40, kv_store="host", kv_store_gb=0.25, **kw)
    out = replay(tiered)
    assert out.hit_tokens == device.hit_tokens
    assert out.store_hit_tokens == out.hit_tokens - small.hit_tokens > 0
    assert out.token_ids == want
    assert_no_leaks(tiered)
    assert tiered.scheduler.cache.stats().store_hit_tokens == out.store_hit_tokens


def test_corrupt_objects_are_misses_counted_and_dropped() -> None:
    kw = {**GEOMETRY, "num_speculative_tokens": 2}
    fam = family()
    want = LLM("tiny", enable_prefix_caching=False, **kw).generate([fam[2]], SP)[0].token_ids
    llm = LLM("tiny", num_blocks=40, kv_store="host", kv_store_gb=0.25, **kw)
    llm.generate([fam[0]], SP)
    llm.generate([fam[1]], SP)
    for prompt in noise():
        llm.generate([prompt], SP)
    store = llm.store
    assert store is not None
    objects = store._objects  # type: ignore[attr-defined]
    for name, value in list(objects.items()):  # truncate every object, as a half-written put
        objects[name] = value[: len(value) // 2]
    out = llm.generate([fam[2]], SP)[0]
    assert out.store_hit_tokens == 0
    assert out.token_ids == want
    assert store.stats.corrupt > 0
    assert llm.scheduler.cache.mirror is not None
    assert llm.scheduler.cache.mirror.stats.failed_fetches >= 1
    assert_no_leaks(llm)


def test_a_full_store_refuses_puts_cleanly() -> None:
    kw = {**GEOMETRY, "num_speculative_tokens": 2}
    fam = family()
    want = LLM("tiny", enable_prefix_caching=False, **kw).generate([fam[2]], SP)[0].token_ids
    llm = LLM("tiny", num_blocks=40, kv_store="host", kv_store_gb=1e-6, **kw)  # ~1 KiB
    out = replay(llm)
    assert out.token_ids == want and out.store_hit_tokens == 0
    assert llm.store is not None and llm.store.stats.put_refused > 0
    assert llm.store.used_bytes <= llm.store.capacity_bytes
    assert_no_leaks(llm)


def test_two_engines_with_the_same_model_share_a_store_and_others_do_not() -> None:
    from hycache.store import HostStore

    kw = {**GEOMETRY, "num_speculative_tokens": 2}
    fam = family()
    device = replay(LLM("tiny", **kw), evict=False)
    shared = HostStore(1 << 28)
    first = LLM("tiny", kv_store=shared, **kw)
    first.generate([fam[0]], SP)
    first.generate([fam[1]], SP)
    second = LLM("tiny", kv_store=shared, **kw)  # a fresh device pool, the same store
    out = second.generate([fam[2]], SP)[0]
    assert out.hit_tokens == out.store_hit_tokens == device.hit_tokens > 0
    assert out.token_ids == device.token_ids
    other = LLM("tiny", kv_store=shared, dtype="float64", **kw)  # other bytes: other names
    assert other.generate([fam[2]], SP)[0].hit_tokens == 0


@pytest.mark.parametrize("k", [0, 2])
def test_engines_sharing_only_a_store_observe_the_junction_to_the_unit(k: int) -> None:
    """Each family member on its own engine (a fresh device pool), one shared store: the second
    observes the junction exactly as one device cache would (from the first's unit index), so
    the third resumes at the limit floor((P - 1) / u) * u."""
    from hycache.store import HostStore

    kw = {**GEOMETRY, "num_speculative_tokens": k}
    fam = family(seed=5)
    single = LLM("tiny", **kw)
    want = [single.generate([p], SP)[0] for p in fam]
    assert want[2].hit_tokens == (101 - 1) // 4 * 4  # the limit, on one device cache
    store = HostStore(1 << 28)
    got = [LLM("tiny", kv_store=store, **kw).generate([p], SP)[0] for p in fam]
    assert got[1].junction == want[1].junction > 0
    assert got[2].hit_tokens == got[2].store_hit_tokens == want[2].hit_tokens
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_the_store_heals_what_it_lost_while_the_device_held_it() -> None:
    """A store that lost everything (a restarted master, an eviction) is written again from
    the device cache once a request uses those blocks: another engine then hits it."""
    from hycache.store import HostStore

    kw = {**GEOMETRY, "num_speculative_tokens": 2}
    fam = family(seed=6)
    store = HostStore(1 << 28)
    first = LLM("tiny", kv_store=store, **kw)
    first.generate([fam[0]], SP)
    first.generate([fam[1]], SP)
    store.close()  # everything gone; the device pool still holds the family
    assert len(store) == 0
    used = first.generate([fam[2]], SP)[0]
    assert used.hit_tokens > 0 and used.store_hit_tokens == 0
    other = LLM("tiny", kv_store=store, **kw).generate([fam[2]], SP)[0]
    assert other.hit_tokens == other.store_hit_tokens >= used.hit_tokens


def test_a_dropped_engine_with_a_store_frees_its_cache_without_the_cycle_collector() -> None:
    """The store mirror holds no reference back to the cache manager, and the pools hold
    the mirror's callback weakly: dropping an engine with a store frees its cache (and the
    tensors the mirror's block IO reads) at once. The mirror used to hold the manager's bound
    `pool_for` and the pools its bound `_on_event`, and each test engine with a store waited
    for the cyclic collector."""
    import gc
    import weakref

    gc.collect()
    gc.disable()
    try:
        llm = LLM("tiny", **GEOMETRY, num_blocks=40, kv_store="host", kv_store_gb=0.05)
        llm.generate(family(n=2), SP)
        cache = weakref.ref(llm.scheduler.cache)
        assert llm.store is not None
        llm.store.close()
        del llm
        assert cache() is None, "something still holds the cache manager (a reference cycle?)"
    finally:
        gc.enable()
