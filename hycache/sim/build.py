"""The one builder of each input a simulated run is made of: its workload, its config, its cost
model, its second tier and its pools.

- :func:`build_workload`: a :class:`WorkloadSpec` (a kind, its shape with the sizes a caller
  set, seed, vocabulary, prefix hints, a trace source) as the :class:`Workload` that
  `hycache simulate`, `hycache bench` and the load generator (`hycache bench serve`) run; equal
  specs give equal workloads, whoever asks;
- :func:`build_config`: a :class:`SimGeometry` as the `HycacheConfig` of `simulate`, `explain`
  and `bench`;
- :func:`build_cost`, :func:`build_tier`, :func:`sim_pools`: the cost model, the simulated
  store and the pool sizes a run uses;
- :func:`open_loop`: arrivals at a rate, or at a fraction of what `lookahead` sustains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from hycache.cache.layout import unsized_num_blocks
from hycache.config import (
    CacheConfig,
    CacheKnobs,
    GroupKind,
    HycacheConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from hycache.sim.costmodel import CostModel, PoolLayout
from hycache.sim.tier import TierConfig
from hycache.sim.trace import MOONCAKE_BLOCK_TOKENS
from hycache.sim.workloads import (
    DEFAULT_VOCAB,
    ChatShape,
    FamilyShape,
    IntOrRange,
    OfferedLoad,
    RequestSpec,
    SessionSpec,
    SystemPromptShape,
    Workload,
)

WORKLOAD_KINDS: tuple[str, ...] = ("system-prompt", "family", "multi-turn", "trace")
Shape = SystemPromptShape | FamilyShape | ChatShape
# the simulator's shapes at their defaults (the reasons for them live with the shapes)
DEFAULT_SHAPES: dict[str, Shape] = {
    "system-prompt": SystemPromptShape(),
    "family": FamilyShape(),
    "multi-turn": ChatShape(),
}


@dataclass(frozen=True)
class WorkloadSizes:
    """The sizes a caller sets (None: the shape's default). A size the shape lacks (say
    `families` for `system-prompt`) is ignored."""

    num_requests: int | None = None
    shared_prefix_tokens: IntOrRange | None = None
    suffix_tokens: IntOrRange | None = None
    output_tokens: IntOrRange | None = None
    families: int | None = None
    requests_per_family: IntOrRange | None = None
    sessions: int | None = None
    turns: IntOrRange | None = None
    user_tokens: IntOrRange | None = None
    system_prompt_tokens: int | None = None

    def applied(self, shape: Shape) -> Shape:
        """`shape` with the sizes set here that it has."""
        names = {f.name for f in fields(shape)}
        given = {k: v for k, v in asdict(self).items() if v is not None and k in names}
        prefix = given.get("shared_prefix_tokens")
        if isinstance(shape, SystemPromptShape) and isinstance(prefix, tuple):
            raise ValueError(
                "--shared-prefix-tokens: the system-prompt workload needs one length, not a range"
            )
        return replace(shape, **given)


@dataclass(frozen=True)
class PrefixHints:
    """The prefix hints requests name: `shared`, where the workload's shared prefix ends (the
    system prompt, a family's prefix); `tokens`, these token counts on every request."""

    shared: bool = False
    tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if any(t < 0 for t in self.tokens):
            raise ValueError(f"--prefix-hint: token counts must be >= 0, got {list(self.tokens)}")

    def __bool__(self) -> bool:
        return self.shared or bool(self.tokens)

    def summary(self) -> bool | dict[str, Any]:
        """As results report it: a bool without token counts (as before they existed)."""
        if not self.tokens:
            return self.shared
        return {"shared": self.shared, "tokens": list(self.tokens)}


