"""The joint hit: attention first, the EAGLE drop once, SSM to a fixed point."""

from __future__ import annotations

import random

import pytest

from hycache.cache.coordinator import usable_match
from hycache.cache.manager import CacheManager
from tests.helpers import make_config, new_request, run_sequential, tokens


def test_identical_resend_resumes_at_the_replay_boundary_with_whole_blocks() -> None:
    # architecture §4.4: B = u = 32, EAGLE: 128 tokens match 4 blocks, drop one, resume at 96.
    cfg = make_config(block_size=32, unit=None, policy="replay")
    p = tokens(random.Random(0), 128)
    _, (_, resend) = run_sequential(cfg, [p, p])
    assert resend.first_hit_tokens == 96


def test_resume_point_is_below_the_prompt_end() -> None:
    for eagle in (True, False):
        cfg = make_config(block_size=16, unit=4, eagle=eagle)
        p = tokens(random.Random(1), 64)
        _sched, (_, resend) = run_sequential(cfg, [p, p])
        assert resend.first_hit_tokens <= 63
        assert resend.first_hit_tokens == 60  # one unit under the end, with or without EAGLE


def test_lookup_is_pure() -> None:
    cfg = make_config()
    p = tokens(random.Random(2), 80)
    sched, _ = run_sequential(cfg, [p])
    cache: CacheManager = sched.cache
    before = (list(cache.pool.ref_cnt), cache.pool.num_free, dict(cache.pool._key_to_block))
    req = new_request(cfg, "probe", p)
    hit = cache.lookup(req)
    assert hit.resume_point == 76
    assert before == (list(cache.pool.ref_cnt), cache.pool.num_free, cache.pool._key_to_block)


def test_drop_applied_once_and_ssm_never_drops() -> None:
    cfg = make_config(block_size=16, unit=4)
    p = tokens(random.Random(3), 40)
    sched, _ = run_sequential(cfg, [p])
    hit = sched.cache.lookup(new_request(cfg, "x", p))
    # attention matched the whole hashed prompt (40), dropped one unit (36) = tail checkpoint
    assert hit.attention_match == 40
    assert hit.resume_point == 36
    assert hit.junction == 0


def test_internal_writes_under_page_pressure_keep_junctions_first() -> None:
    """When the pool cannot hold every checkpoint a chunk would write inside its forward, the
    observed junctions go first, then the lower positions; the rest are counted, and the
    step itself is never refused for them."""
    cfg = make_config(block_size=16, unit=4, policy="limit", num_blocks=64, max_model_len=128)
    cache = CacheManager(cfg.cache, cfg.speculative)
    req = new_request(cfg, "r", tokens(random.Random(1), 90))
    req.junction_stops = (44, 48)
    writes = (16, 32, 44, 48, 64, 80)
    free = cache.state_pool.num_free
    assert cache._fit_writes(req, writes, free) == ()
    assert cache._fit_writes(req, writes, free - 1) == (44,)
    assert cache._fit_writes(req, writes, free - 3) == (16, 44, 48)
    assert cache._fit_writes(req, writes, 0) == writes
    assert cache.internal_writes_dropped == 6 + 5 + 3


@pytest.mark.parametrize("policy", ["tail", "replay", "junction", "lookahead", "limit"])
@pytest.mark.parametrize("eagle", [True, False])
def test_the_junction_is_the_usable_match(policy: str, eagle: bool) -> None:
    """`usable_match` is the one drop: the joint hit's junction is it (when the SSM groups stop
    short), and no resume point lies beyond it, under every policy, with and without EAGLE."""
    cfg = make_config(block_size=16, unit=4, policy=policy, eagle=eagle)
    rng = random.Random(4)
    shared = tokens(rng, 45)
    sched, _ = run_sequential(cfg, [shared + tokens(rng, 30)])
    cache: CacheManager = sched.cache
    drop = cache.bounds.drop
    assert drop == (4 if eagle and policy not in ("lookahead", "limit") else 0)
    for a in (0, drop, drop + 1, 44):
        assert usable_match(a, cache.bounds) == max(a - drop, 0)
    hit = cache.lookup(new_request(cfg, "sibling", shared + tokens(rng, 30)))
    usable = usable_match(hit.attention_match, cache.bounds)
    assert hit.resume_point <= usable
    assert hit.junction == (usable if usable > hit.resume_point else 0)
    assert hit.attention_match > 0
