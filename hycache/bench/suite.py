"""`hycache bench`'s comparisons, on the real CPU engine and simulated.

1. engine: the real engine (`tiny`, EAGLE drafter on) on a scaled system-prompt workload,
   `lookahead` (vLLM 0.33's default EAGLE setup, the baseline) against `limit`, closed loop at a
   fixed concurrency; the policy order alternates across repeats (L,M / M,L / L,M ...) and the
   medians are reported, so a machine that slows down or warms up over the run favours
   neither side; each arm's spread over the repeats is reported, and each arm against
   `lookahead` per repeat, with whether the repeats agree enough to rank them
   (`hycache.bench.repeats`);
2. simulated (bamba-9b on an H200, B=4416, u=64, k=3, concurrency 64), every arm (`eagle-off`,
   `replay`, `junction`, `lookahead`, `limit`) on four workloads: the seed's system prompt, the
   random family workload, multi-turn chat behind a shared system prompt, and a Mooncake-like
   trace replayed open loop at 75% of what `lookahead` sustains on one GPU;
3. curves: `limit / lookahead` output tokens/s over output length (64-2,048) and concurrency
   (1-128), on the system-prompt and family workloads (fewer requests per point).

`bench` returns a typed `hycache.bench.results.BenchResult`; its `to_json()` is the document
(every table has the `{"policies": {arm: metrics}}` shape with its inputs beside it, and a
`headline`: `limit / lookahead`, and the extra SSM state pages `limit` held).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from hycache.bench.repeats import ratio_spread, spread
from hycache.bench.results import (
    CURVE_AXES,
    SPREAD_KEYS,
    BenchResult,
    CurvePoint,
    Curves,
    EnginePart,
    EngineRow,
    SimInputs,
    SimTable,
    median_row,
)
from hycache.config import ENGINE_SHAPES, CacheKnobs, HycacheConfig
from hycache.sim.build import (
    SimGeometry,
    TraceSource,
    WorkloadSpec,
    build_config,
    build_cost,
    build_workload,
)
from hycache.sim.compare import (
    ARMS,
    BASELINE,
    DEFAULT_ARMS,
    HEADLINE,
    HEADLINE_SPLIT,
    NO_CACHING,
    compare_policies,
    policies_json,
    reference_arm,
)
from hycache.sim.costmodel import CostModel, PoolLayout
from hycache.sim.load import DEFAULT_LOAD, sustainable_arrivals
from hycache.sim.trace_gen import generate_mooncake_like
from hycache.sim.workloads import (
    ChatShape,
    FamilyShape,
    OfferedLoad,
    SystemPromptShape,
    Workload,
)

if TYPE_CHECKING:
    from hycache.engine.engine import LLM
    from hycache.engine.outputs import RequestOutput

Progress = Callable[[str], None]

ENGINE_ARMS: tuple[str, ...] = (BASELINE, HEADLINE, HEADLINE_SPLIT)


def engine_arms(shape: str) -> tuple[str, ...]:
    """The engine part's arms; with nothing shared, `no-caching` beside them."""
    return (*ENGINE_ARMS, NO_CACHING) if shape == "none" else ENGINE_ARMS


