"""The CPU engine's families shape (`hycache bench --engine-shape family`) scheduled without the
engine: per arm, each request's resume point and the step of its first token, and the prefill
tokens computed before it (the same scheduler and cache as the engine; a dry-run executor, 0.7
acceptance). What the engine's TTFT p50 is made of, apart from the time each step takes
(docs/admission.md, "The CPU engine's families row").

    .venv/bin/python benchmarks/families_schedule.py
"""

from __future__ import annotations

import statistics

from hycache.bench.suite import EngineBench
from hycache.cache.boundaries import Boundaries
from hycache.config import (
    CacheConfig,
    HycacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.request import Request, SamplingParams
from hycache.sched.executor import DryRunExecutor
from hycache.sched.scheduler import Scheduler


def run(b: EngineBench, policy: str) -> None:
    cache = CacheConfig(
        b.knobs.replace(policy=policy),
        num_blocks=4000,
        max_model_len=b.shared_prefix_tokens + b.suffix_tokens + b.output_tokens + 16,
    )
    spec = SpeculativeConfig(num_speculative_tokens=b.num_speculative_tokens)
    cfg = HycacheConfig(cache, spec, SchedulerConfig(b.max_num_batched_tokens, b.concurrency))
    sched = Scheduler(cfg)
    ex = DryRunExecutor(num_speculative_tokens=b.num_speculative_tokens, acceptance_rate=0.7)
    lookahead = Boundaries.from_config(cache, spec).lookahead
    params = SamplingParams(max_tokens=b.output_tokens, ignore_eos=True)
    pending = [
        Request.new(f"r{i}", p, params, unit=cache.unit, lookahead=lookahead)
        for i, p in enumerate(b.prompts())
    ]
    reqs = list(pending)
    first: dict[str, int] = {}
    prefill = [0]  # prefill tokens computed up to the end of each step
    writes = [0]  # internal checkpoints written up to the end of each step
    while pending or sched.has_unfinished():
        while pending and len(sched.running) + len(sched.waiting) < b.concurrency:
            sched.add_request(pending.pop(0))
        out = sched.schedule()
        res = ex.execute(out)
        chunks = [s for s in out.scheduled if s.request.num_tokens - s.start > 1]
        prefill.append(prefill[-1] + sum(s.num_tokens for s in chunks))
        writes.append(writes[-1] + sum(len(s.alloc.states[0].writes) for s in chunks))
        sched.update(out, res)
        for s in out.scheduled:
            rid = s.request.request_id
            if rid not in first and s.request.num_output_tokens:
                first[rid] = len(prefill) - 1
    steps = [first[r.request_id] for r in reqs]
    before = sorted(prefill[k] for k in steps)
    print(f"{policy}:")
    print(f"  resume points      {[r.first_outcome.resume_point for r in reqs]}")
    print(f"  first-token step   {steps}  (p50 {statistics.median(steps)})")
    print(f"  prefill tokens before the first token, p50 {statistics.median(before):,.0f}")
    print(f"  prefill tokens in all {prefill[-1]:,}; internal checkpoints written {writes[-1]}")


def main() -> None:
    b = EngineBench(shape="family")
    for policy in ("lookahead", "limit"):
        run(b, policy)


if __name__ == "__main__":
    main()
