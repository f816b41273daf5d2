"""Cache-core timings: hashing a 64k-token prompt, and the cache lookup of one.

    .venv/bin/python benchmarks/bench_cache.py

Prints the median of repeated runs (the machines here are noisy; medians are stabler).
"""

from __future__ import annotations

import random
import statistics
import time

from hycache.config import (
    CacheConfig,
    CacheKnobs,
    HycacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.hashing import PrefixHashes
from hycache.request import Request, SamplingParams
from hycache.sched.executor import DryRunExecutor, run_to_completion
from hycache.sched.scheduler import Scheduler

T, B, U = 64_016, 4416, 64


def median_ms(fn, repeat: int = 30) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(128_000) for _ in range(T)]

    def hash_prompt() -> None:
        PrefixHashes(U, seed=0).extend(prompt)

    print(f"hash a {T:,}-token prompt (u={U}):       {median_ms(hash_prompt):7.2f} ms")

    cfg = HycacheConfig(
        CacheConfig(
            CacheKnobs(block_size=B, prefix_match_unit=U), num_blocks=64, max_model_len=70_000
        ),
        SpeculativeConfig(num_speculative_tokens=3),
        SchedulerConfig(max_num_batched_tokens=8192),
    )
    sched = Scheduler(cfg)
    producer = Request.new("p", prompt, SamplingParams(max_tokens=2, ignore_eos=True), unit=U)
    sched.add_request(producer)
    run_to_completion(sched, DryRunExecutor(num_speculative_tokens=3))
    shared = prompt[:57_600] + [rng.randrange(128_000) for _ in range(T - 57_600)]
    sibling = Request.new("s", shared, SamplingParams(), unit=U)
    resend = Request.new("r", prompt, SamplingParams(), unit=U)
    for name, req in (("identical resend", resend), ("sibling (57,600 shared)", sibling)):
        hit = sched.cache.lookup(req)
        ms = median_ms(lambda r=req: sched.cache.lookup(r), repeat=200)
        print(f"lookup, {name:24s} {ms:7.3f} ms  (resume {hit.resume_point:,})")


if __name__ == "__main__":
    main()