@dataclass(frozen=True)
class EngineBench:
    """The seed's system-prompt shape scaled to a CPU: P = 7,200 shared tokens (B=552, u=8:
    sharing ends 24 tokens into a block, as 57,600 ends 192 tokens into a 4,416-token block)."""

    # the cache's choices (`internal_checkpoints` for every arm but the `-split` ones,
    # `enable_prefix_caching` False: every arm with prefix caching off; each arm sets `policy`)
    knobs: CacheKnobs = field(default_factory=lambda: CacheKnobs(552, 8))
    shared_prefix_tokens: int = 7_200
    suffix_tokens: int = 802
    output_tokens: int = 32
    num_requests: int = 12
    concurrency: int = 8
    num_speculative_tokens: int = 2
    max_num_batched_tokens: int = 8192
    repeats: int = 3
    threads: int | None = None  # torch threads (None: torch's default, every core)
    num_blocks: int | None = None  # None: the engine sizes its cache (1 GiB)
    seed: int = 0
    # a second cache tier ("host", "mooncake://HOST:PORT"): every run opens its own store of
    # this kind and closes it at its end, so arms and repeats never share stored objects
    kv_store: str | None = None
    kv_store_gb: float = 4.0
    # "system": every request is the shared prefix + its own suffix; "family": `families`
    # prefixes of random lengths in [block_size, shared_prefix_tokens], requests interleaved;
    # "none": nothing shared (each prompt shared_prefix_tokens + suffix_tokens random tokens)
    shape: str = "system"
    families: int = 3

    def __post_init__(self) -> None:
        if self.shape not in ENGINE_SHAPES:
            raise ValueError(f"shape: one of {', '.join(ENGINE_SHAPES)}, got {self.shape!r}")
        if self.families < 1:
            raise ValueError(f"families: must be >= 1, got {self.families}")

    def prompts(self) -> list[list[int]]:
        """The requests' prompts, in arrival order (the same for every arm and repeat)."""
        rng = random.Random(self.seed)
        if self.shape == "none":
            n = self.shared_prefix_tokens + self.suffix_tokens
            return [[rng.randrange(512) for _ in range(n)] for _ in range(self.num_requests)]
        if self.shape == "system":
            roots = [[rng.randrange(512) for _ in range(self.shared_prefix_tokens)]]
        else:
            lengths = [
                rng.randrange(self.knobs.block_size, self.shared_prefix_tokens + 1)
                for _ in range(self.families)
            ]
            roots = [[rng.randrange(512) for _ in range(n)] for n in lengths]
        return [
            roots[i % len(roots)] + [rng.randrange(512) for _ in range(self.suffix_tokens)]
            for i in range(self.num_requests)
        ]

    def to_json(self) -> dict[str, Any]:
        """The run's inputs as the result reports them (the knobs the engine part sets, flat)."""
        k = self.knobs
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "knobs"}
        return {
            "block_size": k.block_size,
            "prefix_match_unit": k.prefix_match_unit,
            **out,
            "eviction": str(k.eviction),
            "eviction_alpha": k.eviction_alpha,
            "internal_checkpoints": k.internal_checkpoints,
            "prefix_caching": k.enable_prefix_caching,
        }


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def run_engine_policy(b: EngineBench, policy: str) -> EngineRow:
    """One policy on a fresh engine (same weights), closed loop at `b.concurrency`, on
    `b.threads` torch threads."""
    import torch  # only when the engine runs

    threads = torch.get_num_threads()
    if b.threads:
        torch.set_num_threads(b.threads)
    try:
        return _run_engine(b, policy)
    finally:
        torch.set_num_threads(threads)


def engine_for_arm(b: EngineBench, name: str) -> LLM:
    """The `LLM` that `b`'s engine part runs arm `name` on (a policy, or one with `-split`: no
    internal checkpoints; `no-caching`), warmed up as a server is before its first request."""
    from hycache.engine.engine import LLM

    arm = ARMS[name]
    k = b.knobs
    knobs = k.replace(
        policy=arm.policy,
        enable_prefix_caching=arm.caching and k.enable_prefix_caching,
        internal_checkpoints=k.internal_checkpoints if arm.internal is None else arm.internal,
    )
    return LLM(
        "tiny",
        knobs=knobs,
        max_model_len=b.shared_prefix_tokens + b.suffix_tokens + b.output_tokens + 16,
        num_speculative_tokens=b.num_speculative_tokens,
        max_num_batched_tokens=b.max_num_batched_tokens,
        max_num_seqs=b.concurrency,
        num_blocks=b.num_blocks,
        seed=b.seed,
        kv_store=b.kv_store,
        kv_store_gb=b.kv_store_gb,
        warmup=True,
    )


def _run_engine(b: EngineBench, name: str) -> EngineRow:
    prompts = deque(b.prompts())
    llm = engine_for_arm(b, name)
    try:
        return _closed_loop(b, llm, prompts)
    finally:
        if llm.store is not None:
            llm.store.close()


