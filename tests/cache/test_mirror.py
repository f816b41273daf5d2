"""The store mirror's lookup as a typed, pure step: `StoreMirror.lookup` reads the store and
changes no pool; `CacheManager.fetch` then loads what it found and the device lookup resumes
deeper. Stand-in store objects (`hycache.sim.tier`), the real mirror and host store."""

from __future__ import annotations

import random

import pytest

from hycache.cache.mirror import StoreHit, StoreLoad
from hycache.sched.executor import DryRunExecutor, run_to_completion
from hycache.sched.scheduler import Scheduler
from hycache.sim.tier import SimHostStore, attach_sim_store
from tests.helpers import make_config, new_request, tokens

CFG = make_config(block_size=16, unit=4, policy="limit", k=2, num_blocks=64, max_model_len=256)


def _instance(store: SimHostStore) -> Scheduler:
    sched = Scheduler(CFG)
    attach_sim_store(sched.cache, store, CFG, None)
    return sched


def test_lookup_is_pure_and_fetch_loads_the_deeper_hit() -> None:
    rng = random.Random(0)
    shared = tokens(rng, 70)
    store = SimHostStore(1 << 30)
    producer = _instance(store)
    producer.add_request(new_request(CFG, "p", [*shared, *tokens(rng, 9)]))
    run_to_completion(producer, DryRunExecutor(num_speculative_tokens=2), check=True)

    other = _instance(store)  # a second engine: nothing on its device, the same store
    cache = other.cache
    req = new_request(CFG, "s", [*shared, *tokens(rng, 11)])
    hit = cache.lookup(req)
    assert hit.resume_point == 0
    before = [(p.num_free, p.num_cached) for p in cache.pools]

    assert cache.mirror is not None
    found = cache.mirror.lookup(req, hit, cache.attention, cache.ssm)
    assert isinstance(found, StoreHit) and found.loads
    assert all(isinstance(x, StoreLoad) and x.payload for x in found.loads)
    assert [(p.num_free, p.num_cached) for p in cache.pools] == before  # nothing changed

    deeper = cache.fetch(req, hit)
    # the producer's state at its block boundary 64; the junction, 70 less the drop, seen
    assert deeper.resume_point == 64 and deeper.store_hit_tokens == 64
    assert deeper.junction == 68
    assert cache.lookup(req).resume_point == 64  # the device itself now holds it
    cache.unstage()
    assert [p.num_free for p in cache.pools] == [f for f, _ in before]  # cached, not held


def test_a_cache_takes_one_store() -> None:
    sched = _instance(SimHostStore(1 << 20))
    with pytest.raises(ValueError, match="already has a store"):
        attach_sim_store(sched.cache, SimHostStore(1 << 20), CFG, None)
