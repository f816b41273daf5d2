"""Simulator speed at the seed's scale: 1,000 requests of 64,016-token prompts (57,600 shared),
concurrency 64, B=4416, u=64, k=3 — dry run (fixed step clock) and roofline (bamba-9b on H200),
for the baseline `lookahead` (vLLM's default EAGLE setup) and `limit`.

    .venv/bin/python benchmarks/bench_simulate.py [--num-requests N]
"""

from __future__ import annotations

import argparse
import time

from hycache.config import (
    CacheConfig,
    CacheKnobs,
    HycacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.sim.costmodel import CostModel
from hycache.sim.presets import load_gpu, load_model_spec
from hycache.sim.simulator import Simulator
from hycache.sim.workloads import system_prompt_workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--output-tokens", type=int, default=256)
    args = ap.parse_args()
    w = system_prompt_workload(args.num_requests, 57_600, 6_416, args.output_tokens, seed=0)
    cost = CostModel(
        load_model_spec("bamba-9b"),
        load_gpu("h200"),
        speculative=True,
        num_speculative_tokens=3,
        block_size=4416,
    )
    for label, cm in (("dry run", None), ("roofline", cost)):
        for policy in ("lookahead", "limit"):
            cfg = HycacheConfig(
                CacheConfig(
                    CacheKnobs(block_size=4416, prefix_match_unit=64, policy=policy),
                    num_blocks=cost.num_blocks(4416),
                    max_model_len=64_016 + args.output_tokens + 8,
                ),
                SpeculativeConfig(num_speculative_tokens=3),
                SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=64),
            )
            t0 = time.perf_counter()
            res = Simulator(cfg, cost=cm).run(w, concurrency=64)
            wall = time.perf_counter() - t0
            s = res.summary
            print(
                f"{label:8s} {policy:9s} wall {wall:6.1f} s   simulated {s['makespan_s']:8.1f} s"
                f"   out tok/s {s['output_tokens_per_s']:9.0f}   hit rate {s['token_hit_rate']:.3f}"
            )


if __name__ == "__main__":
    main()
