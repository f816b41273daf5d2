"""What a validation runs: `ValidateOptions`, the policies, workloads and metrics it compares,
and the validation workloads at the CPU engine's scale and a smoke-test size (`SIZES`,
`build_workload`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hycache.config import CacheKnobs
from hycache.sim import build as sim_build
from hycache.sim.build import DEFAULT_SHAPES, WorkloadSizes, WorkloadSpec
from hycache.sim.workloads import Workload

if TYPE_CHECKING:
    pass


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
