"""The plugin priced on vLLM's real pass structure (`hycache bench vllm`, issue 45 item 1).

vLLM's real scheduler (0.33 or 0.34, whichever is installed; `hycache.bench.vllm.reference`)
runs a bench workload closed-loop at a concurrency, one arm at a time (its first requests, a
chat's sessions, all at once, or arriving at a Poisson rate as `vllm bench serve
--request-rate R --max-concurrency C` sends them): stock vLLM, stock with
`enable_mamba_shared_prefix_checkpoint` (with a drafter: the flag needs one), and
`hycache.vllm.SyncScheduler`, its stops priced by the same cost model (or its default
price). Every step vLLM schedules is costed with the simulator's cost model
(`hycache.sim.costmodel.CostModel.step_time` of what the step computes: each request's new
tokens over its cached context, drafts verified, block copies), and a virtual clock advances
by it:

    workload (hycache.sim.workloads) ──▶ vllm Scheduler.schedule ──▶ StepWork ──▶ CostModel
      closed loop: `concurrency` requests in flight,     │ scripted model: each request samples
      a chat turn ready when its previous one ends       │ its answer, drafts verify at the
                                                         ▼ acceptance rate (Bresenham, per request)
                     output tok/s, TTFT p50/p95, prefill passes per request, prefill tokens, hits

Nothing runs a model: what is priced is vLLM's own schedule (its chunk ends, its hits, its
preemptions) for each arm, so the only difference between arms is the scheduler class.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hycache.bench.repeats import spread
from hycache.bench.vllm.reference import NEMOTRON_H, QWEN3_NEXT, ReferenceScheduler, VllmSetup
from hycache.bench.vllm.scenario import VOCAB, propose, verify
from hycache.config import CacheKnobs
from hycache.sim.build import build_cost
from hycache.sim.costmodel import CostModel, SeqWork, StepWork
from hycache.sim.workloads import (
    ChatShape,
    FamilyShape,
    RequestSpec,
    SessionSpec,
    SystemPromptShape,
    poisson_times,
)
from hycache.vllm import compat

PLUGIN = "hycache.vllm.SyncScheduler"
ARMS = ("stock", "stock+flag", "plugin")
WORKLOADS = ("system-prompt", "family", "multi-turn")
CONCURRENCY = (1, 16, 64)

# The bench's shapes: the simulator's (`hycache.sim.workloads`) with fewer requests, so that
# three arms x three concurrencies x three workloads run in minutes on two busy cores (vLLM's
# scheduler is Python: a decode step of one request costs it about a millisecond). Prompt,
# suffix and output lengths are the simulator's.
SHAPES: dict[str, Any] = {
    "system-prompt": SystemPromptShape(num_requests=64),
    "family": FamilyShape(families=8),
    "multi-turn": ChatShape(sessions=64, turns=(2, 4)),
}
# `--quick` (and the tests): the same shapes, shorter and fewer
QUICK_SHAPES: dict[str, Any] = {
    "system-prompt": SystemPromptShape(num_requests=6, output_tokens=8),
    "family": FamilyShape(
        families=2, requests_per_family=3, suffix_tokens=(128, 512), output_tokens=8,
        shared_prefix_tokens=(2_000, 12_000),
    ),
    "multi-turn": ChatShape(sessions=3, turns=2, output_tokens=8, user_tokens=(32, 256)),
}  # fmt: skip

# Each model's vLLM deployment: the harness's KV cache config (`reference.MODELS`), the block
# size vLLM picks, the GPU it is priced on, and its pool (None: the pages the cost model fits
# in the GPU's memory). Qwen3-Next-80B-A3B's bfloat16 weights (159.5 GB) do not fit an H200's
# 141 GB: it is priced on a B200, where 175 pages (100,800 tokens) are left, too few for
# sixteen 64k-token prompts; deployed, it runs on two GPUs or more, so its pool holds the
# workload (4,096 pages) while its steps are priced on one B200's roofline.
MODELS: dict[str, tuple[str, int, str, int | None]] = {
    "nemotron-h-8b": (NEMOTRON_H, 4416, "h200", None),
    "bamba-9b": (NEMOTRON_H, 4416, "h200", None),
    "qwen3-next-80b-a3b": (QWEN3_NEXT, 576, "b200", 4096),
}


@dataclass(frozen=True)
class PricedBench:
    """One `hycache bench vllm` run: a model (its cost preset; `MODELS` gives vLLM's KV cache
    config, block size and GPU), the drafter, vLLM's budget, and what to run."""

    model: str = "nemotron-h-8b"
    gpu: str | None = None  # None: the model's (`MODELS`)
    block_size: int | None = None  # None: the one vLLM picks for the model (`MODELS`)
    unit: int = 64
    num_speculative_tokens: int = 1
    acceptance_rate: float = 0.7
    budget: int = 8192
    concurrency: tuple[int, ...] = CONCURRENCY
    workloads: tuple[str, ...] = WORKLOADS
    quick: bool = False
    seed: int = 0
    # what prices the plugin's stops: "model", the cost model the steps are priced with (what
    # a deployment's `--additional-config` price stands for); "default", the plugin's
    # `DEFAULT_PRICE` (a pass = 96 prefill tokens: a 9B hybrid on an H200)
    price: str = "model"
    only_arms: tuple[str, ...] = ()  # `--arm`: these of `arms` only (); every arm)
    # `--request-rate`: the first requests (a chat's sessions; each later turn follows its
    # previous one) arrive at this Poisson rate per second, admitted while fewer than the
    # concurrency are in flight, TTFT counted from admission (`vllm bench serve
    # --request-rate R --max-concurrency C`); inf: all at once (its default)
    request_rate: float = math.inf

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"--model: one of {', '.join(MODELS)}, got {self.model!r}")
        bad = [w for w in self.workloads if w not in WORKLOADS]
        if bad:
            raise ValueError(f"--workload: one of {', '.join(WORKLOADS)}, got {bad[0]!r}")
        if not 0.0 <= self.acceptance_rate <= 1.0:
            raise ValueError(f"acceptance rate must lie in [0, 1], got {self.acceptance_rate}")
        if self.price not in ("model", "default"):
            raise ValueError(f"--price: model or default, got {self.price!r}")
        if not self.request_rate > 0:
            raise ValueError(f"request rate must be > 0 per second, got {self.request_rate}")
        if any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        bad = [a for a in self.only_arms if a not in ARMS]
        if bad:
            raise ValueError(f"--arm: one of {', '.join(ARMS)}, got {bad[0]!r}")
        if "stock+flag" in self.only_arms and not self.num_speculative_tokens:
            raise ValueError("--arm stock+flag needs a drafter (vLLM's junction flag is EAGLE's)")

    @property
    def harness_model(self) -> str:
        return MODELS[self.model][0]

    @property
    def b(self) -> int:
        return self.block_size or MODELS[self.model][1]

    @property
    def gpu_name(self) -> str:
        return self.gpu or MODELS[self.model][2]

    @property
    def arms(self) -> tuple[str, ...]:
        """The arms run, in `ARMS`' order: those `only_arms` names, or all. The flag needs a
        drafter (vLLM's junction stop is an EAGLE feature)."""
        arms = ARMS if self.num_speculative_tokens else ("stock", "plugin")
        return tuple(a for a in arms if a in self.only_arms) if self.only_arms else arms

    def num_blocks(self, cost: CostModel) -> int:
        return MODELS[self.model][3] or cost.num_blocks(self.b)

    def cost(self) -> CostModel:
        return build_cost(
            self.model,
            self.gpu_name,
            num_speculative_tokens=self.num_speculative_tokens,
            block_size=self.b,
        )

    def setup(self, arm: str, num_blocks: int) -> VllmSetup:
        return VllmSetup(
            CacheKnobs(self.b, self.unit),
            self.budget,
            num_speculative_tokens=self.num_speculative_tokens,
            shared_prefix_checkpoint=arm == "stock+flag",
            num_blocks=num_blocks,
            scheduler_cls=PLUGIN if arm == "plugin" else None,
            model=self.harness_model,
        )

    def shape(self, workload: str) -> Any:
        return (QUICK_SHAPES if self.quick else SHAPES)[workload]

    def arrivals(self, n: int) -> list[float]:
        """When each of `n` first requests arrives (seconds): all at 0 at an infinite rate,
        else a Poisson process from 0 (seeded by `seed`, the same for every arm)."""
        if math.isinf(self.request_rate):
            return [0.0] * n
        return [float(t) for t in poisson_times(n, self.request_rate, self.seed + 2)]


