"""A request's SSM checkpoints age with its attention blocks (`SSMManager.free` refreshes them).

A checkpoint goes to the cache the step it is written, the attention blocks of its prefix when
the request lets go. Aged from its write, LRU evicted the state long before those blocks and
left them cached but unusable: on a Mooncake-like trace a 17k-token request recomputed 16k
tokens with the prefix's attention blocks all cached (docs/admission.md).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.cache.block_pool import BlockEvent
from hycache.config import GroupKind
from hycache.sched.executor import DryRunExecutor
from hycache.sched.scheduler import Scheduler
from tests.helpers import make_config, new_request, tokens


def _step_until(sched: Scheduler, ex: DryRunExecutor, done: object) -> None:
    for _ in range(10_000):
        if done():  # type: ignore[operator]
            return
        out = sched.schedule()
        sched.update(out, ex.execute(out))
        sched.cache.check_integrity()
    raise AssertionError("no progress")


def _evictions(sched: Scheduler, n: int) -> list[BlockEvent]:
    """Allocate `n` more pages straight from the pool (pressure from elsewhere): the keyed
    entries removed, in eviction order."""
    removed: list[BlockEvent] = []
    sched.cache.subscribe(lambda e: removed.append(e) if e.kind == "removed" else None)
    sched.cache.pool.allocate(n)
    return removed


@pytest.mark.parametrize("policy", ["limit", "junction"])
@pytest.mark.parametrize("internal", [True, False])
def test_a_long_decode_keeps_its_prefill_states_until_its_attention_blocks_go(
    policy: str, internal: bool
) -> None:
    """A (long prompt, long decode) writes its checkpoints early; B (unrelated, short) comes
    and goes while A decodes; then A finishes. Under pressure B's entries are evicted before
    any state of A's: A's prefix stays resumable as long as its attention blocks are cached."""
    b = 16
    cfg = make_config(block_size=b, unit=4, policy=policy, internal_checkpoints=internal)
    sched = Scheduler(cfg)
    ex = DryRunExecutor(num_speculative_tokens=3, acceptance_rate=0.0)
    rng = random.Random(5)
    a = new_request(cfg, "a", tokens(rng, 5 * b + 3), max_tokens=40)
    sched.add_request(a)
    _step_until(sched, ex, lambda: a.num_output_tokens > 0)
    rb = new_request(cfg, "b", tokens(rng, 3 * b + 1), max_tokens=1)
    sched.add_request(rb)
    _step_until(sched, ex, lambda: rb.status.finished)
    _step_until(sched, ex, lambda: not sched.has_unfinished())
    ssm = {i for i, g in enumerate(cfg.cache.groups) if g is GroupKind.SSM}
    a_keys = {a.hashes.at(p) for p in range(4, a.hashes.num_hashed_tokens + 1, 4)}
    b_keys = {rb.hashes.at(p) for p in range(4, rb.hashes.num_hashed_tokens + 1, 4)}
    removed = _evictions(sched, sched.cache.pool.num_free)
    order = [e for e in removed if e.key.hash in a_keys | b_keys]
    a_states = [  # its prompt's states (its decode snapshot goes first by design)
        i
        for i, e in enumerate(order)
        if e.key.hash in a_keys and e.key.group in ssm and e.position <= a.num_prompt_tokens
    ]
    b_entries = [i for i, e in enumerate(order) if e.key.hash in b_keys]
    assert a_states and b_entries
    assert max(b_entries) < min(a_states), [(e.key.group, e.position) for e in order]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), policy=st.sampled_from(["limit", "junction", "replay"]))
def test_refreshing_states_keeps_the_pool_sound_under_pressure(seed: int, policy: str) -> None:
    """Requests sharing prefixes in a pool too small for them all (evictions, preemptions):
    refreshed states never break the pool's accounting, and every hit is a kept state."""
    b = 16
    cfg = make_config(
        block_size=b, unit=4, policy=policy, num_blocks=48, max_model_len=6 * b, max_num_seqs=4
    )
    sched = Scheduler(cfg)
    ex = DryRunExecutor(num_speculative_tokens=3, acceptance_rate=0.6, seed=seed)
    rng = random.Random(seed)
    roots = [tokens(rng, rng.randrange(b, 4 * b)) for _ in range(3)]
    reqs = []
    for i in range(12):
        root = rng.choice(roots)
        prompt = root[: rng.randrange(1, len(root) + 1)] + tokens(rng, rng.randrange(1, b))
        r = new_request(cfg, f"r{i}", prompt, max_tokens=rng.randrange(1, 12))
        reqs.append(r)
        sched.add_request(r)
    _step_until(sched, ex, lambda: not sched.has_unfinished())
    for r in reqs:
        assert r.first_outcome is not None and r.first_outcome.resume_point <= r.num_prompt_tokens
