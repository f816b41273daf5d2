"""`hycache bench --validate PROFILE`: the simulator against the engine it claims to predict.

The same workloads, at the CPU engine's scale, run on the real engine (`tiny` + a random
EAGLE drafter) and in the simulator (hycache's scheduler and cache with the dry-run executor,
its clock the cost model of a calibrated device profile, `hycache calibrate`), `lookahead`
and `limit`, in one run; each repeat steps both policies' engines in turn, each on its own
clock (`hycache.bench.closed_loop`). The simulator gets the engine's own cache config (block
size, unit, the pools the engine sized, the scheduler budget) and, by default, the drafts
each engine run accepted, replayed step by step (which steps accepted a draft, never a time;
its schedule is then the engine's, step for step); beside that prediction, one drawing
drafts at the acceptance rate the profile measured (`at_rate`). No time it is given comes
from the run it predicts.

Workloads (vocabulary 512, the tiny model's), each closed loop at concurrency 8:

* system prompt: `hycache bench`'s engine arm, 12 requests of 7,200 shared + 802 tokens, 32 out;
* random families: 3 families of 3-5 requests, prefixes 1,500-6,000 tokens, suffixes 64-800,
  16-48 out;
* multi-turn chat: 12 sessions of 2-4 turns (35 turns) behind a 1,500-token system prompt,
  user messages 32-400 tokens, answers 16-48. (Six sessions gave 20 turns, and their TTFT
  median fell between a one-step and a two-step cluster of next turns: one turn joining a
  different step moved it 10-20%.)

Both sides are timed by the profile's clock (`wall`: `time.perf_counter`; `cpu`: the
process's CPU time, for a machine shared with other work; the engine runs one torch thread
by default, so the two agree on a quiet machine); the engine's other clock is reported too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from hycache.bench.closed_loop import ClosedLoop, run_interleaved
from hycache.bench.steps import (
    CrossFit,
    EngineStep,
    Priced,
    StepAttribution,
    cross_fit,
    step_attribution,
    ttft_attribution,
)
from hycache.config import CacheKnobs
from hycache.sim import build as sim_build
from hycache.sim.build import DEFAULT_SHAPES, WorkloadSizes, WorkloadSpec
from hycache.sim.costmodel import CostModel
from hycache.sim.presets import GpuSpec, load_gpu, load_model_spec
from hycache.sim.workloads import RequestSpec, Workload

if TYPE_CHECKING:
    from hycache.bench.calibrate import CalibrateOptions
    from hycache.sim.fit import Profile

Progress = Callable[[str], None]

VOCAB = 512
POLICIES: tuple[str, ...] = ("lookahead", "limit")
WORKLOADS: tuple[str, ...] = ("system-prompt", "family", "multi-turn")
METRICS: tuple[tuple[str, str], ...] = (
    ("output tok/s", "output_tokens_per_s"),
    ("TTFT p50 s", "ttft_p50_s"),
    ("TTFT p95 s", "ttft_p95_s"),
    ("token hit rate", "token_hit_rate"),  # the same scheduler on both sides: equal
)


@dataclass(frozen=True)
class ValidateOptions:
    """One validation run. `clock` None: the profile's (`calibration.clock`, else wall)."""

    profile: str
    model: str = "tiny"
    knobs: CacheKnobs = field(default_factory=lambda: CacheKnobs(552, 8))  # each arm: its policy
    num_speculative_tokens: int = 2
    concurrency: int = 8
    max_num_batched_tokens: int = 8192
    threads: int = 1
    repeats: int = 1
    seed: int = 0
    quick: bool = False
    workloads: tuple[str, ...] = WORKLOADS
    policies: tuple[str, ...] = POLICIES
    clock: str | None = None
    acceptance_rate: float | None = None  # None: the profile's measurement (else 0)
    # each engine run and calibration round in a fresh (spawned) interpreter; False: in this
    # process, one after another (faster; what the smallest tests use)
    isolate: bool = True
    # with recalibration: predict each workload with the probes and the other workloads'
    # engine steps fitted (`hycache.bench.steps.cross_fit`); the probes-only prediction
    # is kept beside it
    cross_fit: bool = True
    # with recalibration: a calibration round before every `round_every`-th engine repeat
    # (more engine repeats per round: the runs are short beside a round, and the measured
    # medians and ratios need them on a machine whose speed drifts)
    round_every: int = 1
    # the policies' engines of one repeat in one run, their steps in turn (their ratio then
    # sees the machine in the same states; `hycache.bench.closed_loop`); False: one run
    # after the other
    interleave: bool = True
    # the simulator replays the drafts each engine run accepted ("replay"; the prediction
    # drawn at the profile's rate beside it, `at_rate`), or draws them ("rate")
    acceptance: str = "replay"
    raw: str | None = None  # a pickle of the rounds and every engine step (to refit offline)

    @property
    def run_knobs(self) -> CacheKnobs:
        """The knobs the engines run with (`quick`: 64-token blocks)."""
        return self.knobs.replace(block_size=64) if self.quick else self.knobs