def _closed_loop(b: EngineBench, llm: LLM, prompts: deque[list[int]]) -> EngineRow:
    from hycache.request import SamplingParams

    sp = SamplingParams(max_tokens=b.output_tokens, ignore_eos=True)
    arrived: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    # the same instants on the engine thread's CPU clock (`time.thread_time`): with torch on
    # one thread the model runs on this thread, so on a shared machine the CPU seconds count
    # the engine's own work and not the other processes' (the wall clock counts both). Each
    # interval starts on the wall clock and ends on the CPU clock first, so the CPU interval
    # lies inside the wall one: a CPU figure is never above its wall figure by the read gap.
    arrived_cpu: dict[str, float] = {}
    first_cpu: dict[str, float] = {}
    outs: list[RequestOutput] = []
    peak = 0
    steps = 0
    t0, c0 = time.perf_counter(), time.thread_time()
    while prompts or len(outs) < b.num_requests:
        while prompts and len(arrived) - len(outs) < b.concurrency:
            rid = llm.add_request(prompts.popleft(), sp)
            arrived[rid], arrived_cpu[rid] = time.perf_counter(), time.thread_time()
        events = llm.step()
        cpu, now = time.thread_time(), time.perf_counter()  # an interval's end: CPU first
        steps += 1
        peak = max(peak, llm.used_blocks)
        for e in events:
            if e.new_token_ids:
                first.setdefault(e.request_id, now)
                first_cpu.setdefault(e.request_id, cpu)
                last[e.request_id] = now
            if e.output is not None:
                outs.append(e.output)
    cpu_s = time.thread_time() - c0
    wall = time.perf_counter() - t0
    ttft = [first[o.request_id] - arrived[o.request_id] for o in outs]
    ttft_cpu = [first_cpu[o.request_id] - arrived_cpu[o.request_id] for o in outs]
    itl = [
        (last[o.request_id] - first[o.request_id]) / (len(o.token_ids) - 1)
        for o in outs
        if len(o.token_ids) > 1
    ]
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
    hit = sum(o.hit_tokens for o in outs)
    out_tokens = sum(len(o.token_ids) for o in outs)
    return EngineRow(
        output_tokens_per_s=out_tokens / wall,
        request_throughput=len(outs) / wall,
        ttft_p50_s=_pct(ttft, 50),
        ttft_p95_s=_pct(ttft, 95),
        itl_p50_s=_pct(itl, 50),
        itl_p95_s=_pct(itl, 95),
        prefill_tokens_computed=sum(o.prefill_tokens for o in outs),
        hit_tokens=hit,
        store_hit_tokens=sum(o.store_hit_tokens for o in outs),
        token_hit_rate=hit / prompt_tokens,
        lost_reuse_tokens=sum(o.lost_reuse for o in outs),
        junctions_observed=sum(1 for o in outs if o.junction),
        extra_prefill_steps_max=None,
        peak_blocks_used=peak,
        preemptions=llm.num_preemptions,
        wall_s=wall,
        # the engine thread's CPU clock (see above): the figures to compare on a shared machine
        engine_cpu_s=cpu_s,
        engine_steps=steps,
        output_tokens_per_cpu_s=out_tokens / cpu_s,
        ttft_cpu_p50_s=_pct(ttft_cpu, 50),
        ttft_cpu_p95_s=_pct(ttft_cpu, 95),
        resume_points=tuple(sorted({o.hit_tokens for o in outs})),
        steps={o.request_id: (o.hit_tokens, o.junction, o.checkpoint_splits) for o in outs},
    )


def engine_orders(policies: Sequence[str], repeats: int) -> list[list[str]]:
    """The policy order of each repeat: as given, reversed, as given, ..."""
    return [list(policies) if i % 2 == 0 else list(reversed(policies)) for i in range(repeats)]


def engine_bench(b: EngineBench, policies: Sequence[str], progress: Progress) -> EnginePart:
    """Each policy `b.repeats` times, alternating the order; medians per policy."""
    if b.repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {b.repeats}")
    orders = engine_orders(policies, b.repeats)
    runs: dict[str, list[EngineRow]] = {p: [] for p in policies}
    for i, order in enumerate(orders):
        for p in order:
            progress(f"engine · repeat {i + 1}/{b.repeats} · {p}")
            runs[p].append(run_engine_policy(b, p))
    ref = reference_arm(list(policies))
    spreads = {
        p: {k: spread([r.figure(k) for r in runs[p]]) for k in SPREAD_KEYS} for p in policies
    }
    vs_ref = {
        p: {
            k: ratio_spread([r.figure(k) for r in runs[p]], [r.figure(k) for r in runs[ref]])
            for k in SPREAD_KEYS
        }
        for p in policies
        if p != ref
    }
    medians = {p: median_row(runs[p]) for p in policies}
    base = medians[ref].steps
    results = {
        p: replace(row, extra_prefill_steps_max=_extra_prefill_steps(row, base))
        for p, row in medians.items()
    }
    inputs = {"model": "tiny", "eagle": True, **b.to_json(), "orders": orders}
    return EnginePart(inputs, results, runs, ref, spreads, vs_ref)


