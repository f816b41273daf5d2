"""The KV event log through the real scheduler and cache (no model): what a router rebuilds
from the events is exactly where requests can resume (docs/events.md)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.cache.event_log import KVEventLog
from hycache.cache.events import BlockRemoved, BlockStored, decode_batch, encode_batch
from hycache.config import GroupKind
from hycache.request import Request
from hycache.sched.executor import DryRunExecutor
from hycache.sched.scheduler import Scheduler
from tests.helpers import EventTree, make_config, new_request, tokens

B, U = 16, 4


def resumable_prefixes(sched: Scheduler, reqs: list[Request]) -> set[tuple[int, ...]]:
    """The oracle: every unit prefix at or below where some request's path resumes now (the
    cache's own lookup, asked of every request seen)."""
    out = set()
    for r in reqs:
        toks = r.prompt_token_ids + r.output_token_ids
        for p in range(U, sched.cache.lookup(r).resume_point + 1, U):
            out.add(tuple(toks[:p]))
    return out


def run_workload(
    seed: int, policy: str, eagle: bool, num_blocks: int | None, mode: str = "resumable"
) -> tuple[int, int]:
    """Random families and continuations arriving in waves; after every step the router's
    tree equals the oracle, and at each first admission the router's depth is the engine's
    hit or above it (equal where the request continues a path that resumes there and the
    step evicted nothing). Returns (admissions checked equal, evictions)."""
    cfg = make_config(block_size=B, unit=U, policy=policy, eagle=eagle, max_model_len=160,
                      budget=48, num_blocks=num_blocks)  # fmt: skip
    sched = Scheduler(cfg)
    log = KVEventLog(sched.cache, mode)  # type: ignore[arg-type]
    ex = DryRunExecutor(num_speculative_tokens=cfg.speculative.num_speculative_tokens, seed=seed)
    tree, rng = EventTree(), random.Random(seed)
    reqs: list[Request] = []
    equal = 0

    def drain() -> None:
        batch = log.drain()
        if batch is not None:
            batch = decode_batch(encode_batch(batch))  # what a subscriber receives
            tree.apply(batch if mode == "resumable" else _resumable(batch))
        assert tree.prefixes() == resumable_prefixes(sched, reqs)

    for wave in range(6):
        for _ in range(rng.randrange(1, 4)):
            base: list[int] = []
            if reqs and rng.random() < 0.8:
                r = rng.choice(reqs)
                full = r.prompt_token_ids + r.output_token_ids
                cut = len(full) if rng.random() < 0.3 else rng.randrange(1, len(full) + 1)
                base = full[:cut]
            prompt = (base + tokens(rng, rng.randrange(1, 40), vocab=50))[:100]
            req = new_request(cfg, f"w{wave}-{len(reqs)}", prompt, rng.randrange(1, 12))
            sched.add_request(req)
            reqs.append(req)
        for _ in range(rng.randrange(1, 8) if wave < 5 else 10_000):
            if not sched.has_unfinished():
                break
            before = {r.request_id: tree.depth(r.prompt_token_ids) for r in reqs
                      if r.first_outcome is None}  # fmt: skip
            paths = {r.request_id: sched.cache.lookup(r).resume_point for r in reqs}
            evicted = sched.cache.pool.num_evicted + sched.cache.state_pool.num_evicted
            out = sched.schedule()
            sched.update(out, ex.execute(out))
            quiet = evicted == sched.cache.pool.num_evicted + sched.cache.state_pool.num_evicted
            for r in reqs:
                if r.request_id not in before or r.first_outcome is None:
                    continue
                hit, depth = r.first_outcome.resume_point, before[r.request_id]
                assert hit <= depth, (r.request_id, hit, depth)
                # continues a request's whole sequence, whose own path resumes at `depth`
                if quiet and any(
                    paths[o.request_id] == depth
                    and r.prompt_token_ids[: o.num_tokens] == [*o.prompt_token_ids,
                                                               *o.output_token_ids]
                    and o is not r
                    for o in reqs
                ):  # fmt: skip
                    assert hit == depth, (r.request_id, hit, depth)
                    equal += 1
            drain()
    sched.cache.check_integrity()
    return equal, sched.cache.pool.num_evicted


