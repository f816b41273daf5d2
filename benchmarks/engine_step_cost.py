"""Where the CPU engine's time goes, step by step, for arms run alternately in one process:
every engine step's CPU time on the engine thread (`time.thread_time`, torch on one thread, so
the model's work is on that thread and other processes on a shared machine do not count) and its
wall time beside it, split between the target's Mamba mixers (and within them the chunked
scans, `ssd_chunked_states`), its attention layers, the drafter, and the rest (scheduler, sampling,
LM head, MLPs, embeddings); with each step's prefill tokens, checkpoint writes and attention
query-key pairs. Per request, TTFT in engine CPU seconds and in wall seconds.

    .venv/bin/python benchmarks/engine_step_cost.py [--shape family] [--arms lookahead,limit]
        [--repeats 2] [--steps] [--json out/engine_step_cost.json]

Defaults: the README's CPU-engine families row (`hycache bench --engine-shape family`: `tiny` +
EAGLE k=2, B=552, u=8, 12 requests at concurrency 8, 3 families).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import hycache.model.mamba2 as mamba2
from hycache.bench.suite import EngineBench, engine_for_arm
from hycache.model.layers import Attention
from hycache.request import SamplingParams
from hycache.sched.scheduler import SchedulerOutput

PARTS = ("mamba", "ssd", "attention", "drafter")


class Meter:
    """Engine-thread CPU seconds per part, accumulated between `take` calls."""

    def __init__(self) -> None:
        self.acc = dict.fromkeys(PARTS, 0.0)
        self.ssd_calls = 0
        self._open: dict[int, float] = {}

    def hook(self, module: torch.nn.Module, part: str) -> None:
        def pre(_m: Any, _a: Any) -> None:
            self._open[id(module)] = time.thread_time()

        def post(_m: Any, _a: Any, _o: Any) -> None:
            self.acc[part] += time.thread_time() - self._open.pop(id(module))

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def take(self) -> dict[str, float]:
        out = dict(self.acc)
        out["ssd_calls"] = self.ssd_calls
        self.acc = dict.fromkeys(PARTS, 0.0)
        self.ssd_calls = 0
        return out


def _wrap_ssd(meter: Meter) -> Any:
    inner = mamba2.ssd_chunked_states

    def timed(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            meter.acc["ssd"] += time.thread_time() - t
            meter.ssd_calls += 1

    mamba2.ssd_chunked_states = timed  # type: ignore[assignment]
    return inner


def _shape(out: SchedulerOutput) -> dict[str, int]:
    # the observer runs after the step was applied (requests have grown): a decode or verify
    # step computes one known token, a prefill chunk more
    chunks = [s for s in out.scheduled if s.num_tokens > 1]
    return {
        "prefill_tokens": sum(s.num_tokens for s in chunks),
        "writes": sum(len(s.alloc.states[0].writes) for s in chunks) if chunks else 0,
        # query-key pairs of the chunks' causal attention (context before the chunk included)
        "qk_pairs": sum(
            s.num_tokens * s.start + s.num_tokens * (s.num_tokens + 1) // 2 for s in chunks
        ),
        "cached_qk_pairs": sum(s.num_tokens * s.start for s in chunks),
        "decode_rows": sum(1 + len(s.draft_token_ids) for s in out.scheduled if s.num_tokens <= 1),
    }


def run_arm(b: EngineBench, name: str) -> dict[str, Any]:
    llm = engine_for_arm(b, name)
    meter = Meter()
    for m in llm.model.modules():
        if isinstance(m, mamba2.Mamba2Mixer):
            meter.hook(m, "mamba")
        elif isinstance(m, Attention):
            meter.hook(m, "attention")
    if llm.runner.drafter is not None:
        meter.hook(llm.runner.drafter, "drafter")
    shapes: list[dict[str, int]] = []
    llm.add_step_observer(lambda out: shapes.append(_shape(out)))
    inner = _wrap_ssd(meter)
    sp = SamplingParams(max_tokens=b.output_tokens, ignore_eos=True)
    prompts = deque(b.prompts())
    arrived: dict[str, tuple[float, float, int]] = {}
    first: dict[str, tuple[float, float, int]] = {}
    steps: list[dict[str, Any]] = []
    done = 0
    out_tokens = 0
    c0, w0 = time.thread_time(), time.perf_counter()
    try:
        while prompts or done < b.num_requests:
            while prompts and len(arrived) - done < b.concurrency:
                rid = llm.add_request(prompts.popleft(), sp)
                arrived[rid] = (time.thread_time(), time.perf_counter(), len(steps))
            meter.take()
            c, w = time.thread_time(), time.perf_counter()
            events = llm.step()
            c1, w1 = time.thread_time(), time.perf_counter()
            steps.append({"cpu": c1 - c, "wall": w1 - w, **meter.take(), **shapes[-1]})
            for e in events:
                out_tokens += len(e.new_token_ids)
                if e.new_token_ids and e.request_id not in first:
                    first[e.request_id] = (c1, w1, len(steps))
                if e.output is not None:
                    done += 1
    finally:
        mamba2.ssd_chunked_states = inner
    cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
    ttft_cpu = [first[r][0] - arrived[r][0] for r in arrived]
    ttft_wall = [first[r][1] - arrived[r][1] for r in arrived]
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "output_tokens": out_tokens,
        "output_tokens_per_cpu_s": out_tokens / cpu,
        "output_tokens_per_s": out_tokens / wall,
        "ttft_cpu_p50_s": statistics.median(ttft_cpu),
        "ttft_wall_p50_s": statistics.median(ttft_wall),
        "first_token_step": [first[r][2] for r in arrived],
        "arrival_step": [arrived[r][2] for r in arrived],
        "ttft_cpu_s": ttft_cpu,
        "ttft_wall_s": ttft_wall,
        "steps": steps,
    }


def _sum(steps: list[dict[str, Any]], key: str, upto: int | None = None) -> float:
    return sum(s[key] for s in steps[:upto])


def summary(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats; per part, CPU seconds over the whole run and up to the step of
    the median first token."""
    r0 = runs[0]
    p50_step = int(statistics.median_high(r0["first_token_step"]))
    out: dict[str, Any] = {"arm": name, "p50_first_token_step": p50_step}
    for key in ("arrival_step", "first_token_step"):
        out[key] = r0[key]
    for key in ("ttft_cpu_s", "ttft_wall_s"):
        out[key] = [
            round(statistics.median(v), 3) for v in zip(*(r[key] for r in runs), strict=True)
        ]
    for key in (
        "cpu_s",
        "wall_s",
        "output_tokens_per_cpu_s",
        "output_tokens_per_s",
        "ttft_cpu_p50_s",
        "ttft_wall_p50_s",
    ):
        out[key] = statistics.median(r[key] for r in runs)
    for key in ("prefill_tokens", "writes", "qk_pairs", "cached_qk_pairs", "ssd_calls"):
        out[key] = _sum(r0["steps"], key)
    for part in ("cpu", *PARTS):
        out[f"{part}_s"] = statistics.median(_sum(r["steps"], part) for r in runs)
        out[f"{part}_to_p50_s"] = statistics.median(_sum(r["steps"], part, p50_step) for r in runs)
    # per step, the median over repeats of each time (the schedule is the same in every
    # repeat: seeded sampling); the counts from the first
    n = min(len(r["steps"]) for r in runs)
    out["steps"] = [
        {
            k: round(statistics.median(r["steps"][j][k] for r in runs), 4)
            if isinstance(v, float)
            else v
            for k, v in r0["steps"][j].items()
        }
        for j in range(n)
    ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="family")
    ap.add_argument("--arms", default="lookahead,limit")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", action="store_true", help="print every step")
    ap.add_argument("--requests", type=int, default=0, help="0: the shape's own sizes")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--json", default="out/engine_step_cost.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    b = EngineBench(shape=args.shape)
    if args.requests:  # the no-sharing bench's shape (benchmarks/bench_no_sharing_engine.py)
        b = replace(
            b,
            shared_prefix_tokens=args.prompt - 8,
            suffix_tokens=8,
            output_tokens=args.output,
            num_requests=args.requests,
            concurrency=args.requests,
        )
    arms = args.arms.split(",")
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for i in range(args.repeats):
        for a in arms if i % 2 == 0 else reversed(arms):
            runs[a].append(run_arm(b, a))
            r = runs[a][-1]
            print(
                f"repeat {i + 1} {a:10s} cpu {r['cpu_s']:.2f} s wall {r['wall_s']:.2f} s "
                f"TTFT p50 cpu {r['ttft_cpu_p50_s']:.3f} wall {r['ttft_wall_p50_s']:.3f}",
                flush=True,
            )
    doc = {a: summary(a, runs[a]) for a in arms}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    for a, s in doc.items():
        print(f"\n{a}: first-token step p50 {s['p50_first_token_step']}")
        print(
            "  "
            + "  ".join(
                f"{k} {v:,.3f}" if isinstance(v, float) else f"{k} {v:,}"
                for k, v in s.items()
                if isinstance(v, int | float)
            )
        )
        for key in ("arrival_step", "first_token_step", "ttft_cpu_s", "ttft_wall_s"):
            print(f"  {key:17s} {s[key]}")
        if args.steps:
            for j, st in enumerate(s["steps"][:30], start=1):
                print(f"  step {j:3d} " + " ".join(f"{k}={v}" for k, v in st.items()))


if __name__ == "__main__":
    main()