def _extra_prefill_steps(row: EngineRow, base: Mapping[str, tuple[int, int, int]]) -> int:
    """The most prefill steps a request of `row` took beyond the reference arm's same request,
    among those that hit the same tokens at a junction."""
    extra = [
        s - base[rid][2]
        for rid, (hit, junction, s) in row.steps.items()
        if junction and rid in base and base[rid][0] == hit
    ]
    return max(extra, default=0)


@dataclass(frozen=True)
class SimBench:
    """The simulated part: the seed's geometry (bamba-9b on an H200, B=4416, u=64, k=3,
    concurrency 64), the workload shapes (their defaults and the reasons for them live with the
    shapes in `hycache.sim.workloads`), the trace size and load, and the curve points."""

    model: str = "bamba-9b"
    gpu: str = "h200"
    # the cache's choices for every arm (each arm sets `policy`; `internal_checkpoints` for
    # every arm but the `-split` ones; `enable_prefix_caching` False: every arm with it off)
    knobs: CacheKnobs = field(default_factory=lambda: CacheKnobs(4416, 64))
    num_speculative_tokens: int = 3
    acceptance_rate: float = 0.7
    concurrency: int = 64  # in flight, and the scheduler's max_num_seqs
    max_num_batched_tokens: int = 8192
    arms: tuple[str, ...] = DEFAULT_ARMS
    system_prompt: SystemPromptShape = field(default_factory=SystemPromptShape)
    family: FamilyShape = field(default_factory=FamilyShape)
    chat: ChatShape = field(default_factory=ChatShape)
    # nothing shared (random 1,024-token prompts, 1,024 out): what caching costs when no one
    # reuses anything, `limit` beside `no-caching`
    no_sharing: SystemPromptShape = field(
        default_factory=lambda: SystemPromptShape(
            num_requests=256, shared_prefix_tokens=0, suffix_tokens=1_024, output_tokens=1_024
        )
    )
    trace_requests: int = 1_000
    trace_load: float = DEFAULT_LOAD
    curve_output_tokens: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)
    curve_concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    curve_requests: int = 96  # per point, at least 2x the point's concurrency
    seed: int = 0


def sim_cost(s: SimBench, pool_layout: PoolLayout = "shared") -> CostModel:
    """The drafter arms' cost model (`eagle-off` derives its own from it)."""
    return build_cost(
        s.model,
        s.gpu,
        num_speculative_tokens=s.num_speculative_tokens,
        block_size=s.knobs.block_size,
        pool_layout=pool_layout,
    )


def sim_geometry(s: SimBench) -> SimGeometry:
    """The drafter arms' geometry (`hycache.sim.build.build_config`'s inputs)."""
    return SimGeometry(
        s.knobs,
        num_speculative_tokens=s.num_speculative_tokens,
        acceptance_rate=s.acceptance_rate,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_num_seqs=s.concurrency,
    )


def sim_config(s: SimBench, w: Workload, cost: CostModel) -> HycacheConfig:
    """The drafter arms' config; `compare_policies` sizes each arm's cache from its memory."""
    return build_config(
        sim_geometry(s),
        max_model_len=w.max_tokens_per_request() + 2 * s.num_speculative_tokens + 8,
        num_blocks=cost.num_blocks(s.knobs.block_size),
    )


