"""The scheduler tests' shared check: `check_step`, the invariants after every step."""

from __future__ import annotations

from hycache.sched.scheduler import Scheduler


def check_step(sched: Scheduler, out) -> None:  # type: ignore[no-untyped-def]
    """After every step: integrity; no checkpoint past the prompt; the running block unkeyed."""
    sched.cache.check_integrity()
    pool = sched.cache.pool
    for s in out.scheduled:
        if s.alloc.checkpoint:
            assert s.end <= s.request.num_prompt_tokens
            assert s.num_tokens > 1 or s.end <= s.request.num_prompt_tokens
    for m in sched.cache.ssm:
        for st_ in m._states.values():
            if st_.running is not None:
                assert not pool.keys[st_.running], "the running state block was published"
