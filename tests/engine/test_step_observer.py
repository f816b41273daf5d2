"""The engine's step observer: the bench's window onto each step's schedule (no side-channel
attribute on `LLM`)."""

from __future__ import annotations

import pytest

from hycache.config import CacheKnobs, Policy
from hycache.engine.engine import LLM
from hycache.request import SamplingParams
from hycache.sched.scheduler import SchedulerOutput

SMALL = {"max_model_len": 256, "num_blocks": 96, "num_speculative_tokens": 2}


def test_the_observer_sees_every_steps_schedule() -> None:
    llm = LLM("tiny", knobs=CacheKnobs(16, 4), **SMALL)  # type: ignore[arg-type]
    assert not hasattr(llm, "last_schedule")
    seen: list[SchedulerOutput] = []
    llm.add_step_observer(seen.append)
    prompts = [list(range(1, 60)), [*range(1, 40), 7, 8]]
    ids = llm.add_requests(prompts, SamplingParams(max_tokens=5, ignore_eos=True))
    steps = 0
    tokens: dict[str, int] = {}
    finished: set[str] = set()
    while finished != set(ids):
        events = llm.step()
        finished |= {e.request_id for e in events if e.finished}
        steps += 1
        assert len(seen) == steps  # one call per step, after it ran
        scheduled = {s.request.request_id for s in seen[-1].scheduled}
        assert {e.request_id for e in events if e.new_token_ids} <= scheduled
        for e in events:
            tokens[e.request_id] = tokens.get(e.request_id, 0) + len(e.new_token_ids)
        if steps > 200:
            pytest.fail("the requests did not finish")
    assert llm.stats.steps == steps == len(seen)
    assert tokens == dict.fromkeys(ids, 5)
    llm.remove_step_observer(seen.append)
    llm.generate([[3, 4, 5]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(seen) == steps  # removed: not called again


def test_knobs_and_overrides_reach_the_config() -> None:
    """`LLM(knobs=...)` and keyword overrides of either the knobs or the engine options;
    `admission` reaches the engine's cache too; an unknown name is a TypeError."""
    knobs = CacheKnobs(16, 4, policy="replay", admission=False)
    llm = LLM("tiny", knobs=knobs, policy="junction", **SMALL)  # type: ignore[arg-type]
    cache = llm.config.cache
    assert cache.knobs == knobs.replace(policy=Policy.JUNCTION)
    assert (cache.block_size, cache.unit, cache.admission) == (16, 4, False)
    assert llm.config.speculative.num_speculative_tokens == 2
    with pytest.raises(TypeError, match="block_sizes"):
        LLM("tiny", block_sizes=16)
    with pytest.raises(ValueError, match=r"^prefix_match_unit"):
        LLM("tiny", block_size=16, prefix_match_unit=5)
