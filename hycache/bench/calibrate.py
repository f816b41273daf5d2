"""`hycache calibrate`: time the real engine over a grid of step shapes and fit the simulator's
cost model to it (the fit itself, torch-free, is `hycache.sim.fit`).

The device is measured first: a large float32 matrix product gives its peak FLOP rate and a
large tensor copy its memory bandwidth (the `peak_flops` and `hbm_bandwidth` of the profile,
so the fitted efficiencies are fractions of what this device does at its best). Then the
engine runs small workloads built so that their steps take known shapes, and each step is
timed around `LLM.step()` (scheduler, runner and sampler: what a simulated step stands for),
its work read from the step's schedule (`LLM.add_step_observer`) exactly as the simulator
describes a step:

* prefill chunks: one request at a time, `max_num_batched_tokens` = the chunk, prefix caching
  off; a long prompt gives chunks at growing contexts;
* decode (verify) steps: the largest batch's requests prefill a context of their own each
  (no shared blocks, as in a real batch), then decode together with `k` drafts (k = 0: no
  drafter); aborting requests shrinks the batch to each smaller size;
* mixed steps: while a batch decodes, a fresh request's prefill chunk joins each step, or
  (`turns`) a few next turns do, each a short chunk over its cached history;
* block copies and SSM state writes, timed alone on the runner's caches.

Each shape is repeated; its time is the median, with the process CPU time and the load
average beside it. Shapes in `held_out` are measured the same way but never shown to the fit.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from hycache.config import CacheKnobs
from hycache.engine.outputs import LastSchedule
from hycache.sim.costmodel import StepWork
from hycache.sim.fit import Conditions, Fit, Profile, Residual, Sample, ablation, fit, residuals
from hycache.sim.model_spec import ModelSpec
from hycache.sim.presets import GpuSpec, load_model_spec

Progress = Callable[[str], None]

VOCAB = 512  # the tiny preset's vocabulary: every probe prompt is drawn below it


@dataclass(frozen=True)
class DecodeProbe:
    """Batches of each size in `batches`, one after another, decoding at `context` with `k`
    drafts; `mixed`: for each batch size, the chunk length of a fresh request joining each
    step; `turns`: for each batch size, `chunks` requests joining one step, each the next
    turn of a decoding request (its prompt and `tokens` new ones: a short chunk at about
    `context`, the rest a cache hit; multi-turn chat's steps). `shared`: the requests are
    siblings of one prefix (all but their last 8 tokens), else each has a context of its
    own."""

    context: int
    k: int
    batches: tuple[int, ...]
    mixed: tuple[tuple[int, int], ...] = ()  # (batch size, chunk tokens)
    shared: bool = False
    turns: tuple[tuple[int, int, int], ...] = ()  # (batch size, chunks, tokens per chunk)


@dataclass(frozen=True)
class PrefillProbe:
    """Chunks of `chunk` tokens at each of `contexts` (one request, chunk by chunk)."""

    chunk: int
    contexts: tuple[int, ...]
    k: int = 2


@dataclass(frozen=True)
class Grid:
    prefill: tuple[PrefillProbe, ...]
    decode: tuple[DecodeProbe, ...]
    copies: tuple[int, ...]  # block copies per timed batch
    state_writes: tuple[int, ...]


FIT_GRID = Grid(
    prefill=(
        PrefillProbe(552, (0,)),
        PrefillProbe(1104, (0, 2208, 4416, 6624)),
        PrefillProbe(2208, (0, 4416)),
        PrefillProbe(4416, (0,)),
        PrefillProbe(8192, (0,)),  # the validation workloads' largest chunk (8,002 tokens)
        PrefillProbe(1104, (0, 3312), k=0),
    ),
    decode=(
        DecodeProbe(512, 2, (1, 4, 8), mixed=((2, 552),)),
        DecodeProbe(4000, 2, (1, 8)),
        DecodeProbe(8000, 2, (2, 8), mixed=((4, 1104),)),
        DecodeProbe(4000, 2, (4, 8), shared=True),
        DecodeProbe(8000, 2, (8,), shared=True),
        # multi-turn chat's steps: next turns (short chunks over a cached history) join decodes
        DecodeProbe(2048, 2, (6,), turns=((6, 1, 128), (4, 1, 48), (3, 3, 320))),
        DecodeProbe(2048, 0, (1, 8)),
        DecodeProbe(2048, 1, (4,)),
        DecodeProbe(2048, 3, (4,)),
    ),
    copies=(4, 32),
    state_writes=(4, 32),
)

HELD_OUT_GRID = Grid(
    prefill=(PrefillProbe(1656, (0, 3312)), PrefillProbe(3312, (3312,))),
    decode=(
        DecodeProbe(1500, 2, (3, 6), mixed=((6, 2208),), turns=((3, 2, 200),)),
        DecodeProbe(6000, 2, (5,)),
        DecodeProbe(6000, 2, (6,), shared=True),
        DecodeProbe(3000, 1, (2,)),
    ),
    copies=(12,),
    state_writes=(12,),
)

QUICK_FIT = Grid(
    prefill=(PrefillProbe(128, (0, 256)), PrefillProbe(256, (0,))),
    decode=(
        DecodeProbe(256, 2, (1, 3), mixed=((2, 128),), turns=((2, 2, 32),)),
        DecodeProbe(256, 0, (2,)),
    ),
    copies=(4,),
    state_writes=(4,),
)
QUICK_HELD_OUT = Grid(
    prefill=(PrefillProbe(192, (0,)),),
    decode=(DecodeProbe(384, 2, (2,)),),
    copies=(),
    state_writes=(),
)


@dataclass(frozen=True)
class CalibrateOptions:
    """What `hycache calibrate` runs: the engine model, torch threads, repeats per shape, the
    cache geometry of the probes, and the grids (`quick`: a smoke-test size)."""

    model: str = "tiny"
    threads: int = 1
    repeats: int = 5
    knobs: CacheKnobs = field(default_factory=lambda: CacheKnobs(552, 8))  # the probes' cache
    dtype: str = "float32"
    seed: int = 0
    quick: bool = False
    clock: str = "wall"  # what the fit matches: "wall", or "cpu" (process CPU time)
    grid: Grid = FIT_GRID
    held_out: Grid = HELD_OUT_GRID
    device: str = "cpu"
    cache_memory_gb: float = 0.5
    # decode (verify) steps take `decode_repeats` x `repeats`: they last 10-60 ms on a CPU
    # and spread 30-60% from one step to the next, while each costs little beside the
    # prefill that sets it up
    decode_repeats: int = 4
    vocab: int = VOCAB
    # a (model, config) made by the caller and reused by every probe (the GPU script's
    # random-weight Bamba-9B); None: `model` is loaded by name for each probe
    build: Callable[[], tuple[Any, Any]] | None = field(default=None, compare=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def run_knobs(self) -> CacheKnobs:
        """The knobs the probes run with (`quick`: 64-token blocks; policy `limit`)."""
        knobs = self.knobs.replace(block_size=64) if self.quick else self.knobs
        return knobs.replace(policy="limit")

    def grids(self) -> tuple[Grid, Grid]:
        return (QUICK_FIT, QUICK_HELD_OUT) if self.quick else (self.grid, self.held_out)


# -- the device --------------------------------------------------------------------------------


def measure_device(
    threads: int, device: str = "cpu", dtype: str = "float32", clock: str = "wall"
) -> GpuSpec:
    """Peak FLOP/s (a square matrix product in `dtype`: 1024 on a CPU, 8192 on a GPU; best of
    5) and memory bandwidth (a copy, read + written: 64 MiB on a CPU, 4 GiB on a GPU; best
    of 5) on `threads` torch threads, timed by `clock` (``"cpu"``: process CPU time, so
    that a machine shared with other work does not halve the peaks)."""
    import torch

    from hycache.engine.build import DTYPES

    torch.set_num_threads(threads)
    tick = time.process_time if clock == "cpu" and device == "cpu" else time.perf_counter
    gpu = device != "cpu"
    n = 8192 if gpu else 1024
    a = torch.randn(n, n, device=device).to(DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(DTYPES[dtype])
    best = float("inf")
    for _ in range(6):
        t0 = tick()
        a @ b
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, tick() - t0)
    flops = 2.0 * n**3 / best
    src = torch.empty((1 << 30) if gpu else (16 << 20), device=device)  # float32
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(6):
        t0 = tick()
        dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, tick() - t0)
    bandwidth = 2.0 * src.numel() * 4 / best
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return GpuSpec(
        name=f"{device}-{threads}t",
        peak_flops=flops,
        hbm_bandwidth=bandwidth,
        memory_bytes=memory,
        description=f"{device}, {threads} torch thread(s), measured by hycache calibrate",
        source=f"peak_flops: a {n}^3 {dtype} matmul; hbm_bandwidth: a "
        f"{src.numel() * 4 >> 20} MiB copy (best of 5)",
    )


# -- timing steps ------------------------------------------------------------------------------


@dataclass
class _Timer:
    """Times `LLM.step()` calls and files each under a label."""

    llm: Any
    steps: dict[str, list[tuple[StepWork, float, float]]] = field(default_factory=dict)
    cpu: float = 0.0
    wall: float = 0.0
    seen: LastSchedule = field(default_factory=LastSchedule)  # no cycle back to the engine

    def __post_init__(self) -> None:
        self.llm.add_step_observer(self.seen)

    @property
    def last(self) -> Any:
        """The last step's `SchedulerOutput`."""
        return self.seen.last

    def step(self, label: str | None = None) -> list[Any]:
        from hycache.sim.cluster import step_work

        c0, t0 = time.process_time(), time.perf_counter()
        events = self.llm.step()
        _sync(self.llm.model.device)
        t1, c1 = time.perf_counter(), time.process_time()
        self.wall += t1 - t0
        self.cpu += c1 - c0
        if label is not None:
            work = step_work(self.last, self.llm.config.cache.block_size)
            self.steps.setdefault(label, []).append((work, t1 - t0, c1 - c0))
        return events


def _sync(device: Any) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _sample(label: str, runs: list[tuple[StepWork, float, float]], k: int, kind: str) -> Sample:
    """The median of a shape's repeats; its work is the middle repeat's (contexts drift by a
    few tokens from one decode step to the next)."""
    walls = [w for _, w, _ in runs]
    med = statistics.median(walls)
    return Sample(
        label=label,
        work=runs[len(runs) // 2][0],
        num_speculative_tokens=k,
        wall_s=med,
        cpu_s=statistics.median(c for *_, c in runs),
        repeats=len(runs),
        spread=(max(walls) - min(walls)) / med,
        load=os.getloadavg()[0],
        kind=kind,
    )


_BUILT: dict[int, tuple[Any, Any]] = {}


def _engine(o: CalibrateOptions, k: int, max_len: int, **kw: Any) -> Any:
    from hycache.engine.engine import LLM

    if o.build is not None:
        if id(o.build) not in _BUILT:
            _BUILT.clear()
            _BUILT[id(o.build)] = o.build()
        kw["prebuilt"] = _BUILT[id(o.build)]
    return LLM(
        o.model,
        dtype=o.dtype,
        knobs=o.run_knobs,
        max_model_len=max_len,
        num_speculative_tokens=k,
        seed=o.seed,
        cache_memory_gb=o.cache_memory_gb,
        device=o.device,
        **kw,
    )


def _all_decoding(sched: Any) -> bool:
    return all(r.num_computed_tokens >= r.num_prompt_tokens for r in sched.running)


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def _prefill(o: CalibrateOptions, p: PrefillProbe, rng: random.Random) -> list[Sample]:
    from hycache.request import SamplingParams

    prompt = max(p.contexts) + p.chunk
    llm = _engine(
        o, p.k, prompt + 8, max_num_batched_tokens=p.chunk, max_num_seqs=1,
        enable_prefix_caching=False,
    )  # fmt: skip
    timer = _Timer(llm)
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    llm.generate([_tokens(rng, min(prompt, 64), o.vocab)], one)  # warm-up
    want = {(p.chunk, c): f"prefill n={p.chunk} c={c} k={p.k}" for c in p.contexts}
    for _ in range(o.repeats):
        llm.add_request(_tokens(rng, prompt, o.vocab), one)
        while llm.scheduler.has_unfinished():
            s = llm.scheduler.running[0] if llm.scheduler.running else None
            start = s.num_computed_tokens if s is not None else 0
            timer.step(want.get((p.chunk, start)))
    out = []
    for label in want.values():
        runs = [r for r in timer.steps.get(label, []) if r[0].num_tokens == p.chunk]
        if runs:
            out.append(_sample(label, runs, p.k, "step"))
    return out


def _decode(
    o: CalibrateOptions, p: DecodeProbe, rng: random.Random, accepted: dict[int, list[int]]
) -> list[Sample]:
    """Decode (and mixed) shapes over distinct contexts; adds (tokens produced, verify steps)
    per k to `accepted`.

    The largest batch's requests are prefilled first, each over `p.context` tokens of its
    own (no two share a block: a batch reads as many distinct K/V bytes as a real one), or
    with `p.shared` as siblings of one prefix a producer prefilled (they read the same
    blocks, warm in the caches by the second request). The batch then shrinks, by aborting
    requests, through the other sizes, largest first; each size decodes, then takes the
    mixed steps it has."""
    from hycache.request import SamplingParams

    mixed = dict(p.mixed)
    turns = {b: (n, t) for b, n, t in p.turns}
    sizes = sorted({*p.batches, *mixed, *turns}, reverse=True)
    decodes = o.repeats * o.decode_repeats
    steps = sum(
        decodes + 1 + (o.repeats if b in mixed else 0) + (o.repeats if b in turns else 0)
        for b in sizes
    )
    n_out = steps * (p.k + 1) + 8
    longest = max(mixed.values(), default=0) + o.run_knobs.unit + 8
    turn_len = p.context + 8 * p.shared + max((t for _, t in turns.values()), default=0)
    max_len = max(p.context + 8 * p.shared + n_out + 16, longest, turn_len + 16)
    llm = _engine(
        o, p.k, max_len, max_num_batched_tokens=8192,
        max_num_seqs=sizes[0] + max([1, *(n for n, _ in turns.values())]),
    )  # fmt: skip
    timer = _Timer(llm)
    sched = llm.scheduler
    sp = SamplingParams(max_tokens=n_out, ignore_eos=True)
    if p.shared:
        prefix = _tokens(rng, p.context, o.vocab)
        llm.generate([prefix], SamplingParams(max_tokens=1, ignore_eos=True))  # the producer
        prompts = [prefix + _tokens(rng, 8, o.vocab) for _ in range(sizes[0])]
    else:
        prompts = [_tokens(rng, p.context, o.vocab) for _ in range(sizes[0])]
    ids = [llm.add_request(prompt, sp) for prompt in prompts]
    while not (len(sched.running) == sizes[0] and _all_decoding(sched)):
        timer.step()
    out: list[Sample] = []
    for b in sizes:
        while len(ids) > b:
            llm.abort(ids.pop())
        timer.step()  # the first step after a shrink settles the freed blocks
        label = f"decode b={b} c={p.context} k={p.k}" + (" shared" if p.shared else "")
        if b in p.batches:
            for _ in range(decodes):
                events = timer.step(label)
                if p.k:
                    tally = accepted.setdefault(p.k, [0, 0])
                    tally[0] += sum(len(e.new_token_ids) for e in events)
                    tally[1] += len(timer.last.scheduled)
            runs = [
                r
                for r in timer.steps.pop(label)
                if len(r[0].seqs) == b and all(s.num_draft_tokens == p.k for s in r[0].seqs)
            ]
            if runs:
                out.append(_sample(label, runs, p.k, "step"))
        if b in mixed:
            n = mixed[b]
            mlabel = f"mixed b={b} c={p.context} + prefill {n} k={p.k}"
            one = SamplingParams(max_tokens=1, ignore_eos=True)
            for _ in range(o.repeats):
                # n tokens in one chunk (its checkpoints are written inside the forward)
                llm.add_request(_tokens(rng, n, o.vocab), one)
                timer.step(mlabel)
            runs = [
                r
                for r in timer.steps.pop(mlabel)
                if len(r[0].seqs) == b + 1 and r[0].seqs[-1].num_new_tokens == n
            ]
            if runs:
                out.append(_sample(mlabel, runs, p.k, "step"))
        if b in turns:
            out.extend(_turns(llm, timer, p, b, *turns[b], prompts, o, rng))
    for rid in ids:
        llm.abort(rid)
    return out


def _turns(
    llm: Any, timer: _Timer, p: DecodeProbe, b: int, chunks: int, tokens: int,
    prompts: list[list[int]], o: CalibrateOptions, rng: random.Random,
) -> list[Sample]:  # fmt: skip
    """`chunks` next turns join one step of `b` decoding requests, each repeat: turn j's
    prompt is a decoding request's own prompt and `tokens` new ones (its context a cache
    hit, so a short chunk at about `p.context`)."""
    from hycache.request import SamplingParams

    one = SamplingParams(max_tokens=1, ignore_eos=True)
    label = f"turns b={b} c={p.context} + {chunks}x{tokens} k={p.k}"
    for rep in range(o.repeats):
        for j in range(chunks):
            history = prompts[(rep * chunks + j) % b]
            llm.add_request(history + _tokens(rng, tokens, o.vocab), one)
        timer.step(label)
    runs = [
        r
        for r in timer.steps.pop(label)
        if len(r[0].seqs) == b + chunks
        and all(s.is_prefill and s.context_len > 0 for s in r[0].seqs[b:])
    ]
    return [_sample(label, runs, p.k, "step")] if runs else []


def _copies(o: CalibrateOptions, counts: Sequence[int], states: bool) -> list[Sample]:
    """Block copies (attention K/V, the drafter's too) or SSM state copies, timed alone."""
    if not counts:
        return []
    llm = _engine(o, 2, 4096, max_num_seqs=4)
    runner = llm.runner
    out = []
    for n in counts:
        runs = []
        for rep in range(o.repeats + 1):
            pairs = [(2 * i + 1, 2 * i + 2) for i in range(rep, rep + n)]
            c0, t0 = time.process_time(), time.perf_counter()
            for src, dst in pairs:
                if states:
                    runner.states.copy_slot(src, dst)
                else:
                    for kv in (runner.kv, runner.draft_kv):
                        kv.copy_block(src, dst)
            t1, c1 = time.perf_counter(), time.process_time()
            if rep:  # the first batch warms the caches up
                runs.append((StepWork((), num_block_copies=n), t1 - t0, c1 - c0))
        kind = "state_writes" if states else "copies"
        out.append(_sample(f"{kind.replace('_', ' ')} n={n}", runs, 2, kind))
    return out


def _probes(
    o: CalibrateOptions, grid: Grid, accepted: dict[int, list[int]] | None = None
) -> list[tuple[str, Callable[[], list[Sample]]]]:
    """Every shape of `grid` as (what it is, how to measure it), in the grid's order; the
    grid's prompts come from one generator seeded with `o.seed` (`accepted`: see
    `_decode`)."""
    rng = random.Random(o.seed)
    tally = {} if accepted is None else accepted
    out: list[tuple[str, Callable[[], list[Sample]]]] = [
        (f"prefill chunks of {p.chunk} (k={p.k})", partial(_prefill, o, p, rng))
        for p in grid.prefill
    ]
    out += [
        (f"decode at {d.context} (k={d.k}, batches {d.batches})",
         partial(_decode, o, d, rng, tally))
        for d in grid.decode
    ]  # fmt: skip
    if grid.copies:
        out.append(("block copies", partial(_copies, o, grid.copies, False)))
    if grid.state_writes:
        out.append(("state writes", partial(_copies, o, grid.state_writes, True)))
    return out


def measure_grids(
    o: CalibrateOptions,
    fit_grid: Grid,
    held_grid: Grid,
    progress: Progress,
    accepted: dict[int, list[int]] | None = None,
) -> tuple[list[Sample], list[Sample]]:
    """Both grids' shapes, the held-out ones spread evenly among the fitted ones (so a
    machine whose speed drifts over the minutes a round takes drifts under both alike; one
    after the other, the held-out block came last and ran up to 30% slower than the fitted
    shapes around it had); (fitted samples, held-out samples). `accepted` counts the fitted
    grid's drafts."""
    fit, held = _probes(o, fit_grid, accepted), _probes(o, held_grid)
    # merge by relative position: fitted shape i at (i + 0.5) / n, held-out j at (j + 0.5) / m
    order = sorted(
        [((i + 0.5) / len(fit), 0, i) for i in range(len(fit))]
        + [((j + 0.5) / len(held), 1, j) for j in range(len(held))]
    )
    out: tuple[list[Sample], list[Sample]] = ([], [])
    for _, which, i in order:
        label, run = (fit, held)[which][i]
        part = ("fitted", "held out")[which]
        progress(f"{part} {i + 1}/{len((fit, held)[which])}: {label}")
        out[which].extend(run())
    return out


@contextmanager
def _threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def acceptance_rate(k: int, tokens_per_step: float) -> float:
    """The per-draft acceptance `p` (drafts accepted in a row, as the simulator draws them)
    whose expected tokens per verify step, 1 + p + ... + p^k, is `tokens_per_step`."""
    target = tokens_per_step - 1.0
    if target <= 0:
        return 0.0
    if target >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**j for j in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass
class Measured:
    """What `measure` timed: the device, the fitted and held-out shapes, and where."""

    gpu: GpuSpec
    fitted: list[Sample]
    held_out: list[Sample]
    conditions: Conditions

    @property
    def block_size(self) -> int:
        return int(self.conditions.extra["block_size"])

    @property
    def clock(self) -> str:
        return str(self.conditions.extra.get("clock", "wall"))

    def fit(self, model: ModelSpec, more: Sequence[Sample] = ()) -> Fit:
        """The fitted shapes (and `more` samples) fitted at these probes' block size and
        clock; the engine pads decode/verify attention to the step's longest context
        (model/layers.py)."""
        samples = [*self.fitted, *more]
        return fit(samples, model, self.gpu, block_size=self.block_size, clock=self.clock,
                   padded=True)  # fmt: skip

    def residuals(self, samples: Sequence[Sample], values: Fit, model: ModelSpec) -> list[Residual]:
        """`samples` priced by `values` on these probes' block size and clock."""
        return residuals(samples, values, model, self.gpu, self.block_size, self.clock)


def measure(o: CalibrateOptions, progress: Progress) -> Measured:
    """Measure the device and both grids (on `o.threads` torch threads)."""
    import torch

    if o.repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {o.repeats}")
    if o.decode_repeats < 1:
        raise ValueError(f"decode_repeats must be >= 1, got {o.decode_repeats}")
    if o.threads < 1:
        raise ValueError(f"threads must be >= 1, got {o.threads}")
    fit_grid, held_grid = o.grids()
    t0, c0 = time.perf_counter(), time.process_time()
    load0 = os.getloadavg()[0]
    with _threads(o.threads), torch.inference_mode():
        progress("measuring the device")
        dtype = "bfloat16" if o.device != "cpu" else "float32"
        gpu = measure_device(o.threads, o.device, dtype, o.clock)
        accepted: dict[int, list[int]] = {}
        fitted, held = measure_grids(o, fit_grid, held_grid, progress, accepted)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    cond = Conditions(
        device=o.device,
        threads=o.threads,
        dtype=o.dtype,
        torch_version=str(torch.__version__),
        load_before=load0,
        load_after=os.getloadavg()[0],
        cpu_over_wall=cpu / wall if wall else 0.0,
        wall_s=wall,
        extra={
            "block_size": o.run_knobs.block_size,
            "prefix_match_unit": o.knobs.prefix_match_unit,
            "repeats": o.repeats,
            "decode_repeats": o.repeats * o.decode_repeats,
            "cores": os.cpu_count() or 0,
            "clock": o.clock,
            # per k: the per-draft acceptance of the engine's drafter on the probes' random
            # prompts (what `--acceptance-rate` should be to simulate this engine)
            "acceptance_rate": {
                str(k): acceptance_rate(k, tokens / steps)
                for k, (tokens, steps) in accepted.items()
            },
        },
    )
    return Measured(gpu, fitted, held, cond)


def pool(rounds: Sequence[Measured]) -> Measured:
    """Rounds of `measure` taken at different times (between the runs of a validation) as
    one measurement: per shape, the median of the rounds' medians (the spread beside it is
    across rounds); the device's peaks and the drafter's acceptance, their medians too."""
    if not rounds:
        raise ValueError("pool: no rounds")

    def samples(lists: Sequence[Sequence[Sample]]) -> list[Sample]:
        by_label: dict[str, list[Sample]] = {}
        for group in lists:
            for s in group:
                by_label.setdefault(s.label, []).append(s)
        out = []
        for ss in by_label.values():
            walls = [s.wall_s for s in ss]
            med = statistics.median(walls)
            out.append(
                replace(
                    ss[0],
                    wall_s=med,
                    cpu_s=statistics.median(s.cpu_s for s in ss),
                    repeats=sum(s.repeats for s in ss),
                    spread=(max(walls) - min(walls)) / med,
                    load=statistics.mean(s.load for s in ss),
                )
            )
        return out

    first, last = rounds[0].conditions, rounds[-1].conditions
    rates: dict[str, list[float]] = {}
    for m in rounds:
        for k, v in m.conditions.extra.get("acceptance_rate", {}).items():
            rates.setdefault(k, []).append(v)
    conditions = replace(
        first,
        load_after=last.load_after,
        cpu_over_wall=statistics.mean(m.conditions.cpu_over_wall for m in rounds),
        wall_s=sum(m.conditions.wall_s for m in rounds),
        extra={
            **first.extra,
            "rounds": len(rounds),
            "repeats": sum(int(m.conditions.extra.get("repeats", 0)) for m in rounds),
            "acceptance_rate": {k: statistics.median(v) for k, v in rates.items()},
        },
    )
    gpu = replace(
        rounds[0].gpu,
        peak_flops=statistics.median(m.gpu.peak_flops for m in rounds),
        hbm_bandwidth=statistics.median(m.gpu.hbm_bandwidth for m in rounds),
    )
    fitted = samples([m.fitted for m in rounds])
    held = samples([m.held_out for m in rounds])
    return Measured(gpu, fitted, held, conditions)


def calibrate(o: CalibrateOptions, progress: Progress, command: str = "") -> Profile:
    """Measure (`measure`), fit on the fitted grid, and return the device profile
    (`hycache.sim.fit.Profile`; its file is `Profile.to_json()`)."""
    m = measure(o, progress)
    return profile_from(m, o.model, progress, command)


def profile_from(m: Measured, model_name: str, progress: Progress, command: str) -> Profile:
    """Fit `m.fitted` and build the profile, residuals of both grids and the ablation
    included."""
    model = load_model_spec(model_name)
    values = m.fit(model)
    progress("fitted; the ablation")
    rows, held_rows = m.residuals(m.fitted, values, model), m.residuals(m.held_out, values, model)
    why = ablation(m.fitted, model, m.gpu, block_size=m.block_size, clock=m.clock, padded=True)
    return Profile(m.gpu, values, model_name, tuple(rows), tuple(held_rows), m.conditions,
                   command, why)  # fmt: skip