@dataclass(frozen=True)
class MetricError:
    """One metric, measured beside predicted; `error`: predicted / measured - 1 (None when
    nothing was measured)."""

    measured: float
    predicted: float
    error: float | None


@dataclass(frozen=True)
class RatioError:
    """`limit / lookahead` output tok/s both ways, the error in percentage points; `paired`:
    the measured ratio is the median of each repeat's pair (`of_medians` beside it)."""

    measured: float
    predicted: float
    error_pp: float
    of_medians: float
    paired: bool


@dataclass(frozen=True)
class Comparison:
    """Per policy, per metric key (`METRICS`): measured beside predicted; and the ratio."""

    metrics: Mapping[str, Mapping[str, MetricError]]
    ratio: RatioError | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            p: {key: asdict(e) for key, e in by.items()} for p, by in self.metrics.items()
        }
        return out | ({"ratio": asdict(self.ratio)} if self.ratio is not None else {})


Metrics = Mapping[str, Mapping[str, Any]]  # per policy: metric key -> value


@dataclass(frozen=True)
class AtRate:
    """The simulator drawing drafts at the profile's rate: its metrics and comparison."""

    predicted: Metrics
    comparison: Comparison

    def to_json(self) -> dict[str, Any]:
        return {"predicted": self.predicted, "comparison": self.comparison.to_json()}


@dataclass(frozen=True)
class Prediction:
    """One cost model's prediction of a workload, per policy: the simulator's metrics, the
    engine's own steps priced (`steps`) and its TTFT p50 priced on its schedule
    (`ttft_steps`), the comparison with the measured medians, and (replaying the engine's
    drafts) the prediction drawn at the profile's rate beside it."""

    predicted: Metrics
    steps: Mapping[str, StepAttribution]
    ttft_steps: Mapping[str, Priced]
    comparison: Comparison
    at_rate: AtRate | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "predicted": self.predicted,
            "steps": {p: a.to_json() for p, a in self.steps.items()},
            "ttft_steps": {p: asdict(v) for p, v in self.ttft_steps.items()},
            "comparison": self.comparison.to_json(),
        }
        return out | ({"at_rate": self.at_rate.to_json()} if self.at_rate is not None else {})


@dataclass(frozen=True)
class WorkloadResult:
    """One workload: the engine's medians per policy, the prediction (with cross-fitting,
    the cross-fitted one, `probes_only` beside it), and its number of requests."""

    measured: Metrics
    prediction: Prediction
    size: int
    probes_only: Prediction | None = None
    cross_fit: CrossFit | None = None

    @property
    def comparison(self) -> Comparison:
        return self.prediction.comparison

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"measured": self.measured, **self.prediction.to_json()}
        if self.probes_only is not None and self.cross_fit is not None:
            out |= {"probes_only": self.probes_only.to_json(),
                    "cross_fit": self.cross_fit.to_json()}  # fmt: skip
        return out | {"size": self.size}


@dataclass(frozen=True)
class ValidationInputs:
    """What a validation ran with."""

    profile: str
    recalibrated: bool
    cross_fitted: bool
    model: str
    clock: str
    acceptance_rate: float
    acceptance: str
    drafts_accepted: Mapping[str, Mapping[str, int]]  # per workload, per policy
    threads: int
    repeats: int
    block_size: int
    prefix_match_unit: int
    num_speculative_tokens: int
    concurrency: int
    seed: int