@dataclass(frozen=True)
class TraceSource:
    """A Mooncake-format trace: a JSONL file (`path`, expanded lazily) or in-memory records
    (`generate_mooncake_like`'s)."""

    path: str | Path | None = None
    records: Sequence[Mapping[str, Any]] | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    limit: int | None = None  # only the first N requests (by arrival) of a file

    def requests(self, vocab: int, seed: int) -> Sequence[RequestSpec]:
        from hycache.sim.trace import lazy_mooncake_trace, requests_from_records

        if self.records is not None:
            return requests_from_records(self.records, self.block_tokens, vocab, seed=seed)
        if self.path is None:
            raise ValueError("--workload trace needs --trace FILE.jsonl")
        return lazy_mooncake_trace(  # type: ignore[return-value]
            self.path, self.block_tokens, vocab, seed=seed, limit=self.limit
        )


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything a workload is built from. `shape` (already sized) for the synthetic kinds,
    `trace` for `trace`; `concurrency` / `sequential` as `Workload` takes them."""

    kind: str
    shape: Shape | None = None
    trace: TraceSource | None = None
    seed: int = 0
    vocab: int = DEFAULT_VOCAB
    hints: PrefixHints = field(default_factory=PrefixHints)
    concurrency: int | None = None
    sequential: bool = False

    def __post_init__(self) -> None:
        if self.kind not in WORKLOAD_KINDS:
            raise ValueError(f"unknown workload {self.kind!r}; one of {', '.join(WORKLOAD_KINDS)}")
        if self.kind == "trace" and self.hints:
            raise ValueError("--prefix-hint: a trace names no shared prefix; use another workload")


def _with_tokens(specs: list[Any], tokens: tuple[int, ...]) -> list[Any]:
    if not tokens:
        return specs
    return [replace(s, prefix_hints=(*s.prefix_hints, *tokens)) for s in specs]


def build_workload(spec: WorkloadSpec) -> Workload:
    """The workload `spec` describes (seeded: the same in every process)."""
    loop = {"concurrency": spec.concurrency, "sequential": spec.sequential}
    if spec.kind == "trace":
        source = spec.trace or TraceSource()
        return Workload("trace", source.requests(spec.vocab, spec.seed), **loop)
    shape = spec.shape or DEFAULT_SHAPES[spec.kind]
    built = shape.build(spec.seed, spec.hints.shared, spec.vocab)
    built = _with_tokens(built, spec.hints.tokens)
    if spec.kind == "multi-turn":
        sessions: list[SessionSpec] = built
        return Workload(spec.kind, sessions=sessions, **loop)
    return Workload(spec.kind, built, **loop)


@dataclass(frozen=True)
class SimGeometry:
    """What a simulated run's config is made of (`simulate`, `explain`, `bench`): the cache
    knobs, the drafter and the scheduler's budget. The knobs' `policy` is the default arm's;
    `build_config(policy=...)` sets an arm's own."""

    knobs: CacheKnobs
    num_speculative_tokens: int = 0  # drafts per step (0: no drafter)
    acceptance_rate: float = 0.7
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 64
    saturated_chunk_tokens: int = SchedulerConfig.saturated_chunk_tokens
    step_packing: bool = SchedulerConfig.step_packing


def build_config(
    g: SimGeometry,
    *,
    max_model_len: int,
    num_blocks: int,
    policy: str | None = None,
    num_state_pages: int | None = None,
) -> HycacheConfig:
    """The config of one simulated arm (an attention and an SSM group) under `policy` (None:
    the knobs')."""
    knobs = g.knobs if policy is None else g.knobs.replace(policy=policy)
    return HycacheConfig(
        CacheConfig(
            knobs,
            num_blocks=num_blocks,
            num_state_pages=num_state_pages,
            max_model_len=max_model_len,
            groups=(GroupKind.ATTENTION, GroupKind.SSM),
        ),
        SpeculativeConfig(
            num_speculative_tokens=g.num_speculative_tokens, acceptance_rate=g.acceptance_rate
        ),
        SchedulerConfig(
            g.max_num_batched_tokens,
            g.max_num_seqs,
            saturated_chunk_tokens=g.saturated_chunk_tokens,
            step_packing=g.step_packing,
        ),
    )


def build_cost(
    model: str,
    gpu: str,
    *,
    num_speculative_tokens: int,
    block_size: int,
    pool_layout: PoolLayout = "shared",
) -> CostModel:
    """The roofline cost model of `model` (a preset name or file) on `gpu`; the drafter's
    when `num_speculative_tokens` > 0 (`eagle-off` derives its own from it)."""
    from hycache.sim.presets import load_gpu, load_model_spec

    return CostModel(
        load_model_spec(model),
        load_gpu(gpu),
        speculative=num_speculative_tokens > 0,
        num_speculative_tokens=num_speculative_tokens,
        block_size=block_size,
        pool_layout=pool_layout,
    )


def build_tier(capacity_gb: float, link: str = "host") -> TierConfig | None:
    """The simulated store of `capacity_gb` GiB over `link` (`STORE_LINKS`); 0: none."""
    from hycache.sim.tier import STORE_LINKS

    if capacity_gb == 0:
        return None
    return TierConfig(capacity_gb, STORE_LINKS[link])  # checks the size


def sim_pools(
    cost: CostModel | None,
    *,
    block_size: int,
    max_model_len: int,
    pool_layout: PoolLayout,
    max_num_seqs: int,
) -> tuple[int, int | None]:
    """(blocks, SSM state pages or None) of a run whose cache is not given: what the cost
    model's memory holds, else room for `max_num_seqs` requests twice over."""
    if cost is not None:
        pools = cost.pool_sizes(block_size, max_model_len, layout=pool_layout)
        return pools.num_blocks, pools.num_state_pages
    return unsized_num_blocks(max_model_len, block_size, max_num_seqs), None


def open_loop(
    workload: Workload,
    rate: float | str,
    *,
    config: HycacheConfig,
    cost: CostModel | None,
    load: float,
    seed: int,
    size_cache: bool,
) -> OfferedLoad:
    """Give `workload` open-loop arrivals (in place): at `rate` requests/s, or with `auto` at
    `load` times what the `lookahead` arm sustains closed loop on this stream."""
    from hycache.sim.load import at_rate, sustainable_arrivals

    if rate == "auto":
        reqs, offered = sustainable_arrivals(
            workload.requests, config, cost, load=load, seed=seed, size_cache=size_cache
        )
    else:
        reqs, scale = at_rate(workload.requests, float(rate), seed=seed)
        offered = OfferedLoad(None, None, float(rate), scale)
    workload.requests = reqs
    workload.concurrency = None
    return offered
