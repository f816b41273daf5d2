"""`Scheduler.finish` / `LLM.finish`: ending a request from outside the step (a stop string the
server found), freeing what it holds exactly as a finish inside `update` does."""

from __future__ import annotations

import random

import pytest

from hycache.engine.engine import LLM
from hycache.request import RequestStatus, SamplingParams
from hycache.sched.executor import DryRunExecutor
from hycache.sched.scheduler import Scheduler
from tests.helpers import make_config, new_request, tokens


def drive(sched: Scheduler, executor: DryRunExecutor, steps: int) -> None:
    for _ in range(steps):
        out = sched.schedule()
        sched.update(out, executor.execute(out))


def ref_counts(sched: Scheduler) -> list[list[int]]:
    return [list(pool.ref_cnt) for pool in sched.cache.pools]


def test_finish_frees_a_running_request_like_a_normal_finish() -> None:
    cfg = make_config(k=0, eagle=False)
    sched = Scheduler(cfg)
    executor = DryRunExecutor()
    start = ref_counts(sched)
    free = [pool.num_free for pool in sched.cache.pools]
    rng = random.Random(0)
    req = new_request(cfg, "r", tokens(rng, 100), max_tokens=50)
    sched.add_request(req)
    drive(sched, executor, 3)
    assert req.status is RequestStatus.RUNNING and req.num_output_tokens > 0
    assert ref_counts(sched) != start
    assert sched.finish("r", RequestStatus.FINISHED_STOPPED) is req
    assert req.status is RequestStatus.FINISHED_STOPPED
    assert not sched.has_unfinished() and list(sched.finished) == [req]
    assert ref_counts(sched) == start
    assert [pool.num_free for pool in sched.cache.pools] == free
    sched.cache.check_integrity()


def test_finish_takes_a_waiting_request_and_refuses_unknown_ids_and_statuses() -> None:
    cfg = make_config(k=0, eagle=False)
    sched = Scheduler(cfg)
    req = new_request(cfg, "w", tokens(random.Random(1), 40))
    sched.add_request(req)
    with pytest.raises(ValueError, match="not a finished status"):
        sched.finish("w", RequestStatus.RUNNING)
    sched.finish("w", RequestStatus.FINISHED_ABORTED)
    assert not sched.waiting and req.status is RequestStatus.FINISHED_ABORTED
    with pytest.raises(KeyError, match="no unfinished request 'w'"):
        sched.finish("w", RequestStatus.FINISHED_STOPPED)  # already finished
    with pytest.raises(KeyError):
        sched.finish("nobody", RequestStatus.FINISHED_STOPPED)
    assert sched.abort("nobody") is False  # abort stays a no-op for unknown ids


def test_llm_finish_reports_the_reason_counts_the_kept_tokens_and_frees() -> None:
    llm = LLM("tiny", block_size=64, prefix_match_unit=16, num_blocks=64, max_model_len=512)
    start = ref_counts(llm.scheduler)
    rid = llm.add_request(list(range(1, 80)), SamplingParams(max_tokens=20, logprobs=1))
    while llm.scheduler.has_unfinished():
        events = llm.step()
        if any(e.new_token_ids for e in events) and llm.stats.generated_tokens >= 4:
            break
    made = llm.stats.generated_tokens
    out = llm.finish(rid, RequestStatus.FINISHED_STOPPED, num_output_tokens=2)
    assert out.finish_reason == "stop" and len(out.token_ids) == 2
    assert out.logprobs is not None and len(out.logprobs) == 2
    assert out.text is None  # no tokenizer
    assert (llm.stats.requests, llm.stats.output_tokens) == (1, 2)
    assert llm.stats.generated_tokens == made  # what was computed stays counted
    assert not llm.scheduler.has_unfinished() and ref_counts(llm.scheduler) == start
    assert not llm.scheduler.finished  # the engine keeps no finished requests
    with pytest.raises(KeyError):
        llm.finish(rid)
