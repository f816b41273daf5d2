"""Scheduler mechanics: finishing, preemption order, draft accounting, budgets."""

from __future__ import annotations

import random

import pytest

from hycache.cache.block_pool import CacheKey
from hycache.cache.boundaries import Boundaries
from hycache.request import Request, RequestStatus, SamplingParams
from hycache.sched.executor import DryRunExecutor, run_to_completion
from hycache.sched.scheduler import Scheduler, StepResult
from tests.helpers import make_config, tokens


def req(cfg, rid: str, prompt: list[int], **sp: object) -> Request:  # type: ignore[no-untyped-def]
    return Request.new(
        rid,
        prompt,
        SamplingParams(**sp),
        unit=cfg.cache.unit,
        eos_token_ids=(7,),
        lookahead=Boundaries.from_config(cfg.cache, cfg.speculative).lookahead,
    )


def step(sched: Scheduler, results: dict[str, StepResult]) -> list[Request]:
    out = sched.schedule()
    return sched.update(out, results)


def test_stop_token_eos_and_max_tokens_finish_and_truncate_drafts() -> None:
    cfg = make_config(k=3)
    sched = Scheduler(cfg)
    a = req(cfg, "a", [1, 2, 3], max_tokens=10, stop_token_ids=(99,))
    b = req(cfg, "b", [1, 2, 4], max_tokens=10)
    c = req(cfg, "c", [1, 2, 5], max_tokens=2, ignore_eos=True)
    for r in (a, b, c):
        sched.add_request(r)
    step(sched, {r.request_id: StepResult([10], 0, [11, 99, 12]) for r in (a, b, c)})
    # a: accepts drafts 11 and 99 (its stop token) then a bonus; everything after 99 is dropped
    # b: emits EOS (7) among accepted drafts; c: ignores EOS but hits max_tokens
    done = step(
        sched,
        {
            "a": StepResult([11, 99, 12], 2),
            "b": StepResult([7, 8], 1),
            "c": StepResult([7, 8, 9], 2),
        },
    )
    assert {r.request_id for r in done} == {"a", "b", "c"}
    assert a.output_token_ids == [10, 11, 99] and a.status is RequestStatus.FINISHED_STOPPED
    assert b.output_token_ids == [10, 7] and b.status is RequestStatus.FINISHED_STOPPED
    assert c.output_token_ids == [10, 7] and c.status is RequestStatus.FINISHED_LENGTH
    assert sched.cache.pool.num_free == cfg.cache.num_blocks - 1


def test_the_newest_running_request_is_preempted_and_requeued_first() -> None:
    cfg = make_config(block_size=16, unit=4, max_model_len=64, num_blocks=14, eagle=False)
    sched = Scheduler(cfg)
    rng = random.Random(0)
    reqs = [req(cfg, f"r{i}", tokens(rng, 30), max_tokens=30, ignore_eos=True) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    ex = DryRunExecutor()
    preempted: list[str] = []
    while sched.has_unfinished():
        out = sched.schedule()
        preempted += out.preempted
        if out.preempted:
            assert sched.waiting[0].request_id == out.preempted[-1]
        sched.update(out, ex.execute(out))
        sched.cache.check_integrity()
    assert preempted and preempted[0] == "r2"  # the newest goes first
    assert all(r.num_output_tokens == 30 for r in reqs)
    assert [r.output_token_ids for r in reqs] == [
        [ex.token(r.request_id, 30 + i) for i in range(30)] for r in reqs
    ]  # replaying after preemption regenerates the same outputs


def test_only_verified_tokens_are_published() -> None:
    cfg = make_config(block_size=16, unit=4, k=3)
    sched = Scheduler(cfg)
    r = req(cfg, "r", list(range(1, 15)), max_tokens=20, ignore_eos=True)  # 14 tokens
    sched.add_request(r)
    while not r.output_token_ids:  # prefill (chunked at the tail checkpoint): 15 tokens known
        step(sched, {"r": StepResult([100], 0, [101, 102, 103])})
    out = sched.schedule()
    (s,) = out.scheduled
    assert s.num_tokens == 1 and s.draft_token_ids == [101, 102, 103]
    assert len(s.alloc.block_tables[0]) * 16 >= s.end + 3  # lookahead slots for the drafts
    sched.update(out, {"r": StepResult([55], 0, [1, 2, 3])})  # every draft rejected
    assert r.num_computed_tokens == 15 and r.output_token_ids == [100, 55]
    # the block [0, 16) holds 15 verified rows and one draft row: it must not be keyed
    key = CacheKey(0, r.hashes.at(16))
    assert sched.cache.pool.lookup(key) is None


def test_budget_is_shared_by_decodes_and_prefill_chunks() -> None:
    cfg = make_config(block_size=16, unit=4, k=0, budget=32)
    sched = Scheduler(cfg)
    rng = random.Random(1)
    sched.add_request(req(cfg, "long", tokens(rng, 100), max_tokens=3))
    sched.add_request(req(cfg, "short", tokens(rng, 5), max_tokens=3))
    ex = DryRunExecutor()
    while sched.has_unfinished():
        out = sched.schedule()
        assert out.num_batched_tokens <= 32
        sched.update(out, ex.execute(out))
    assert run_to_completion(sched, ex) == 0


def test_a_request_larger_than_the_cache_fails_loudly_instead_of_spinning() -> None:
    cfg = make_config(block_size=16, unit=4, max_model_len=64, num_blocks=14, eagle=False)
    sched = Scheduler(cfg)
    sched.add_request(req(cfg, "huge", list(range(1, 400)), max_tokens=1))
    with pytest.raises(RuntimeError, match="cannot be scheduled"):
        run_to_completion(sched, DryRunExecutor())


def test_without_prefix_caching_prefill_is_one_pass_per_budget() -> None:
    """Nothing is kept, so no checkpoint stop splits the prefill (issue #11: 512 tokens ran as
    448 / 48 / 16)."""
    from tests.helpers import make_config, run_sequential

    cfg = make_config(block_size=64, unit=16, prefix_caching=False, budget=8192)
    sched, _ = run_sequential(cfg, [list(range(1, 513))])
    ends = [end for _, end, _ in sched.recorder.chunks["r0"]]  # type: ignore[attr-defined]
    assert ends[0] == 512
    cfg = make_config(block_size=64, unit=16, prefix_caching=False, budget=200)
    sched, _ = run_sequential(cfg, [list(range(1, 513))])
    assert [end for _, end, _ in sched.recorder.chunks["r0"]][:3] == [200, 400, 512]  # type: ignore[attr-defined]
