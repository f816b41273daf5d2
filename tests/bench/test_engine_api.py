"""What the bench and the server read of the engine (`LLM.has_unfinished`, `unfinished_ids`,
`running`, `num_preemptions`, `used_blocks`, `copy_blocks`, `copy_state_slots`): each agrees
with the scheduler and cache it reads, step by step, and the copies move exactly the bytes
they name."""

from __future__ import annotations

import torch

from hycache.engine.engine import LLM
from hycache.request import SamplingParams

VOCAB = 512  # the tiny preset


def _prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31 + 1) % VOCAB for i in range(n)]


def _llm(**kw: object) -> LLM:
    args: dict[str, object] = {
        "block_size": 16,
        "prefix_match_unit": 4,
        "num_blocks": 64,
        "max_model_len": 256,
        "max_num_batched_tokens": 48,
        "max_num_seqs": 2,
        "num_speculative_tokens": 2,
    }
    return LLM("tiny", **(args | kw))


def test_the_readings_follow_the_scheduler_step_by_step() -> None:
    llm = _llm()
    assert not llm.has_unfinished() and llm.unfinished_ids() == [] and llm.running() == []
    assert llm.used_blocks == 0
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    ids = [llm.add_request(_prompt(i, 40 + 10 * i), sp) for i in range(3)]
    assert llm.has_unfinished() and llm.unfinished_ids() == ids  # all waiting, arrival order
    seen_prefill = seen_decode = False
    while llm.has_unfinished():
        llm.step()
        sched = llm.scheduler
        running = llm.running()
        assert [r.request_id for r in running] == [r.request_id for r in sched.running]
        for view, req in zip(running, sched.running, strict=True):
            assert view.num_computed_tokens == req.num_computed_tokens
            assert view.num_prompt_tokens == req.num_prompt_tokens
            assert view.prefilled == (req.num_computed_tokens >= req.num_prompt_tokens)
            seen_prefill |= not view.prefilled
            seen_decode |= view.prefilled
        assert llm.unfinished_ids() == sched.unfinished_ids()
        assert llm.used_blocks == llm.snapshot().cache.used_blocks
        assert llm.num_preemptions == sched.num_preemptions
    assert seen_prefill and seen_decode  # 48-token chunks: prompts of 40-60 take two steps
    assert llm.used_blocks == 0 and llm.unfinished_ids() == []


def test_a_view_is_a_copy() -> None:
    llm = _llm()
    llm.add_request(_prompt(0, 60), SamplingParams(max_tokens=4, ignore_eos=True))
    llm.step()
    before = llm.running()
    llm.step()
    assert before[0].num_computed_tokens < llm.running()[0].num_computed_tokens


def test_the_copies_move_the_named_blocks_and_slots_only() -> None:
    llm = _llm()
    runner = llm.runner
    assert runner.kv is not None and runner.draft_kv is not None and runner.states is not None
    for t in (runner.kv.kv, runner.draft_kv.kv, runner.states.conv, runner.states.ssm):
        t.copy_(torch.randn_like(t))
    kv, draft = runner.kv.kv.clone(), runner.draft_kv.kv.clone()
    conv, ssm = runner.states.conv.clone(), runner.states.ssm.clone()
    llm.copy_blocks([(1, 2), (3, 4)])
    for new, old in ((runner.kv.kv, kv), (runner.draft_kv.kv, draft)):
        expect = old.clone()
        expect[:, :, 2], expect[:, :, 4] = old[:, :, 1], old[:, :, 3]
        assert torch.equal(new, expect)
    assert torch.equal(runner.states.conv, conv) and torch.equal(runner.states.ssm, ssm)
    llm.copy_state_slots([(0, 1)])
    for new, old in ((runner.states.conv, conv), (runner.states.ssm, ssm)):
        expect = old.clone()
        expect[:, 1] = old[:, 0]
        assert torch.equal(new, expect)
