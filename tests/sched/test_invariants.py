"""Scheduler ⇔ cache invariants, swept and property-based."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hycache.config import POLICY_NAMES, HycacheConfig
from hycache.request import Request
from hycache.sched.executor import run_to_completion
from hycache.sched.scheduler import Scheduler
from tests.helpers import RecordingExecutor, make_config, new_request, run_sequential, tokens
from tests.sched.conftest import check_step

GEOMETRIES = [(b, u) for b in (16, 128, 512) for u in (4, 32) if u < b]


def chunks(sched: Scheduler, rid: str) -> list[tuple[int, int, bool]]:
    return sched.recorder.chunks[rid]  # type: ignore[attr-defined]


def chunk_ends(sched: Scheduler, rid: str) -> list[tuple[int, int]]:
    return [(start, end) for start, end, _ in chunks(sched, rid)]


def written(sched: Scheduler, rid: str) -> list[int]:
    """Where the forward wrote a checkpoint for `rid`: chunk ends, and inside chunks."""
    return sched.recorder.written[rid]  # type: ignore[attr-defined]


@pytest.mark.parametrize("internal", [True, False])
@pytest.mark.parametrize("policy", ["junction", "limit"])
def test_every_junction_stop_is_checkpointed_and_the_next_sibling_resumes_there(
    policy: str, internal: bool
) -> None:
    """A position the policy keeps is a position the forward writes: at a chunk end when the
    prefill splits there, inside the chunk with internal checkpoints."""
    cases = 0
    for b, u in GEOMETRIES:
        for t in (2 * b - u, 3 * b + u + 1, 4 * b - 1):
            for shared in sorted({b + u, 2 * b - u + 1, t // 2, t - 3 * u, 2 * b + 1}):
                if not 0 < shared < t:
                    continue
                cfg = make_config(
                    block_size=b,
                    unit=u,
                    policy=policy,
                    max_model_len=4 * b,
                    budget=4 * b,
                    internal_checkpoints=internal,
                )
                rng = random.Random(b * 7 + t + shared)
                prefix = tokens(rng, shared)
                prompts = [prefix + tokens(rng, t - shared) for _ in range(3)]
                sched, (_, s1, s2) = run_sequential(cfg, prompts)
                ends = {end for _, end, _ in chunks(sched, "r1")}
                for stop in s1.junction_stops:
                    assert stop <= s1.num_prompt_tokens and stop in written(sched, "r1"), (
                        b,
                        u,
                        t,
                        shared,
                        stop,
                    )
                    # split at only without internal checkpoints (the prompt's end aside)
                    assert (stop in ends) == (not internal or stop == s1.num_prompt_tokens)
                # (`limit` with internal checkpoints may keep the drop scheme's junction with
                # no junction observed: `Boundaries.drop_junction_stops`)
                if s1.junction_stops and s1.outcome.junction:
                    j = s1.outcome.junction
                    assert s2.first_hit_tokens == max(x for x in s1.junction_stops if x <= j)
                    cases += 1
    assert cases > 20


def random_prompts(seed: int, n: int, b: int) -> list[list[int]]:
    """Sharing shapes: system prompt + suffix, identical resend, longer sibling, shorter one."""
    rng = random.Random(seed)
    roots = [tokens(rng, rng.randrange(b, 5 * b)) for _ in range(3)]
    out: list[list[int]] = []
    for _ in range(n):
        shape = rng.randrange(4)
        if shape == 0 or not out:
            root = rng.choice(roots)
            out.append(
                root[: rng.randrange(1, len(root) + 1)] + tokens(rng, rng.randrange(1, 2 * b))
            )
        elif shape == 1:
            out.append(list(rng.choice(out)))
        elif shape == 2:
            out.append(rng.choice(out) + tokens(rng, rng.randrange(1, 2 * b)))
        else:
            p = rng.choice(out)
            out.append(p[: rng.randrange(1, len(p) + 1)] + tokens(rng, rng.randrange(1, b)))
    return out


def cfg_for(
    b: int, u: int, policy: str, eagle: bool = True, internal: bool = True
) -> HycacheConfig:
    return make_config(
        block_size=b,
        unit=u,
        policy=policy,
        eagle=eagle,
        max_model_len=16 * b,
        budget=3 * b,
        num_blocks=4096,
        internal_checkpoints=internal,
    )


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    geo=st.sampled_from([(16, 4), (32, 8), (64, 4)]),
    pair=st.sampled_from([("replay", "junction"), ("lookahead", "limit")]),
    eagle=st.booleans(),
)
def test_the_finer_policy_never_resumes_lower(
    seed: int, geo: tuple[int, int], pair: tuple[str, str], eagle: bool
) -> None:
    """Per request, on random sharing shapes: `junction` >= `replay`, `limit` >= `lookahead`."""
    b, u = geo
    base, finer = pair
    prompts = random_prompts(seed, 12, b)
    _, lo = run_sequential(cfg_for(b, u, base, eagle), prompts)
    _, hi = run_sequential(cfg_for(b, u, finer, eagle), prompts)
    for r, j in zip(lo, hi, strict=True):
        assert j.first_hit_tokens >= r.first_hit_tokens, (r.request_id, prompts)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), hinted=st.booleans())
def test_limit_resumes_every_sibling_at_the_limit_of_its_family(seed: int, hinted: bool) -> None:
    """Families with random shared-prefix lengths, interleaved: from the third member of a
    family on (the second observes the junction; with a hint, from the second on), every
    request resumes at least at floor((P-1)/u)*u."""
    b, u = 32, 8
    rng = random.Random(seed)
    fams = [(tokens(rng, rng.randrange(u + 1, 6 * b))) for _ in range(3)]
    order = [rng.randrange(3) for _ in range(10)]
    prompts = [fams[f] + tokens(rng, rng.randrange(1, 2 * b)) for f in order]
    c = cfg_for(b, u, "limit")
    sched = Scheduler(c)
    ex = RecordingExecutor(num_speculative_tokens=3)
    seen = [0, 0, 0]
    for i, (f, p) in enumerate(zip(order, prompts, strict=True)):
        hints = [len(fams[f])] if hinted else []
        r = new_request(c, f"r{i}", p, prefix_hints=hints)
        sched.add_request(r)
        run_to_completion(sched, ex, check=True)
        if seen[f] >= (1 if hinted else 2):
            assert r.first_hit_tokens >= sched.bounds.limit(len(fams[f])), (seed, i)
        seen[f] += 1


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), inert=st.sampled_from(["no-eagle", "unit-is-block"]))
def test_junction_is_inert_without_a_unit_or_a_drafter(seed: int, inert: str) -> None:
    b = 16
    u = b if inert == "unit-is-block" else 4
    eagle = inert != "no-eagle"
    prompts = random_prompts(seed, 10, b)
    s_rep, rep = run_sequential(cfg_for(b, u, "replay", eagle), prompts)
    s_jun, jun = run_sequential(cfg_for(b, u, "junction", eagle), prompts)
    for r, j in zip(rep, jun, strict=True):
        assert j.first_hit_tokens == r.first_hit_tokens
        assert chunk_ends(s_jun, j.request_id) == chunk_ends(s_rep, r.request_id)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_limit_is_inert_when_the_unit_is_the_block(seed: int) -> None:
    b = 16
    prompts = random_prompts(seed, 10, b)
    s_look, look = run_sequential(cfg_for(b, b, "lookahead"), prompts)
    s_lim, lim = run_sequential(cfg_for(b, b, "limit"), prompts)
    for r, j in zip(look, lim, strict=True):
        assert j.first_hit_tokens == r.first_hit_tokens
        assert chunk_ends(s_lim, j.request_id) == chunk_ends(s_look, r.request_id)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    pair=st.sampled_from([("replay", "junction"), ("lookahead", "limit")]),
    internal=st.booleans(),
)
def test_junction_costs_at_most_two_prefill_steps_and_nothing_without_a_junction(
    seed: int, pair: tuple[str, str], internal: bool
) -> None:
    """Splitting at checkpoints: a junction costs at most two extra prefill steps, nothing
    without one. Writing them inside the forward: no extra step ever (`replay` and
    `junction` then chunk alike; `limit` never more than `lookahead`, which keeps vLLM's
    splits)."""
    b, u = 16, 4
    prompts = random_prompts(seed, 12, b)
    s_rep, rep = run_sequential(cfg_for(b, u, pair[0], internal=internal), prompts)
    s_jun, jun = run_sequential(cfg_for(b, u, pair[1], internal=internal), prompts)
    for r, j in zip(rep, jun, strict=True):
        if r.first_hit_tokens != j.first_hit_tokens:
            continue  # a different resume point is a different request to chunk
        if internal:
            assert j.num_checkpoint_splits == 0  # every checkpoint written inside a chunk
            assert j.num_prefill_steps <= r.num_prefill_steps
            if pair[0] == "replay":
                assert chunk_ends(s_jun, j.request_id) == chunk_ends(s_rep, r.request_id)
            continue
        if not j.outcome.junction and not r.outcome.junction:
            assert chunk_ends(s_jun, j.request_id) == chunk_ends(s_rep, r.request_id)
        assert j.num_prefill_steps <= r.num_prefill_steps + 2
        extra = j.num_prefill_steps - r.num_prefill_steps  # sequential: the stops alone
        assert extra <= j.num_checkpoint_splits - r.num_checkpoint_splits




@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    policy=st.sampled_from(POLICY_NAMES),
    num_blocks=st.integers(12, 60),
    aborts=st.integers(0, 3),
)
def test_concurrent_random_workload_keeps_the_cache_sound(
    seed: int, policy: str, num_blocks: int, aborts: int
) -> None:
    """Many requests at once, a small pool (preemptions), aborts mixed in: integrity after every
    step, nothing published past the prompt or on a running block, nothing leaked at the end."""
    b, u = 16, 4
    cfg = make_config(
        block_size=b,
        unit=u,
        policy=policy,
        max_model_len=6 * b,
        budget=4 * b,
        num_blocks=num_blocks,
        max_num_seqs=8,
    )
    sched = Scheduler(cfg)
    ex = RecordingExecutor(num_speculative_tokens=3, acceptance_rate=0.6, seed=seed)
    rng = random.Random(seed)
    prompts = [p[: 5 * b - 1] for p in random_prompts(seed, 16, b)]
    reqs: list[Request] = []
    for i, p in enumerate(prompts):
        r = new_request(cfg, f"q{i}", p, max_tokens=rng.randrange(1, 12))
        reqs.append(r)
        sched.add_request(r)
    abort_at = {rng.randrange(1, 40): rng.choice(reqs).request_id for _ in range(aborts)}
    steps = 0
    while sched.has_unfinished():
        if steps in abort_at:
            sched.abort(abort_at[steps])
        out = sched.schedule()
        sched.update(out, ex.execute(out))
        check_step(sched, out)
        steps += 1
        assert steps < 5000
    assert all(r.status.finished for r in reqs)
    assert sched.cache.num_live_requests == 0
    assert sched.cache.pool.num_free == cfg.cache.num_blocks - 1
    for r in reqs:
        if r.status.value == "finished_length":
            assert r.num_output_tokens == r.sampling.max_tokens
            assert r.output_token_ids == [
                ex.token(r.request_id, r.num_prompt_tokens + i) for i in range(r.num_output_tokens)
            ]