def workload_spec(s: SimBench, name: str) -> WorkloadSpec:
    """What a bench workload is built from: its shape (seeded: the same in every process)."""
    if name == "trace":
        records = generate_mooncake_like(num_requests=s.trace_requests, seed=s.seed)
        return WorkloadSpec(name, trace=TraceSource(records=records), seed=s.seed)
    if name == NO_SHARING:
        return WorkloadSpec("system-prompt", s.no_sharing, seed=s.seed, concurrency=s.concurrency)
    shapes = {"system-prompt": s.system_prompt, "family": s.family, "multi-turn": s.chat}
    if name not in shapes:
        raise ValueError(f"unknown bench workload {name!r}")
    return WorkloadSpec(name, shapes[name], seed=s.seed, concurrency=s.concurrency)


def bench_workload(s: SimBench, name: str) -> Workload:
    """A bench workload (`hycache.sim.build.build_workload` of `workload_spec`)."""
    w = build_workload(workload_spec(s, name))
    w.name = name
    return w


@dataclass(frozen=True)
class SimJob:
    """One comparison: `arms` on one workload of `bench` (a table, or one curve point)."""

    bench: SimBench
    workload: str
    arms: tuple[str, ...]
    label: str


def timed_workload(s: SimBench, name: str, cost: CostModel) -> tuple[Workload, OfferedLoad | None]:
    """`bench_workload`, with the trace given open-loop arrivals at `s.trace_load` of what
    the default arm sustains; also the offered load (None for the closed-loop workloads)."""
    w = bench_workload(s, name)
    if name != "trace":
        return w, None
    timed, offered = sustainable_arrivals(
        w.requests, sim_config(s, w, cost), cost, load=s.trace_load, seed=s.seed, size_cache=True
    )
    return Workload("trace", timed), offered


@dataclass(frozen=True)
class SimJobResult:
    """One job's outcome: the workload's name, size and concurrency, each arm's summary, and
    for the trace the offered load it was replayed at."""

    workload: str
    size: int
    concurrency: int | None
    policies: dict[str, dict[str, Any]]
    offered: OfferedLoad | None


def run_job(job: SimJob) -> SimJobResult:
    """Run one job (in this process or a worker)."""
    s = job.bench
    cost = sim_cost(s)
    w, offered = timed_workload(s, job.workload, cost)
    results = compare_policies(
        w, sim_config(s, w, cost), job.arms, cost=cost, seed=s.seed, size_cache=True
    )
    return SimJobResult(w.name, w.size, w.concurrency, policies_json(results), offered)


def _inputs(s: SimBench, r: SimJobResult, shape: dict[str, Any]) -> SimInputs:
    own = {k: getattr(s, k) for k in ("model", "gpu", "num_speculative_tokens", "seed")}
    return SimInputs(
        **own,
        block_size=s.knobs.block_size,
        prefix_match_unit=s.knobs.prefix_match_unit,
        acceptance_rate=s.acceptance_rate,
        concurrency=r.concurrency,
        max_num_seqs=s.concurrency,
        workload=r.workload,
        num_requests=r.size,
        shape=shape,
        offered=r.offered,
    )


NO_SHARING = "no-sharing"
TABLES: tuple[str, ...] = ("system-prompt", "family", "multi-turn", "trace", NO_SHARING)


def table_arms(s: SimBench, name: str) -> tuple[str, ...]:
    """The arms of one table: every bench arm; with nothing shared, `no-caching` beside them."""
    if name == NO_SHARING and NO_CACHING not in s.arms:
        return (*s.arms, NO_CACHING)
    return s.arms


def table_jobs(s: SimBench) -> list[SimJob]:
    return [SimJob(s, name, table_arms(s, name), f"table · {name}") for name in TABLES]