@dataclass
class Job:
    """One request the closed loop sends: its prompt and scripted answer; a chat turn also
    names its session and turn (the next turn's prompt holds this answer)."""

    prompt: list[int]
    answer: list[int]
    session: SessionSpec | None = None
    turn: int = 0
    outputs: list[np.ndarray] = field(default_factory=list)  # the session's earlier answers


def _answer(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def jobs_of(workload: Any, seed: int) -> tuple[list[Job], bool]:
    """The workload's first jobs, in arrival order, and whether they are chat turns (each
    followed by its session's next turn once it finishes)."""
    rng = random.Random(seed)
    built = workload.build(seed)
    if built and isinstance(built[0], SessionSpec):
        sessions: Sequence[SessionSpec] = built
        return [_turn(s, 0, [], rng) for s in sessions], True
    reqs: Sequence[RequestSpec] = built
    return [Job(r.prompt_token_ids.tolist(), _answer(rng, r.max_tokens)) for r in reqs], False


def _turn(s: SessionSpec, t: int, outputs: list[np.ndarray], rng: random.Random) -> Job:
    prompt = s.prompt_for_turn(t, outputs).tolist()
    return Job(prompt, _answer(rng, s.output_tokens[t]), s, t, outputs)


@dataclass
class ArmResult:
    """One arm at one concurrency: seconds of the virtual clock, tokens, and per request its
    TTFT, prefill passes, the priced seconds of those passes, and its hit."""

    arm: str
    concurrency: int
    seconds: float = 0.0
    output_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    ttft: list[float] = field(default_factory=list)  # in finishing order
    passes: list[int] = field(default_factory=list)
    pass_seconds: list[float] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        ttft = np.asarray(self.ttft) if self.ttft else np.zeros(1)
        return {
            "arm": self.arm,
            "concurrency": self.concurrency,
            "requests": len(self.ttft),
            "output_tok_s": self.output_tokens / self.seconds if self.seconds else 0.0,
            "ttft_p50_s": float(np.percentile(ttft, 50)),
            "ttft_p95_s": float(np.percentile(ttft, 95)),
            "passes_per_request": float(np.mean(self.passes)) if self.passes else 0.0,
            "prefill_tokens": self.prefill_tokens,
            "hit_tokens": sum(self.hits),
            "preemptions": self.preemptions,
            "seconds": self.seconds,
        }


def accepted(k: int, rate: float, n: int) -> int:
    """How many of a request's `n`-th proposal's k drafts verify: Bresenham over the
    acceptance rate, so every request accepts `rate * k` drafts on average whatever the
    schedule."""
    return min(k, int((n + 1) * rate * k) - int(n * rate * k))


class _ClosedLoop:
    """One arm's closed loop (`run_arm`): requests admitted up to the concurrency, each step
    vLLM schedules priced, answers and drafts fed back."""

    def __init__(
        self, bench: PricedBench, arm: str, workload: Any, concurrency: int, cost: CostModel,
        num_blocks: int,
    ) -> None:  # fmt: skip
        self.ref = ReferenceScheduler(bench.setup(arm, num_blocks))
        self.s, self.k = self.ref.scheduler, bench.num_speculative_tokens
        if arm == "plugin" and bench.price == "model":
            # the price a deployment configures for its GPU (`pass_cost`, `token_cost`), here
            # exact: the cost model prices each stop at its context and chunk sizes
            self.s.hycache_pricer = cost
        self.bench, self.cost, self.concurrency = bench, cost, concurrency
        self.result = ArmResult(arm, concurrency)
        pending, self.chat = jobs_of(workload, bench.seed)
        # first requests not yet arrived (when, job), and those arrived or a chat's next turns
        self.arrivals = deque(zip(bench.arrivals(len(pending)), pending, strict=True))
        self.ready: deque[Job] = deque()
        self.rng = random.Random(bench.seed + 1)  # chat answers after the first turns
        self.live: dict[str, tuple[Any, Job, float]] = {}  # id -> (vLLM request, job, arrival)
        self.passes: dict[str, list[float]] = {}  # id -> priced seconds of its prefill passes
        self.proposals: dict[str, int] = {}
        self.first: set[str] = set()
        self.hit: dict[str, int] = {}  # id -> computed tokens when first scheduled
        self.serial = 0

    def admit(self) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        while self.arrivals and self.arrivals[0][0] <= self.result.seconds:
            self.ready.append(self.arrivals.popleft()[1])
        while self.ready and len(self.live) < self.concurrency:
            job = self.ready.popleft()
            rid = f"q{self.serial}"
            self.serial += 1
            sp = SamplingParams(max_tokens=len(job.answer), ignore_eos=True)
            req = Request(rid, job.prompt, sp, None, block_hasher=self.ref.hasher)
            self.s.add_request(req)
            self.live[rid] = (req, job, self.result.seconds)
            self.passes[rid], self.proposals[rid] = [], 0

    def step(self) -> None:
        """One step: schedule, price what it computes, feed back the sampled tokens."""
        out = self.s.schedule()
        ids = list(out.num_scheduled_tokens)
        if not ids:
            raise RuntimeError(
                f"{self.result.arm}: vLLM scheduled nothing with {len(self.live)} requests in"
            )
        seqs, sampled, prefilled = [], [], []
        new = {r.req_id for r in out.scheduled_new_reqs}
        for rid in ids:
            req, job, _ = self.live[rid]
            n = out.num_scheduled_tokens[rid]
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            before = req.num_computed_tokens - n  # schedule() counted this step already
            if rid in new and rid not in self.hit:
                self.hit[rid] = before
            # a prompt chunk (or a preempted request's replay); a decode step computes the
            # last sampled token and the drafts
            prefill = before < req.num_tokens - 1 or not req.num_output_tokens
            seqs.append(SeqWork(n, before, 0 if prefill else len(drafts), prefill))
            if prefill:
                self.result.prefill_tokens += n
                prefilled.append(rid)
            done = req.num_computed_tokens - len(drafts) >= req.num_tokens
            sampled.append(verify(job.answer, req.num_output_tokens, drafts) if done else [])
        copies = len(getattr(out, "kv_cache_block_copies", None) or [])
        step = self.cost.step_time(StepWork(tuple(seqs), num_block_copies=copies))
        self.result.seconds += step
        for rid in prefilled:
            self.passes[rid].append(step)
        self.s.update_from_output(out, compat.model_runner_output(ids, sampled))
        self.feed_back(ids, sampled)

    def feed_back(self, ids: list[str], sampled: list[list[int]]) -> None:
        """Record first tokens and finished requests (queueing a chat's next turn), and
        propose the next drafts."""
        from vllm.v1.outputs import DraftTokenIds

        r = self.result
        drafted_ids, drafted = [], []
        for rid, toks in zip(ids, sampled, strict=True):
            req, job, arrival = self.live[rid]
            if toks and rid not in self.first:
                self.first.add(rid)
                r.ttft.append(r.seconds - arrival)
            r.output_tokens += len(toks)
            if req.is_finished():
                del self.live[rid]
                r.passes.append(len(self.passes[rid]))
                r.pass_seconds.append(sum(self.passes[rid]))
                r.hits.append(self.hit[rid])
                r.preemptions += req.num_preemptions
                if self.chat and job.session is not None and job.turn + 1 < job.session.num_turns:
                    outputs = [*job.outputs, np.asarray(job.answer)]
                    self.ready.append(_turn(job.session, job.turn + 1, outputs, self.rng))
            elif toks and self.k:
                good = accepted(self.k, self.bench.acceptance_rate, self.proposals[rid])
                self.proposals[rid] += 1
                drafted_ids.append(rid)
                drafted.append(propose(job.answer, req.num_output_tokens, self.k, good))
        if drafted_ids:
            self.s.update_draft_token_ids(DraftTokenIds(drafted_ids, drafted))


def run_arm(
    bench: PricedBench,
    arm: str,
    workload: Any,
    concurrency: int,
    cost: CostModel,
    num_blocks: int,
) -> ArmResult:
    """Run `workload` closed-loop at `concurrency` on one arm's vLLM scheduler, pricing every
    step it schedules."""
    loop = _ClosedLoop(bench, arm, workload, concurrency, cost, num_blocks)
    while loop.arrivals or loop.ready or loop.live:
        loop.admit()
        if loop.live:
            loop.step()
        else:  # idle until the next first request arrives
            loop.result.seconds = max(loop.result.seconds, loop.arrivals[0][0])
    return loop.result


def run(bench: PricedBench, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every workload x concurrency x arm: the document `hycache bench vllm` prints and
    writes."""
    cost = bench.cost()
    num_blocks = bench.num_blocks(cost)
    rows = []
    for name in bench.workloads:
        shape = bench.shape(name)
        for c in bench.concurrency:
            for arm in bench.arms:
                if progress is not None:
                    progress(f"{name}, concurrency {c}, {arm}")
                r = run_arm(bench, arm, shape, c, cost, num_blocks)
                rows.append({"workload": name, **r.summary()})
    return {
        "inputs": {
            "vllm": compat.version(),
            "model": bench.model,
            "gpu": bench.gpu_name,
            "block_size": bench.b,
            "unit": bench.unit,
            "num_speculative_tokens": bench.num_speculative_tokens,
            "acceptance_rate": bench.acceptance_rate,
            "budget": bench.budget,
            "num_blocks": num_blocks,
            "price": bench.price,
            "quick": bench.quick,
            "request_rate": None if math.isinf(bench.request_rate) else bench.request_rate,
            "shapes": {w: repr(bench.shape(w)) for w in bench.workloads},
        },
        "rows": rows,
        "ratios": ratios(rows),
    }


def run_draws(
    bench: PricedBench, draws: int, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """`run` on the workload draws `bench.seed`, ..., `bench.seed + draws - 1` (each exact: the
    virtual clock makes a run the same every time, so the spread is the draws', not noise),
    and per cell the ratios' spread over them (`across_draws`)."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    seeds = [bench.seed + i for i in range(draws)]

    def tagged(seed: int) -> Callable[[str], None] | None:
        if progress is None:
            return None
        return lambda msg: progress(f"seed {seed}: {msg}")

    docs = [run(replace(bench, seed=seed), tagged(seed)) for seed in seeds]
    inputs = {**docs[0]["inputs"], "seeds": seeds}
    return {"inputs": inputs, "draws": docs, "across_draws": across_draws(docs)}


def across_draws(docs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and concurrency, plugin / stock over the draws' documents: the median and
    min-max of output tok/s, TTFT p50 and p95 (`hycache.bench.repeats.spread`), and how many
    draws meet the bar."""
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for doc in docs:
        for r in doc["ratios"]:
            cells.setdefault((r["workload"], r["concurrency"]), []).append(r)
    return [
        {
            "workload": w, "concurrency": c, "draws": len(rs), "ok": sum(r["ok"] for r in rs),
            **{k: spread([r[k] for r in rs]) for k in ("output_tok_s", "ttft_p50", "ttft_p95")},
        }
        for (w, c), rs in cells.items()
    ]  # fmt: skip


def ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and concurrency where both ran: the plugin against stock (output tok/s,
    TTFT p50 and p95, hits) and whether the cell meets the acceptance bar (>= 0.99x tok/s,
    <= 1.01x TTFT p50)."""
    out = []
    cells = {(r["workload"], r["concurrency"], r["arm"]): r for r in rows}
    for (w, c, arm), plugin in cells.items():
        stock = cells.get((w, c, "stock"))
        if arm != "plugin" or stock is None:
            continue

        def ratio(key: str, p: dict[str, Any] = plugin, s: dict[str, Any] = stock) -> float:
            return p[key] / s[key] if s[key] else 1.0

        tok, ttft = ratio("output_tok_s"), ratio("ttft_p50_s")
        out.append({
            "workload": w, "concurrency": c, "output_tok_s": tok, "ttft_p50": ttft,
            "ttft_p95": ratio("ttft_p95_s"),
            "hit_tokens": plugin["hit_tokens"] - stock["hit_tokens"],
            "passes_per_request": plugin["passes_per_request"] - stock["passes_per_request"],
            "ok": tok >= 0.99 and ttft <= 1.01,
        })  # fmt: skip
    return out


def quick(bench: PricedBench) -> PricedBench:
    """`--quick`: the small shapes, concurrency 1 and 4."""
    return replace(bench, quick=True, concurrency=(1, 4))
