"""The engine side of a validation: each arm's engine (`arm_engine`), a workload's runs with
the policies' loops stepped in turn (`engine_runs`, an `EngineRun` each), a call in a fresh
interpreter (`run_isolated`), and one workload's recorded runs (`RecordedRuns`: medians, the
paired ratio, the drafts accepted).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from hycache.bench.closed_loop import ClosedLoop, RunMetrics, run_interleaved
from hycache.bench.steps import EngineStep
from hycache.bench.validate.options import ValidateOptions, build_workload

if TYPE_CHECKING:
    from hycache.bench.calibrate import CalibrateOptions, Measured
    from hycache.config import HycacheConfig
    from hycache.engine.engine import LLM


def arm_engine(
    o: ValidateOptions, arm: str, max_len: int, num_blocks: int | None = None, warmup: bool = False
) -> LLM:
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


@dataclass(frozen=True)
class EngineRun:
    """One engine run of one policy: its config, metrics, steps (each timed), the steps each
    request's TTFT spans (`ClosedLoop.spans`) and the drafts it accepted (`ClosedLoop.accepted`)."""

    config: HycacheConfig
    metrics: RunMetrics
    steps: list[EngineStep]
    spans: list[tuple[int, int]]
    accepted: dict[str, dict[int, int]]


@dataclass(frozen=True)
class RecordedRuns:
    """One workload's engine runs, per policy, in repeat order."""

    runs: dict[str, list[EngineRun]]

    def metrics(self, p: str) -> list[RunMetrics]:
        return [r.metrics for r in self.runs[p]]

    def accepted(self, p: str) -> dict[str, dict[int, int]]:
        """The drafts policy `p`'s engine accepted (every repeat runs the same tokens: the
        first repeat's record)."""
        return self.runs[p][0].accepted

    def drafts_accepted(self, p: str) -> int:
        return sum(sum(steps.values()) for steps in self.accepted(p).values())

    def medians(self) -> dict[str, RunMetrics]:
        """Per policy, each metric's median over the repeats."""
        return {p: _median(self.metrics(p)) for p in self.runs}

    def paired_ratio(self) -> float | None:
        """limit / lookahead output tok/s: the median over repeats of each repeat's pair
        (stepped in turn, or back to back)."""
        if not {"limit", "lookahead"} <= set(self.runs):
            return None
        pairs = zip(self.metrics("limit"), self.metrics("lookahead"), strict=True)
        return statistics.median(a.output_tokens_per_s / b.output_tokens_per_s for a, b in pairs)


Recorded = dict[str, dict[str, list["EngineRun"]]]  # per workload, per policy, in repeat order


def run_isolated(fn: Callable[..., Any], *args: Any, isolate: bool = True) -> Any:
    """`fn(*args)`, in a fresh spawned interpreter when `isolate` (its result pickled back)."""
    if not isolate:
        return fn(*args)
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def calibration_round(cal: CalibrateOptions) -> Measured:
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
        llms = [arm_engine(o, p, max_len, warmup=True) for p in policies]
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


def _median(runs: Sequence[RunMetrics]) -> RunMetrics:
    """Each figure's median over `runs` (None where the runs have none)."""
    values = {f.name: [getattr(r, f.name) for r in runs] for f in fields(RunMetrics)}
    return RunMetrics(**{k: None if None in v else statistics.median(v) for k, v in values.items()})
