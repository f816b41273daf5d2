"""Timing the engine's steps: each probe of a grid run on a fresh engine (`_prefill`,
`_decode` with its `_mixed` and `_turns` steps, `_copies`), every step timed around `LLM.step()`
and its work read from the step's schedule (`_Timer`), a shape's repeats reduced to a `Sample`;
`measure_grids` runs both grids' probes interleaved.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from hycache.bench.calibrate.options import (
    CalibrateOptions,
    DecodeProbe,
    Grid,
    PrefillProbe,
    Progress,
)
from hycache.engine.outputs import LastSchedule
from hycache.sim.costmodel import StepWork
from hycache.sim.fit import Sample

if TYPE_CHECKING:
    from hycache.engine.engine import LLM


@dataclass
class _Timer:
    """Times `LLM.step()` calls and files each under a label."""

    llm: LLM
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
        self.llm.synchronize()
        t1, c1 = time.perf_counter(), time.process_time()
        self.wall += t1 - t0
        self.cpu += c1 - c0
        if label is not None:
            work = step_work(self.last, self.llm.config.cache.block_size)
            self.steps.setdefault(label, []).append((work, t1 - t0, c1 - c0))
        return events


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


def _engine(o: CalibrateOptions, k: int, max_len: int, **kw: Any) -> LLM:
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


def _all_decoding(llm: LLM, batch: int) -> bool:
    """`batch` requests run, every one past its prompt."""
    running = llm.running()
    return len(running) == batch and all(r.prefilled for r in running)


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
        while llm.has_unfinished():
            running = llm.running()
            start = running[0].num_computed_tokens if running else 0
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
    sp = SamplingParams(max_tokens=n_out, ignore_eos=True)
    if p.shared:
        prefix = _tokens(rng, p.context, o.vocab)
        llm.generate([prefix], SamplingParams(max_tokens=1, ignore_eos=True))  # the producer
        prompts = [prefix + _tokens(rng, 8, o.vocab) for _ in range(sizes[0])]
    else:
        prompts = [_tokens(rng, p.context, o.vocab) for _ in range(sizes[0])]
    ids = [llm.add_request(prompt, sp) for prompt in prompts]
    while not _all_decoding(llm, sizes[0]):
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
            out.extend(_mixed(llm, timer, p, b, mixed[b], o, rng))
        if b in turns:
            out.extend(_turns(llm, timer, p, b, *turns[b], prompts, o, rng))
    for rid in ids:
        llm.abort(rid)
    return out


def _mixed(
    llm: LLM, timer: _Timer, p: DecodeProbe, b: int, n: int, o: CalibrateOptions,
    rng: random.Random,
) -> list[Sample]:  # fmt: skip
    """A fresh request's prefill chunk of `n` tokens joins one step of `b` decoding requests,
    each repeat (its checkpoints are written inside the forward)."""
    from hycache.request import SamplingParams

    label = f"mixed b={b} c={p.context} + prefill {n} k={p.k}"
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    for _ in range(o.repeats):
        llm.add_request(_tokens(rng, n, o.vocab), one)
        timer.step(label)
    runs = [
        r
        for r in timer.steps.pop(label)
        if len(r[0].seqs) == b + 1 and r[0].seqs[-1].num_new_tokens == n
    ]
    return [_sample(label, runs, p.k, "step")] if runs else []


def _turns(
    llm: LLM, timer: _Timer, p: DecodeProbe, b: int, chunks: int, tokens: int,
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
    out = []
    for n in counts:
        runs = []
        for rep in range(o.repeats + 1):
            pairs = [(2 * i + 1, 2 * i + 2) for i in range(rep, rep + n)]
            c0, t0 = time.process_time(), time.perf_counter()
            if states:
                llm.copy_state_slots(pairs)
            else:
                llm.copy_blocks(pairs)
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
