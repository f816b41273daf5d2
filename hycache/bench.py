"""`hycache bench`: the seed's comparison, side by side, on the real CPU engine and simulated.

1. engine: the real engine (`tiny`, EAGLE drafter on) on a scaled system-prompt workload,
   one policy after the other in the same run, closed loop at a fixed concurrency;
2. simulated: the simulator at the seed's scale (57,600 + 6,416 tokens, B=4416, u=64,
   concurrency 64, k=3) for tail / replay / junction, plus the multi-turn and trace workloads
   for replay / junction.

Every result has the `{"policies": {name: metrics}}` shape, with the inputs beside it.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hycache.config import CacheConfig, GroupKind, HycacheConfig, SchedulerConfig, SpeculativeConfig
from hycache.engine.engine import LLM, RequestOutput
from hycache.request import SamplingParams
from hycache.sim.compare import Workload, compare_policies, policies_json
from hycache.sim.costmodel import CostModel
from hycache.sim.presets import load_gpu, load_model_spec
from hycache.sim.trace import generate_mooncake_like, requests_from_records
from hycache.sim.workloads import multi_turn_workload, system_prompt_workload

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EngineBench:
    block_size: int = 552
    prefix_match_unit: int = 8
    shared_prefix_tokens: int = 7_200
    suffix_tokens: int = 802
    output_tokens: int = 32
    num_requests: int = 40
    concurrency: int = 8
    num_speculative_tokens: int = 2
    max_num_batched_tokens: int = 8192
    seed: int = 0


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def run_engine_policy(b: EngineBench, policy: str) -> dict[str, Any]:
    """One policy on a fresh engine (same weights), closed loop at `b.concurrency`."""
    rng = random.Random(b.seed)
    system = [rng.randrange(512) for _ in range(b.shared_prefix_tokens)]
    prompts = deque(
        system + [rng.randrange(512) for _ in range(b.suffix_tokens)] for _ in range(b.num_requests)
    )
    llm = LLM(
        "tiny",
        block_size=b.block_size,
        prefix_match_unit=b.prefix_match_unit,
        max_model_len=b.shared_prefix_tokens + b.suffix_tokens + b.output_tokens + 16,
        policy=policy,
        num_speculative_tokens=b.num_speculative_tokens,
        max_num_batched_tokens=b.max_num_batched_tokens,
        max_num_seqs=b.concurrency,
        seed=b.seed,
    )
    sp = SamplingParams(max_tokens=b.output_tokens, ignore_eos=True)
    arrived: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    outs: list[RequestOutput] = []
    pool = llm.scheduler.cache.pool
    peak = 0
    t0 = time.perf_counter()
    while prompts or len(outs) < b.num_requests:
        while prompts and len(arrived) - len(outs) < b.concurrency:
            rid = llm.add_request(prompts.popleft(), sp)
            arrived[rid] = time.perf_counter()
        events = llm.step()
        now = time.perf_counter()
        peak = max(peak, pool.num_blocks - 1 - pool.num_free)
        for e in events:
            if e.new_token_ids:
                first.setdefault(e.request_id, now)
                last[e.request_id] = now
            if e.output is not None:
                outs.append(e.output)
    wall = time.perf_counter() - t0
    ttft = [first[o.request_id] - arrived[o.request_id] for o in outs]
    itl = [
        (last[o.request_id] - first[o.request_id]) / (len(o.token_ids) - 1)
        for o in outs
        if len(o.token_ids) > 1
    ]
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
    hit = sum(o.hit_tokens for o in outs)
    out_tokens = sum(len(o.token_ids) for o in outs)
    return {
        "output_tokens_per_s": out_tokens / wall,
        "request_throughput": len(outs) / wall,
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p95_s": _pct(ttft, 95),
        "itl_p50_s": _pct(itl, 50),
        "itl_p95_s": _pct(itl, 95),
        "prefill_tokens_computed": sum(o.prefill_tokens for o in outs),
        "hit_tokens": hit,
        "token_hit_rate": hit / prompt_tokens,
        "lost_reuse_tokens": sum(o.lost_reuse for o in outs),
        "extra_prefill_steps_max": None,
        "peak_blocks_used": peak,
        "preemptions": llm.scheduler.num_preemptions,
        "wall_s": wall,
        "resume_points": sorted({o.hit_tokens for o in outs}),
        "_steps": {o.request_id: (o.hit_tokens, o.junction, o.prefill_steps) for o in outs},
    }


def engine_bench(b: EngineBench, policies: tuple[str, ...], progress: Progress) -> dict[str, Any]:
    results = {}
    for p in policies:
        progress(f"engine · {p}")
        results[p] = run_engine_policy(b, p)
    base = results[policies[0]]["_steps"]
    for res in results.values():
        steps = res.pop("_steps")
        extra = [
            s - base[rid][2]
            for rid, (hit, junction, s) in steps.items()
            if junction and rid in base and base[rid][0] == hit
        ]
        res["extra_prefill_steps_max"] = max(extra, default=0)
    return {"inputs": {"model": "tiny", "eagle": True, **asdict(b)}, "policies": results}


@dataclass(frozen=True)
class SimBench:
    model: str = "bamba-9b"
    gpu: str = "h200"
    block_size: int = 4416
    prefix_match_unit: int = 64
    num_speculative_tokens: int = 3
    acceptance_rate: float = 0.7
    shared_prefix_tokens: int = 57_600
    suffix_tokens: int = 6_416
    output_tokens: int = 256
    num_requests: int = 512
    concurrency: int = 64
    sessions: int = 64
    turns: int = 6
    user_tokens: int = 3_000
    turn_output_tokens: int = 300
    trace_requests: int = 2_000
    seed: int = 0


def simulated_bench(s: SimBench, progress: Progress) -> dict[str, Any]:
    model, gpu = load_model_spec(s.model), load_gpu(s.gpu)
    cost = CostModel(
        model,
        gpu,
        speculative=True,
        num_speculative_tokens=s.num_speculative_tokens,
        block_size=s.block_size,
    )
    workloads = [
        (
            Workload(
                "system-prompt",
                system_prompt_workload(
                    s.num_requests,
                    s.shared_prefix_tokens,
                    s.suffix_tokens,
                    s.output_tokens,
                    seed=s.seed,
                ),
                concurrency=s.concurrency,
            ),
            ("tail", "replay", "junction"),
        ),
        (
            Workload(
                "multi-turn",
                sessions=multi_turn_workload(
                    s.sessions, s.turns, s.user_tokens, s.turn_output_tokens, seed=s.seed
                ),
                concurrency=s.concurrency,
            ),
            ("replay", "junction"),
        ),
        (
            Workload(
                "trace",
                requests_from_records(
                    generate_mooncake_like(num_requests=s.trace_requests, seed=s.seed), seed=s.seed
                ),
            ),
            ("replay", "junction"),
        ),
    ]
    out: dict[str, Any] = {}
    for w, policies in workloads:
        progress(f"simulated · {w.name}")
        max_len = w.max_tokens_per_request() + 2 * s.num_speculative_tokens + 8
        cfg = HycacheConfig(
            CacheConfig(
                block_size=s.block_size,
                prefix_match_unit=s.prefix_match_unit,
                num_blocks=cost.num_blocks(s.block_size),
                max_model_len=max_len,
                groups=(GroupKind.ATTENTION, GroupKind.SSM),
            ),
            SpeculativeConfig(
                num_speculative_tokens=s.num_speculative_tokens, acceptance_rate=s.acceptance_rate
            ),
            SchedulerConfig(8192, s.concurrency),
        )
        results = compare_policies(w, cfg, policies, cost=cost, seed=s.seed)
        out[w.name] = {
            "inputs": {**asdict(s), "workload": w.name, "num_requests": w.size},
            "policies": policies_json(results),
        }
    return out


def bench(engine: EngineBench | None, sim: SimBench | None, progress: Progress) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if engine is not None:
        doc["engine"] = engine_bench(engine, ("replay", "junction"), progress)
    if sim is not None:
        doc["simulated"] = simulated_bench(sim, progress)
    return doc