def curve_jobs(s: SimBench) -> list[tuple[str, str, int, SimJob]]:
    """(axis, workload, x, job) for every curve point: `lookahead` and `limit` only, fewer
    requests per point (`curve_requests`, at least twice the point's concurrency)."""
    n = s.curve_requests
    arms = (BASELINE, HEADLINE)
    out: list[tuple[str, str, int, SimJob]] = []

    def sized(b: SimBench, name: str, requests: int) -> SimBench:
        if name == "system-prompt":
            return replace(b, system_prompt=replace(b.system_prompt, num_requests=requests))
        return replace(b, family=replace(b.family, families=max(1, requests // 8)))

    for name in ("system-prompt", "family"):
        for o in s.curve_output_tokens:
            b = sized(s, name, n)
            b = (
                replace(b, system_prompt=replace(b.system_prompt, output_tokens=o))
                if name == "system-prompt"
                else replace(b, family=replace(b.family, output_tokens=o))
            )
            out.append(
                ("output_tokens", name, o, SimJob(b, name, arms, f"curve · {name} · {o} out"))
            )
        for c in s.curve_concurrency:
            b = sized(replace(s, concurrency=c), name, max(n, 2 * c))
            out.append(("concurrency", name, c, SimJob(b, name, arms, f"curve · {name} · c={c}")))
    return out


def _run_all(jobs: Sequence[SimJob], workers: int, progress: Progress) -> list[SimJobResult]:
    """Run jobs, in order here (`workers` <= 1) or in `workers` spawned processes (the
    simulations are deterministic, so where they run changes no number)."""
    total = len(jobs)
    if workers <= 1 or total <= 1:
        out = []
        for i, job in enumerate(jobs):
            progress(f"simulated {i + 1}/{total} · {job.label}")
            out.append(run_job(job))
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: list[SimJobResult | None] = [None] * total
    ctx = multiprocessing.get_context("spawn")  # no fork after torch has started threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(run_job, job): i for i, job in enumerate(jobs)}
        progress(f"simulated 0/{total} on {workers} processes")
        for done, fut in enumerate(as_completed(futures), start=1):
            i = futures[fut]
            results[i] = fut.result()
            progress(f"simulated {done}/{total} · {jobs[i].label}")
    return [r for r in results if r is not None]


def simulated_bench(
    s: SimBench, progress: Progress, *, curves: bool = True, workers: int = 1
) -> tuple[dict[str, SimTable], Curves | None]:
    """One table per workload (every arm), and the `limit / lookahead` curves."""
    tables = table_jobs(s)
    points = curve_jobs(s) if curves else []
    # the trace (capacity, then five arms) is the longest job: start it first
    first = [j for j in tables if j.workload == "trace"]
    jobs = [*first, *(j for j in tables if j not in first), *(job for *_, job in points)]
    results = _run_all(jobs, workers, progress)
    by_job = dict(zip((id(j) for j in jobs), results, strict=True))
    shapes = {
        "system-prompt": asdict(s.system_prompt),
        "family": asdict(s.family),
        "multi-turn": asdict(s.chat),
        "trace": {"generator": "mooncake-like", "num_requests": s.trace_requests},
        NO_SHARING: asdict(s.no_sharing),
    }
    simulated = {
        job.workload: SimTable(
            _inputs(s, by_job[id(job)], shapes[job.workload]), by_job[id(job)].policies
        )
        for job in tables
    }
    if not curves:
        return simulated, None
    out: dict[str, dict[str, list[CurvePoint]]] = {axis: {} for axis in CURVE_AXES}
    for axis, name, x, job in points:
        r = by_job[id(job)]
        b, h = r.policies[BASELINE], r.policies[HEADLINE]
        point = CurvePoint(
            x,
            r.size,
            b["output_tokens_per_s"],
            h["output_tokens_per_s"],
            b["ttft_p50_s"],
            h["ttft_p50_s"],
        )
        out[axis].setdefault(name, []).append(point)
    inputs = {
        "requests_per_point": s.curve_requests,
        "concurrency_for_output_tokens": s.concurrency,
        "output_tokens_for_concurrency": {
            "system-prompt": s.system_prompt.output_tokens,
            "family": s.family.output_tokens,
        },
    }
    return simulated, Curves(out, inputs)


def bench(
    engine: EngineBench | None,
    sim: SimBench | None,
    progress: Progress,
    *,
    curves: bool = True,
    workers: int = 1,
) -> BenchResult:
    """The engine part first, alone on the machine (it is timed by the wall clock); then the
    simulations, on `workers` processes."""
    part = tables = curve_doc = sim_wall = None
    t0 = time.perf_counter()
    if engine is not None:
        part = engine_bench(engine, engine_arms(engine.shape), progress)
        part = replace(part, wall_s=time.perf_counter() - t0)
    if sim is not None:
        t1 = time.perf_counter()
        tables, curve_doc = simulated_bench(sim, progress, curves=curves, workers=workers)
        sim_wall = time.perf_counter() - t1
    return BenchResult(part, tables, curve_doc, sim_wall, time.perf_counter() - t0)