@dataclass(frozen=True)
class ValidationReport:
    """`validate`'s result: per workload, the measured and predicted figures; the inputs;
    the run's wall time; with recalibration, the profile fitted and written (`profile`).
    :meth:`to_json` is `--json`'s document."""

    workloads: Mapping[str, WorkloadResult]
    inputs: ValidationInputs
    wall_s: float
    profile: Profile | None = None

    def misses(self, rel: float = 0.10, pp: float = 3.0) -> list[str]:
        return misses({n: w.comparison for n, w in self.workloads.items()}, rel, pp)

    def to_json(self) -> dict[str, Any]:
        return {
            "workloads": {n: w.to_json() for n, w in self.workloads.items()},
            "inputs": asdict(self.inputs),
            "wall_s": self.wall_s,
            "misses": self.misses(),
        }


# the validation workloads at the CPU engine's scale, and at a smoke-test size (`quick`)
SIZES: dict[str, tuple[WorkloadSizes, WorkloadSizes]] = {
    "system-prompt": (
        WorkloadSizes(num_requests=12, shared_prefix_tokens=7_200, suffix_tokens=802,
                      output_tokens=32),
        WorkloadSizes(num_requests=4, shared_prefix_tokens=300, suffix_tokens=60,
                      output_tokens=6),
    ),
    "family": (
        WorkloadSizes(families=3, requests_per_family=(3, 5), shared_prefix_tokens=(1_500, 6_000),
                      suffix_tokens=(64, 800), output_tokens=(16, 48)),
        WorkloadSizes(families=2, requests_per_family=(2, 3), shared_prefix_tokens=(150, 400),
                      suffix_tokens=(16, 64), output_tokens=(4, 8)),
    ),
    "multi-turn": (
        WorkloadSizes(sessions=12, turns=(2, 4), user_tokens=(32, 400), output_tokens=(16, 48),
                      system_prompt_tokens=1_500),
        WorkloadSizes(sessions=2, turns=2, user_tokens=(16, 48), output_tokens=(4, 8),
                      system_prompt_tokens=200),
    ),
}  # fmt: skip


def build_workload(name: str, seed: int, quick: bool = False) -> Workload:
    """A validation workload (`SIZES`), built as simulate and bench build theirs."""
    if name not in SIZES:
        raise ValueError(f"unknown validation workload {name!r}; one of {', '.join(WORKLOADS)}")
    sizes = SIZES[name][1 if quick else 0]
    shape = sizes.applied(DEFAULT_SHAPES[name])
    return sim_build.build_workload(WorkloadSpec(name, shape, seed=seed, vocab=VOCAB))


