"""Per-step anatomy of `hycache simulate --trace T --compare ARMS` (docs/admission.md, "The
default against the split arms"): per arm, the steps by kind (prefill only, mixed, decode
only) and their time, prefill tokens per step, the step time the cost model charges for the
decoding requests and the prefill chunks apart and together (what a mixed step hides), the
waits for in-flight prefixes (attention: a block computed this step; SSM: a promised
checkpoint) and whether the waiter then resumed higher, decode batch sizes, preemptions; then,
per request, TTFT split into the queue (arrival to admission) and the prefill (admission to the
first token), and the requests whose hit differs most between the first two arms.

    hycache trace-gen --num-requests 600 --seed 77 --out /tmp/t77.jsonl
    .venv/bin/python benchmarks/step_kinds.py /tmp/t77.jsonl limit,limit-split   # ~20 s an arm

Extra `simulate` flags follow the arms (e.g. `--num-blocks 234`, `--no-admission`).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import hycache.sched.scheduler as scheduler_module
from hycache.cache.boundaries import Boundaries, floor_to
from hycache.cache.coordinator import CacheHit
from hycache.cli.main import make_parser
from hycache.cli.simulate import SimulateArgs, load_workload, size_pools
from hycache.request import Request
from hycache.sim import cluster
from hycache.sim.build import open_loop
from hycache.sim.compare import compare_policies
from hycache.sim.costmodel import StepWork


@dataclass
class Step:
    clock: float
    dt: float
    kind: str  # "prefill", "mixed", "decode"
    prefill_tokens: int
    decoding: int
    dt_decode_alone: float  # the decoding requests' step alone
    dt_prefill_alone: float  # the prefill chunks' step alone
    waits: list[str]  # per request deferred this step: "attention" or "ssm"
    preempted: int
    running: int
    waiting: int


@dataclass
class Trace:
    steps: list[Step] = field(default_factory=list)
    admitted: dict[str, float] = field(default_factory=dict)  # request id -> clock at admission
    deferred: dict[str, tuple[str, int]] = field(default_factory=dict)  # first deferral
    resumed: list[tuple[str, int, int]] = field(default_factory=list)  # (reason, before, after)
    _waits: list[str] = field(default_factory=list)


TRACE = Trace()
_should_wait = scheduler_module.should_wait
_step = cluster.Instance.step


def should_wait(
    req: Request, hit: CacheHit, in_step: set[bytes], promised: set[bytes], bounds: Boundaries
) -> bool:
    wait = _should_wait(req, hit, in_step, promised, bounds)
    if wait:
        b = bounds.block_size
        nxt = floor_to(hit.attention_match, b) + b
        attention = nxt <= req.hashes.num_hashed_tokens and req.hashes.at(nxt) in in_step
        reason = "attention" if attention else "ssm"
        TRACE._waits.append(reason)
        TRACE.deferred.setdefault(req.request_id, (reason, hit.resume_point))
    return wait


def step(inst: cluster.Instance) -> None:
    sched, t0, seen = inst.sched, inst.clock, {}
    real = sched.schedule

    def schedule() -> Any:
        out = real()
        seen["out"] = out
        seen["prefill"] = [s.request.num_tokens - s.start > 1 for s in out.scheduled]
        seen["first"] = [s.request.num_output_tokens == 0 for s in out.scheduled]
        return out

    TRACE._waits = []
    sched.schedule = schedule  # type: ignore[method-assign]
    try:
        _step(inst)
    finally:
        sched.schedule = real  # type: ignore[method-assign]
    out, prefill = seen["out"], seen["prefill"]
    work = cluster.step_work(out, inst.block_size)
    pre = tuple(w for w, p in zip(work.seqs, prefill, strict=True) if p)
    dec = tuple(w for w, p in zip(work.seqs, prefill, strict=True) if not p)
    assert inst.cost is not None
    for s, first in zip(out.scheduled, seen["first"], strict=True):
        rid = s.request.request_id
        if first and rid not in TRACE.admitted:
            TRACE.admitted[rid] = t0
            if rid in TRACE.deferred:
                reason, before = TRACE.deferred.pop(rid)
                TRACE.resumed.append((reason, before, s.start))
    kind = "prefill" if pre and not dec else "mixed" if pre else "decode"
    TRACE.steps.append(
        Step(
            t0,
            inst.clock - t0,
            kind,
            sum(s.num_tokens for s, p in zip(out.scheduled, prefill, strict=True) if p),
            len(dec),
            inst.cost.step_time(StepWork(dec)) if dec else 0.0,
            inst.cost.step_time(StepWork(pre)) if pre else 0.0,
            TRACE._waits,
            len(out.preempted),
            len(sched.running),
            len(sched.waiting),
        )
    )


def report(arm: str, res: Any, trace: Trace) -> dict[str, float]:
    s, steps = res.summary, trace.steps
    kinds = Counter(x.kind for x in steps)
    time = Counter[str]()
    for x in steps:
        time[x.kind] += x.dt
    hidden = sum(x.dt_decode_alone + x.dt_prefill_alone - x.dt for x in steps)
    print(
        f"{arm}: hit {s['token_hit_rate']:.4f}  tok/s {s['output_tokens_per_s']:.1f}  "
        f"TTFT p50 {s['ttft_p50_s']:.3f} p95 {s['ttft_p95_s']:.3f}  steps {s['steps']}  "
        f"prefill {s['prefill_tokens_computed']:,}  preemptions {s['preemptions']}"
    )
    print(
        "  steps by kind: "
        + ", ".join(f"{k} {kinds[k]} ({time[k]:.2f} s)" for k in ("prefill", "mixed", "decode"))
    )
    with_prefill = [x.prefill_tokens for x in steps if x.prefill_tokens]
    decode_only = [x.decoding for x in steps if x.kind == "decode"]
    alone_dec = sum(x.dt_decode_alone for x in steps)
    alone_pre = sum(x.dt_prefill_alone for x in steps)
    print(
        f"  prefill tokens per step with prefill {np.mean(with_prefill):.0f}; decode-only batch "
        f"{np.mean(decode_only or [0]):.1f}; decode alone {alone_dec:.2f} s, prefill alone "
        f"{alone_pre:.2f} s, hidden in mixed steps {hidden:.2f} s"
    )
    waits = Counter(w for x in steps for w in x.waits)
    higher = Counter(r for r, before, after in trace.resumed if after > before)
    print(
        f"  waits (request-steps) {dict(waits)}; steps with an SSM wait "
        f"{sum(1 for x in steps if 'ssm' in x.waits)}; waiters that resumed higher "
        f"{dict(higher)} of {dict(Counter(r for r, _, _ in trace.resumed))}"
    )
    recs = res.records
    queue = np.array([trace.admitted[str(r.id)] - r.arrival_s for r in recs])
    pre = np.array([r.first_token_s - trace.admitted[str(r.id)] for r in recs])
    print(
        f"  TTFT = queue (p50 {np.median(queue):.3f}, mean {queue.mean():.3f}) + prefill "
        f"(p50 {np.median(pre):.3f}, mean {pre.mean():.3f})"
    )
    return {"hidden": hidden}


def main(argv: list[str]) -> None:
    trace_path, arms, extra = argv[0], argv[1], argv[2:]
    args = make_parser().parse_args(
        ["simulate", "--trace", trace_path, "--compare", arms, "--quiet", *extra]
    )
    a = SimulateArgs.from_cli_args(args)
    workload = load_workload(a)
    cost = a.cost()
    pools = size_pools(a, workload, cost)
    if a.request_rate is not None:
        open_loop(
            workload,
            a.request_rate,
            config=pools.config,
            cost=cost,
            load=a.load,
            seed=a.workload.seed,
            size_cache=pools.sized,
        )
    scheduler_module.should_wait = should_wait  # type: ignore[assignment]
    cluster.Instance.step = step  # type: ignore[method-assign]
    results = {}
    for arm in arms.split(","):
        global TRACE
        TRACE = Trace()
        res = compare_policies(
            workload, pools.config, [arm], cost=cost, seed=a.workload.seed, size_cache=pools.sized
        )[arm]
        report(arm, res, TRACE)
        results[arm] = res
    names = list(results)
    if len(names) >= 2:
        first, second = (results[n].by_id() for n in names[:2])
        diffs = sorted(
            first,
            key=lambda i: -abs(first[i].hit_tokens - second[i].hit_tokens),
        )[:5]
        print(f"largest hit differences, {names[0]} vs {names[1]} (tokens):")
        for i in diffs:
            x, y = first[i], second[i]
            print(
                f"  request {i}: {x.prompt_tokens} prompt, hit {x.hit_tokens} vs {y.hit_tokens}, "
                f"TTFT {x.first_token_s - x.arrival_s:.2f} vs {y.first_token_s - y.arrival_s:.2f} s"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
