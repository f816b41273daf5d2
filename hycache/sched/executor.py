"""The executor interface, and the dry-run executor that serves the simulator and the tests.

An executor runs one `SchedulerOutput` (block copies first, then the forward) and answers a
`StepResult` per request. The real model runner implements the same interface.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import xxhash

from hycache.sched.scheduler import Scheduler, SchedulerOutput, StepResult


class Executor(Protocol):
    def execute(self, out: SchedulerOutput) -> dict[str, StepResult]: ...


class DryRunExecutor:
    """Deterministic tokens without a model.

    The token at position p of request r is a fixed function of (seed, r, p), so a replay after
    preemption regenerates the same outputs. Each draft is accepted with probability
    `acceptance_rate`, in a row (the first rejection ends acceptance), drawn from a generator
    seeded by (seed, r, p): the same request gets the same acceptances in every run and policy.

    `accepted`: acceptances a real engine recorded, replayed instead of drawn (a trace, as
    output lengths are): per request id, the drafts accepted at the step that found the
    request with that many output tokens (at most the drafts offered). A step with no record
    draws at `acceptance_rate`.
    """

    def __init__(
        self,
        *,
        vocab_size: int = 32000,
        num_speculative_tokens: int = 0,
        acceptance_rate: float = 0.7,
        seed: int = 0,
        avoid_token: int | None = None,
        accepted: Mapping[str, Mapping[int, int]] | None = None,
    ) -> None:
        self.vocab_size = vocab_size
        self.k = num_speculative_tokens
        self.acceptance_rate = acceptance_rate
        self.seed = seed
        self.avoid_token = avoid_token
        self.accepted = accepted or {}
        self.block_copies = 0

    def token(self, request_id: str, position: int) -> int:
        h = xxhash.xxh64_intdigest(f"{request_id}:{position}".encode(), self.seed)
        t = h % self.vocab_size
        if t == self.avoid_token:
            t = (t + 1) % self.vocab_size
        return t

    def _accepted(self, request_id: str, position: int, num_drafts: int) -> int:
        j = 0
        while j < num_drafts:
            h = xxhash.xxh64_intdigest(f"a:{request_id}:{position}:{j}".encode(), self.seed)
            if h / 2.0**64 >= self.acceptance_rate:
                break
            j += 1
        return j

    def execute(self, out: SchedulerOutput) -> dict[str, StepResult]:
        self.block_copies += len(out.block_copies)
        results: dict[str, StepResult] = {}
        for s in out.scheduled:
            if not s.samples:
                results[s.request.request_id] = StepResult([])
                continue
            rid, end = s.request.request_id, s.end
            n = len(s.draft_token_ids)
            record = self.accepted.get(rid, {}).get(s.request.num_output_tokens)
            j = min(record, n) if record is not None else self._accepted(rid, end, n)
            sampled = [self.token(rid, end + i) for i in range(j + 1)]
            nxt = end + j + 1
            drafts = [self.token(rid, nxt + i) for i in range(self.k)]
            results[rid] = StepResult(sampled, j, drafts)
        return results


def run_to_completion(
    scheduler: Scheduler, executor: Executor, *, check: bool = False, max_steps: int = 1_000_000
) -> int:
    """Step `scheduler` with `executor` until no request is left; returns the step count.
    With `check`, the cache integrity check runs after every step."""
    steps = 0
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        scheduler.update(out, executor.execute(out))
        if check:
            scheduler.cache.check_integrity()
        steps += 1
        if steps >= max_steps:
            raise RuntimeError(f"no progress after {max_steps} steps")
    return steps