def simulate(
    config: Any,
    w: Workload,
    cost: CostModel,
    concurrency: int,
    seed: int,
    accepted: Mapping[str, Mapping[int, int]] | None = None,
) -> dict[str, Any]:
    """The simulator on the engine's own config (its acceptance rate set by the caller);
    `accepted`: the drafts an engine run accepted, replayed (else drawn at the rate)."""
    from hycache.sim.simulator import Simulator

    sim = Simulator(config, cost=cost, seed=seed, vocab_size=VOCAB, accepted=accepted)
    res = sim.run(w.requests, sessions=w.sessions, concurrency=concurrency)
    s = res.summary
    keys = ("output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "token_hit_rate", "makespan_s")
    return {k: s[k] for k in keys} | {"requests": s["requests"]}


def profile_acceptance(gpu: GpuSpec, k: int) -> float:
    """The per-draft acceptance the profile measured for `k` drafts (0 when it has none)."""
    cal = gpu.calibration or {}
    rates = cal.get("calibration", {}).get("extra", {}).get("acceptance_rate", {})
    value = rates.get(str(k))
    return float(value) if value is not None else 0.0


def profile_clock(gpu: GpuSpec) -> str:
    cal = gpu.calibration or {}
    return str(cal.get("calibration", {}).get("extra", {}).get("clock", "wall"))


def _engine(
    o: ValidateOptions, arm: str, max_len: int, num_blocks: int | None = None, warmup: bool = False
) -> Any:
    """The engine for one arm: a policy, or one with `-split` (no internal checkpoints);
    `warmup`: warmed up as a server is before its first request (`LLM(warmup=True)`)."""
    from hycache.engine.engine import LLM
    from hycache.sim.compare import ARMS

    a = ARMS[arm]
    knobs = o.run_knobs.replace(
        policy=a.policy,
        internal_checkpoints=a.internal is not False,
        enable_prefix_caching=a.caching,
    )
    return LLM(
        o.model,
        knobs=knobs,
        max_model_len=max_len,
        num_speculative_tokens=o.num_speculative_tokens,
        max_num_batched_tokens=o.max_num_batched_tokens,
        max_num_seqs=o.concurrency,
        seed=o.seed,
        num_blocks=num_blocks,
        warmup=warmup,
    )


def validate(
    o: ValidateOptions, progress: Progress, recalibrate: CalibrateOptions | None = None
) -> ValidationReport:
    """Every workload x policy on the engine (`o.repeats` times, the policy order alternating;
    medians) and in the simulator; the report (a `comparison` per workload). With
    `o.interleave` (the default) a repeat runs the policies' engines in one process, their
    steps in turn, each timed on its own clock (`hycache.bench.closed_loop`), so their ratio
    sees the machine in the same states; otherwise one run after the other.

    `recalibrate`: instead of reading the profile `o.profile`, measure the calibration grid
    (`hycache.bench.calibrate.measure`) before every `o.round_every`-th repeat, so that the
    calibration and the runs it predicts see the machine in the same states; pool the
    rounds, fit them and write the profile to `o.profile` before predicting. With
    `o.cross_fit` (and two workloads or more) each workload's `comparison` is then the
    prediction with the probes and the other workloads' engine steps fitted
    (`hycache.bench.steps.cross_fit`; `cross_fit` per workload), and `probes_only` the
    profile's own.

    With `o.isolate` every engine run and calibration round starts in a fresh interpreter,
    as a served engine does: none inherits the heap and caches of the runs before it (in one
    process, multi-turn ran 10-15% slower after a calibration round than before it)."""
    if recalibrate is None:
        clock = o.clock or profile_clock(load_gpu(o.profile))
    else:
        clock = o.clock or recalibrate.clock
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be wall or cpu, got {clock!r}")
    if o.acceptance not in ("replay", "rate"):
        raise ValueError(f"acceptance must be replay or rate, got {o.acceptance!r}")
    t_start = time.perf_counter()
    workloads = {name: build_workload(name, o.seed, o.quick) for name in o.workloads}
    recorded: dict[str, dict[str, list[EngineRun]]] = {
        name: {p: [] for p in o.policies} for name in workloads
    }
    rounds: list[Any] = []
    k = o.num_speculative_tokens
    where = "a fresh process" if o.isolate else "this process"
    if o.round_every < 1:
        raise ValueError(f"round_every must be >= 1, got {o.round_every}")
    num_rounds = -(-o.repeats // o.round_every)
    for rep in range(o.repeats):
        if recalibrate is not None and rep % o.round_every == 0:
            progress(f"calibration round {rep // o.round_every + 1}/{num_rounds} ({where})")
            rounds.append(run_isolated(_calibration_round, recalibrate, isolate=o.isolate))
        for name in workloads:
            order = tuple(o.policies) if rep % 2 == 0 else tuple(reversed(o.policies))
            # stepped in turn in one run, or one run after the other
            batches = [order] if o.interleave else [(p,) for p in order]
            for batch in batches:
                arms = " + ".join(batch) + (" in turn" if len(batch) > 1 else "")
                progress(f"{name} · engine · {arms} · repeat {rep + 1}/{o.repeats} ({where})")
                results = run_isolated(engine_runs, o, name, batch, clock, isolate=o.isolate)
                for p, run in zip(batch, results, strict=True):
                    recorded[name][p].append(run)
    probes, profile = None, None
    if recalibrate is not None:
        from hycache.bench.calibrate import pool

        probes = pool(rounds)
        profile = _write_profile(o.profile, probes, recalibrate, progress)
    if o.raw:
        _write_raw(o.raw, rounds, recorded)
    gpu = load_gpu(o.profile)
    accept = o.acceptance_rate if o.acceptance_rate is not None else profile_acceptance(gpu, k)
    block = o.run_knobs.block_size
    model = gpu.fitted_on or o.model
    crossed = probes is not None and o.cross_fit and len(workloads) > 1
    results: dict[str, WorkloadResult] = {}
    steps = {n: {p: [r.steps for r in rs] for p, rs in by.items()} for n, by in recorded.items()}
    for name, w in workloads.items():
        rec = _Recorded(recorded[name])
        own = _predict(o, name, w, rec, _cost(gpu, model, k, block), accept, progress)
        result = WorkloadResult(rec.medians(), own, w.size)
        if crossed:
            assert probes is not None
            cf = cross_fit(probes, steps, name, model, k, gpu)
            progress(f"{name} · refitted on the probes and the other workloads' runs "
                     f"(rms {cf.rms_error_own_steps:.1%} on its own steps)")  # fmt: skip
            crossed_prediction = _predict(o, name, w, rec, _cost(cf.gpu, model, k, block),
                                          accept, progress, " (cross-fitted)")  # fmt: skip
            result = replace(result, prediction=crossed_prediction, probes_only=own, cross_fit=cf)
        results[name] = result
    inputs = ValidationInputs(
        profile=o.profile,
        recalibrated=recalibrate is not None,
        cross_fitted=crossed,
        model=gpu.fitted_on or o.model,
        clock=clock,
        acceptance_rate=accept,
        acceptance=o.acceptance,
        drafts_accepted={
            name: {p: _Recorded(by).drafts_accepted(p) for p in by} for name, by in recorded.items()
        },
        threads=o.threads,
        repeats=o.repeats,
        block_size=block,
        prefix_match_unit=o.knobs.prefix_match_unit,
        num_speculative_tokens=k,
        concurrency=o.concurrency,
        seed=o.seed,
    )
    return ValidationReport(results, inputs, time.perf_counter() - t_start, profile)


@dataclass(frozen=True)
class EngineRun:
    """One engine run of one policy: its config, metrics, steps (each timed), the steps each
    request's TTFT spans (`ClosedLoop.spans`) and the drafts it accepted (`ClosedLoop.accepted`)."""

    config: Any
    metrics: dict[str, Any]
    steps: list[EngineStep]
    spans: list[tuple[int, int]]
    accepted: dict[str, dict[int, int]]


@dataclass(frozen=True)
class _Recorded:
    """One workload's engine runs, per policy, in repeat order."""

    runs: dict[str, list[EngineRun]]

    def metrics(self, p: str) -> list[dict[str, Any]]:
        return [r.metrics for r in self.runs[p]]

    def accepted(self, p: str) -> dict[str, dict[int, int]]:
        """The drafts policy `p`'s engine accepted (every repeat runs the same tokens: the
        first repeat's record)."""
        return self.runs[p][0].accepted

    def drafts_accepted(self, p: str) -> int:
        return sum(sum(steps.values()) for steps in self.accepted(p).values())

    def medians(self) -> dict[str, dict[str, Any]]:
        """Per policy, each metric's median over the repeats."""
        return {p: _median(self.metrics(p)) for p in self.runs}

    def paired_ratio(self) -> float | None:
        """limit / lookahead output tok/s: the median over repeats of each repeat's pair
        (stepped in turn, or back to back)."""
        if not {"limit", "lookahead"} <= set(self.runs):
            return None
        key = "output_tokens_per_s"
        pairs = zip(self.metrics("limit"), self.metrics("lookahead"), strict=True)
        return statistics.median(a[key] / b[key] for a, b in pairs)


def _predict(
    o: ValidateOptions, name: str, w: Workload, rec: _Recorded, cost: CostModel,
    accept: float, progress: Progress, tag: str = "",
) -> Prediction:  # fmt: skip
    """The simulator's prediction of `w` with `cost`, per policy (with `o.acceptance`
    "replay" the engine's accepted drafts replayed, and beside it, `at_rate`, drawn at the
    profile's rate); the cost model on the engine's own steps (`step_attribution`) and on
    the steps of each TTFT (`ttft_attribution`); the comparisons with the measured medians."""
    predicted: dict[str, Any] = {}
    steps: dict[str, StepAttribution] = {}
    ttft: dict[str, Priced] = {}
    at_rate: dict[str, Any] = {}
    for p in o.policies:
        runs = rec.runs[p]
        makespans = [r.metrics["makespan_s"] for r in runs]
        steps[p] = step_attribution([r.steps for r in runs], makespans, cost)
        ttft[p] = ttft_attribution([r.steps for r in runs], [r.spans for r in runs], cost)
        progress(f"{name} · simulator{tag} · {p}")
        cfg = runs[-1].config
        cfg = replace(cfg, speculative=replace(cfg.speculative, acceptance_rate=accept))
        at_rate[p] = simulate(cfg, w, cost, o.concurrency, o.seed)
        predicted[p] = (
            simulate(cfg, w, cost, o.concurrency, o.seed, rec.accepted(p))
            if o.acceptance == "replay"
            else at_rate[p]
        )
    measured, paired = rec.medians(), rec.paired_ratio()
    drawn = None
    if o.acceptance == "replay":
        drawn = AtRate(at_rate, compare(measured, at_rate, o.policies, paired))
    comparison = compare(measured, predicted, o.policies, paired)
    return Prediction(predicted, steps, ttft, comparison, drawn)


def run_isolated(fn: Callable[..., Any], *args: Any, isolate: bool = True) -> Any:
    """`fn(*args)`, in a fresh spawned interpreter when `isolate` (its result pickled back)."""
    if not isolate:
        return fn(*args)
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def _calibration_round(cal: CalibrateOptions) -> Any:
    from hycache.bench.calibrate import measure

    return measure(cal, lambda _msg: None)


def engine_runs(
    o: ValidateOptions, name: str, policies: Sequence[str], clock: str
) -> list[EngineRun]:
    """Workload `name` under each of `policies`, one engine each, their loops stepped in turn
    (`run_interleaved`; one policy: alone); an `EngineRun` per policy. The engines are built
    and warmed up on the run's `o.threads` torch threads."""
    import torch

    w = build_workload(name, o.seed, o.quick)
    max_len = w.max_tokens_per_request() + 2 * o.num_speculative_tokens + 16
    threads = torch.get_num_threads()
    torch.set_num_threads(o.threads)
    try:
        llms = [_engine(o, p, max_len, warmup=True) for p in policies]
        steps: list[list[EngineStep]] = [[] for _ in policies]
        loops = [
            ClosedLoop(llm, w, o.concurrency, clock, s) for llm, s in zip(llms, steps, strict=True)
        ]
        metrics = run_interleaved(loops)
        return [
            EngineRun(llm.config, m, s, loop.spans(), loop.accepted())
            for llm, m, s, loop in zip(llms, metrics, steps, loops, strict=True)
        ]
    finally:
        torch.set_num_threads(threads)


def _cost(gpu: GpuSpec, model: str, k: int, block: int) -> CostModel:
    """The cost model of `gpu` for the engine's layout (separate pools)."""
    return CostModel(
        load_model_spec(model), gpu, speculative=k > 0, num_speculative_tokens=k,
        block_size=block, pool_layout="separate",
    )  # fmt: skip


def _write_raw(path: str, rounds: Sequence[Any], recorded: Any) -> None:
    """The calibration rounds and, per workload, policy and repeat, the engine runs'
    metrics, steps, TTFT spans and accepted drafts, pickled."""
    import pickle

    from hycache.files import write_atomic

    def each(field: str) -> dict[str, dict[str, list[Any]]]:
        return {n: {p: [getattr(r, field) for r in rs] for p, rs in by.items()}
                for n, by in recorded.items()}  # fmt: skip

    blob = pickle.dumps({"rounds": list(rounds), "runs": each("metrics"), "steps": each("steps"),
                         "spans": each("spans"), "accepted": each("accepted")})  # fmt: skip
    write_atomic(path, blob)


def _write_profile(path: str, probes: Any, cal: CalibrateOptions, progress: Progress) -> Profile:
    """Fit the pooled calibration rounds `probes`, write the profile to `path`, return it."""
    import json

    from hycache.bench.calibrate import profile_from
    from hycache.files import write_atomic

    rounds = probes.conditions.extra.get("rounds", 1)
    progress(f"fitting {rounds} pooled calibration rounds")
    command = f"hycache bench --validate {path} --recalibrate (rounds between the engine runs)"
    profile = profile_from(probes, cal.model, progress, command)
    write_atomic(path, json.dumps(profile.to_json(), indent=2) + "\n")
    progress(f"wrote {path}")
    return profile


def _median(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def compare(
    measured: Metrics,
    predicted: Metrics,
    policies: Sequence[str] = POLICIES,
    paired: float | None = None,
) -> Comparison:
    """Per policy and metric: measured, predicted, relative error (predicted / measured - 1);
    and the `limit / lookahead` output tok/s ratio both ways with its error in percentage
    points. `paired`: the measured ratio as the median over repeats of each repeat's two
    runs (stepped in turn or back to back, so the machine's drift cancels); else (and beside it,
    `of_medians`) the ratio of the two policies' medians."""
    metrics: dict[str, dict[str, MetricError]] = {}
    for p in policies:
        metrics[p] = {}
        for _, key in METRICS:
            m, s = measured[p][key], predicted[p][key]
            metrics[p][key] = MetricError(m, s, s / m - 1.0 if m else None)
    ratio = None
    if "limit" in policies and "lookahead" in policies:
        key = "output_tokens_per_s"
        medians = measured["limit"][key] / measured["lookahead"][key]
        rm = paired if paired is not None else medians
        rp = predicted["limit"][key] / predicted["lookahead"][key]
        ratio = RatioError(rm, rp, 100.0 * (rp - rm), medians, paired is not None)
    return Comparison(metrics, ratio)


def misses(comparisons: Mapping[str, Comparison], rel: float = 0.10, pp: float = 3.0) -> list[str]:
    """The figures outside the acceptance targets, per workload's comparison (tok/s and
    TTFT p50 within `rel`, the ratio within `pp` percentage points)."""
    out = []
    for name, c in comparisons.items():
        for p, by in c.metrics.items():
            for key in ("output_tokens_per_s", "ttft_p50_s"):
                err = by[key].error
                if err is None or abs(err) > rel + 1e-9:
                    out.append(f"{name} {p} {key}: {err:+.1%}" if err is not None else name)
        if c.ratio is not None and abs(c.ratio.error_pp) > pp + 1e-9:
            out.append(f"{name} limit/lookahead: {c.ratio.error_pp:+.1f} pp")
    return out


def predict_engine_bench(bench: Any, profile: str) -> dict[str, dict[str, Any]]:
    """What the simulator with `profile` predicts for `hycache bench`'s CPU engine arm
    (`hycache.bench.suite.EngineBench`, the same prompts), per policy; the acceptance rate is the
    profile's measurement."""
    from hycache.bench.suite import engine_arms

    requests = [
        RequestSpec(i, np.array(p), bench.output_tokens, None)
        for i, p in enumerate(bench.prompts())
    ]
    w = Workload(f"engine-{bench.shape}", requests)
    o = ValidateOptions(
        profile=profile,
        knobs=bench.knobs,
        num_speculative_tokens=bench.num_speculative_tokens,
        concurrency=bench.concurrency,
        max_num_batched_tokens=bench.max_num_batched_tokens,
        seed=bench.seed,
    )
    gpu = load_gpu(profile)
    k = o.num_speculative_tokens
    cost = _cost(gpu, gpu.fitted_on or o.model, k, o.knobs.block_size)
    accept = profile_acceptance(gpu, k)
    max_len = bench.shared_prefix_tokens + bench.suffix_tokens + bench.output_tokens + 16
    out = {}
    for p in engine_arms(bench.shape):
        cfg = _engine(o, p, max_len, bench.num_blocks).config
        cfg = replace(cfg, speculative=replace(cfg.speculative, acceptance_rate=accept))
        out[p] = simulate(cfg, w, cost, o.concurrency, o.seed)
    return out
