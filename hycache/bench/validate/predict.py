"""The simulator side of a validation: the simulator on the engine's own config (`simulate`),
the profile's clock and acceptance, its cost model for the engine's layout (`engine_cost`), a
workload's prediction per policy (`predict_workload`), and the prediction for `hycache
bench`'s engine part (`predict_engine_bench`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from hycache.bench.closed_loop import RunMetrics
from hycache.bench.steps import (
    Priced,
    StepAttribution,
    step_attribution,
    ttft_attribution,
)
from hycache.bench.validate.options import VOCAB, Progress, ValidateOptions
from hycache.bench.validate.report import AtRate, Prediction, compare
from hycache.bench.validate.runs import RecordedRuns, arm_engine
from hycache.sim.costmodel import CostModel
from hycache.sim.presets import GpuSpec, load_gpu, load_model_spec
from hycache.sim.workloads import RequestSpec, Workload

if TYPE_CHECKING:
    from hycache.bench.suite import EngineBench
    from hycache.config import HycacheConfig


def simulate(
    config: HycacheConfig,
    w: Workload,
    cost: CostModel,
    concurrency: int,
    seed: int,
    accepted: Mapping[str, Mapping[int, int]] | None = None,
) -> RunMetrics:
    """The simulator on the engine's own config (its acceptance rate set by the caller);
    `accepted`: the drafts an engine run accepted, replayed (else drawn at the rate)."""
    from hycache.sim.simulator import Simulator

    sim = Simulator(config, cost=cost, seed=seed, vocab_size=VOCAB, accepted=accepted)
    res = sim.run(w.requests, sessions=w.sessions, concurrency=concurrency)
    keys = ("output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "token_hit_rate", "makespan_s")
    return RunMetrics(**{k: res.summary[k] for k in keys}, requests=res.summary["requests"])


def profile_acceptance(gpu: GpuSpec, k: int) -> float:
    """The per-draft acceptance the profile measured for `k` drafts (0 when it has none)."""
    cal = gpu.calibration or {}
    rates = cal.get("calibration", {}).get("extra", {}).get("acceptance_rate", {})
    value = rates.get(str(k))
    return float(value) if value is not None else 0.0


def profile_clock(gpu: GpuSpec) -> str:
    cal = gpu.calibration or {}
    return str(cal.get("calibration", {}).get("extra", {}).get("clock", "wall"))


def predict_workload(
    o: ValidateOptions, name: str, w: Workload, rec: RecordedRuns, cost: CostModel,
    accept: float, progress: Progress, tag: str = "",
) -> Prediction:  # fmt: skip
    """The simulator's prediction of `w` with `cost`, per policy (with `o.acceptance`
    "replay" the engine's accepted drafts replayed, and beside it, `at_rate`, drawn at the
    profile's rate); the cost model on the engine's own steps (`step_attribution`) and on
    the steps of each TTFT (`ttft_attribution`); the comparisons with the measured medians."""
    predicted: dict[str, RunMetrics] = {}
    steps: dict[str, StepAttribution] = {}
    ttft: dict[str, Priced] = {}
    at_rate: dict[str, RunMetrics] = {}
    for p in o.policies:
        runs = rec.runs[p]
        makespans = [r.metrics.makespan_s for r in runs]
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


def engine_cost(gpu: GpuSpec, model: str, k: int, block: int) -> CostModel:
    """The cost model of `gpu` for the engine's layout (separate pools)."""
    return CostModel(
        load_model_spec(model), gpu, speculative=k > 0, num_speculative_tokens=k,
        block_size=block, pool_layout="separate",
    )  # fmt: skip


def predict_engine_bench(bench: EngineBench, profile: str) -> dict[str, RunMetrics]:
    """What the simulator with `profile` predicts for `hycache bench`'s CPU engine arm
    (`hycache.bench.suite.EngineBench`, the same prompts), per policy; the acceptance rate is the
    profile's measurement."""
    from hycache.bench.suite import engine_arms

    requests = [
        RequestSpec(i, np.array(p), bench.output_tokens, None)
        for i, p in enumerate(bench.prompts())
    ]
    w = Workload(f"engine-{bench.shape}", requests)
    shared = ("knobs", "num_speculative_tokens", "concurrency", "max_num_batched_tokens", "seed")
    o = ValidateOptions(profile, **{k: getattr(bench, k) for k in shared})
    gpu = load_gpu(profile)
    k = o.num_speculative_tokens
    cost = engine_cost(gpu, gpu.fitted_on or o.model, k, o.knobs.block_size)
    accept = profile_acceptance(gpu, k)
    max_len = bench.shared_prefix_tokens + bench.suffix_tokens + bench.output_tokens + 16
    out = {}
    for p in engine_arms(bench.shape):
        cfg = arm_engine(o, p, max_len, bench.num_blocks).config
        cfg = replace(cfg, speculative=replace(cfg.speculative, acceptance_rate=accept))
        out[p] = simulate(cfg, w, cost, o.concurrency, o.seed)
    return out
