"""Per-step results travel in `StepResult`: the sampled tokens' logprobs, and the executor's
verdict on which of them the request keeps (`Request.accept_tokens`), applied by the scheduler
without deciding again."""

from __future__ import annotations

from hycache.request import RequestStatus, SamplingParams, TokenLogprob
from hycache.sched.scheduler import Scheduler, StepResult
from tests.helpers import make_config, new_request


def lps(*ids: int) -> list[TokenLogprob]:
    return [TokenLogprob(t, -float(t)) for t in ids]


def test_logprobs_are_kept_with_the_tokens_a_truncation_cuts_both() -> None:
    cfg = make_config(k=3)
    sched = Scheduler(cfg)
    req = new_request(cfg, "r", list(range(1, 20)), max_tokens=3)
    req.sampling = SamplingParams(max_tokens=3, logprobs=0)
    sched.add_request(req)
    out = sched.schedule()
    sched.update(out, {"r": StepResult([10], 0, [11, 12, 13], logprobs=lps(10))})
    out = sched.schedule()
    done = sched.update(out, {"r": StepResult([11, 12, 13, 14], 3, logprobs=lps(11, 12, 13, 14))})
    assert done == [req] and req.output_token_ids == [10, 11, 12]  # max_tokens cut two
    assert req.output_logprobs == lps(10, 11, 12)


def test_the_executors_verdict_is_applied_as_given() -> None:
    cfg = make_config(k=0, eagle=False)
    sched = Scheduler(cfg)
    req = new_request(cfg, "r", list(range(1, 20)), max_tokens=8)
    sched.add_request(req)
    out = sched.schedule()
    verdict = ([10], RequestStatus.FINISHED_STOPPED)  # e.g. a stop token only it knew of
    done = sched.update(out, {"r": StepResult([10], verdict=verdict)})
    assert done == [req] and req.status is RequestStatus.FINISHED_STOPPED
    assert req.output_token_ids == [10] and req.output_logprobs == []
