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

The phases, a module each: `options` (what runs, the workloads), `runs` (the engine side),
`predict` (the simulator side), `report` (the comparison and the report), `pipeline`
(`validate`, end to end).
"""

from hycache.bench.validate.options import (
    METRICS,
    POLICIES,
    SIZES,
    VOCAB,
    WORKLOADS,
    Progress,
    ValidateOptions,
    build_workload,
)
from hycache.bench.validate.pipeline import validate
from hycache.bench.validate.predict import (
    predict_engine_bench,
    profile_acceptance,
    profile_clock,
    simulate,
)
from hycache.bench.validate.report import (
    AtRate,
    Comparison,
    MetricError,
    Metrics,
    Prediction,
    RatioError,
    RunMetrics,
    ValidationInputs,
    ValidationReport,
    WorkloadResult,
    compare,
    misses,
)
from hycache.bench.validate.runs import EngineRun, engine_runs, run_isolated

__all__ = [
    "METRICS",
    "POLICIES",
    "SIZES",
    "VOCAB",
    "WORKLOADS",
    "AtRate",
    "Comparison",
    "EngineRun",
    "MetricError",
    "Metrics",
    "Prediction",
    "Progress",
    "RatioError",
    "RunMetrics",
    "ValidateOptions",
    "ValidationInputs",
    "ValidationReport",
    "WorkloadResult",
    "build_workload",
    "compare",
    "engine_runs",
    "misses",
    "predict_engine_bench",
    "profile_acceptance",
    "profile_clock",
    "run_isolated",
    "simulate",
    "validate",
]