def _resumable(batch):  # type: ignore[no-untyped-def]
    """`full` mode: the resumable stream its batches carry in their trailing field."""
    return type(batch)(batch.ts, batch.resumable_events or [])


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    policy=st.sampled_from(["limit", "lookahead", "junction"]),
    eagle=st.booleans(),
    small=st.booleans(),
)
def test_the_router_tree_is_where_requests_resume(
    seed: int, policy: str, eagle: bool, small: bool
) -> None:
    run_workload(seed, policy, eagle, 32 if small else None)


@pytest.mark.parametrize("policy", ["limit", "lookahead"])
@pytest.mark.parametrize("eagle", [True, False])
def test_equal_hits_and_evictions_are_exercised(policy: str, eagle: bool) -> None:
    """The sweep's control: across seeds, hits predicted exactly and a small pool evicting."""
    equal = evictions = 0
    for seed in range(6):
        e, _ = run_workload(seed, policy, eagle, None)
        _, ev = run_workload(seed, policy, eagle, 32)
        equal, evictions = equal + e, evictions + ev
    assert equal >= 3 and evictions > 0


def test_full_mode_carries_the_resumable_stream_and_per_group_events() -> None:
    run_workload(7, "limit", True, 32, mode="full")
    cfg = make_config(block_size=B, unit=U, policy="limit", max_model_len=160, budget=48)
    sched = Scheduler(cfg)
    log = KVEventLog(sched.cache, "full")
    ex = DryRunExecutor(num_speculative_tokens=3)
    sched.add_request(new_request(cfg, "a", tokens(random.Random(1), 70), 6))
    kinds: dict[int, set[str]] = {}
    stored: set[tuple[int, object]] = set()
    while sched.has_unfinished():
        out = sched.schedule()
        sched.update(out, ex.execute(out))
        batch = log.drain()
        assert batch is not None and batch.resumable_events is not None
        for e in batch.events:
            if isinstance(e, BlockStored):
                kinds.setdefault(e.group_idx, set()).add(e.kv_cache_spec_kind)  # type: ignore[arg-type]
                assert e.block_size == B and 0 < len(e.token_ids) <= B
                stored.update((e.group_idx, h) for h in e.block_hashes)  # type: ignore[misc]
            elif isinstance(e, BlockRemoved):
                assert all((e.group_idx, h) in stored for h in e.block_hashes)
    groups = cfg.cache.groups
    assert {g: k for g, k in kinds.items()} == {
        g: {"mamba" if groups[g] is GroupKind.SSM else "full_attention"} for g in kinds
    }
    assert len(kinds) == len(groups)


def test_the_design_picture() -> None:
    """docs/events.md's picture: states at 3u and 6u, attention through 8u: published 6u; a
    request leaving the path after u4 is overcounted (router 5u, engine 3u)."""
    cfg = make_config(block_size=U, unit=U, policy="tail", eagle=False, max_model_len=160)
    sched = Scheduler(cfg)
    log = KVEventLog(sched.cache)
    ex = DryRunExecutor()
    rng = random.Random(5)
    path = tokens(rng, 8 * U + 1, vocab=50)
    tree = EventTree()
    for n in (3 * U + 1, 6 * U + 1, 8 * U + 1):  # tail states at 3u, 6u (and 8u, then evicted)
        sched.add_request(new_request(cfg, f"r{n}", path[:n], 1))
        while sched.has_unfinished():
            out = sched.schedule()
            sched.update(out, ex.execute(out))
    tree.apply(log.drain())
    assert tree.depth(path) == 8 * U
    # evict the state at 8u alone: the attention stays, the depth falls to 6u
    ssm = next(g for g, k in enumerate(cfg.cache.groups) if k is GroupKind.SSM)
    _evict(sched, ssm, path, 8 * U)
    tree.apply(log.drain())
    assert tree.depth(path) == 6 * U
    leaver = path[: 5 * U] + [(t + 1) % 50 for t in path[5 * U : 6 * U]]
    probe = new_request(cfg, "p", [*leaver, 1], 1)
    assert tree.depth(leaver) == 5 * U and sched.cache.lookup(probe).resume_point == 3 * U
    assert len(log.published()) == 6


def _evict(sched: Scheduler, group: int, toks: list[int], position: int) -> None:
    """Evict the key of `toks` at `position` in `group` (the test's stand-in for pressure)."""
    from hycache.cache.block_pool import CacheKey

    req = new_request(sched.config, "x", toks, 1)
    pool = sched.cache.pool_for(group)
    block = pool.lookup(CacheKey(group, req.hashes.at(position)))
    assert block is not None and pool.ref_cnt[block] == 0
    pool.touch([block])
    pool._evict(block)
    pool.free([block])
