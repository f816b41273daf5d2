"""Frozen, validated configuration for the cache, the drafter and the scheduler.

Every user-facing knob lives here. Validation raises one `ValueError` per problem that names the
field and says how to fix it; nothing downstream re-checks user input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, TypeVar


class Policy(StrEnum):
    """Where SSM checkpoints are placed and how prefixes are keyed (architecture §4.5).

    `tail`, `replay`, `junction`: the EAGLE drop scheme (a hit recomputes its last unit).
    `lookahead`: vLLM 0.33's default EAGLE setup (keys cover the next token, nothing dropped).
    `limit`: hycache's own: `lookahead` plus keys on every unit, junction stops on the unit grid,
    decode-side snapshots and prefix hints (siblings resume at `floor((P-1)/u)*u`).
    """

    TAIL = "tail"
    REPLAY = "replay"
    JUNCTION = "junction"
    LOOKAHEAD = "lookahead"
    LIMIT = "limit"


POLICY_NAMES: tuple[str, ...] = tuple(p.value for p in Policy)
# the CPU engine benchmark's request shapes (`hycache.bench.suite.EngineBench.shape`)
ENGINE_SHAPES: tuple[str, ...] = ("system", "family", "none")


E = TypeVar("E", bound=StrEnum)


def _parse_choice(kind: type[E], value: str | E, what: str) -> E:
    """`value` as a member of `kind`; ValueError listing the choices when it is none."""
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        names = ", ".join(m.value for m in kind)
        raise ValueError(f"{what}: unknown {what} {value!r}; choose one of {names}") from None


def parse_policy(value: str | Policy) -> Policy:
    return _parse_choice(Policy, value, "policy")


def parse_retention(value: str | int) -> str | int:
    """`semantic` (default), `dense`, or an interval in tokens (int or decimal string)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in ("semantic", "dense"):
            return value
        if value.isdigit():
            return int(value)
    raise ValueError(
        f"retention: unknown retention {value!r}; use 'semantic', 'dense' or an interval in "
        "tokens (a multiple of block_size)"
    )


class Eviction(StrEnum):
    """Which free cached entry (attention block or SSM state page) is reused first.

    `lru`: least recently freed first (decode snapshots before everything else cached).
    `flop-aware`: lowest score first, score = recency + alpha * (recompute FLOPs a hit on the
    entry saves / bytes it holds) (Marconi, MLSys'25; `hycache.cache.eviction`).
    """

    LRU = "lru"
    FLOP_AWARE = "flop-aware"


EVICTION_NAMES: tuple[str, ...] = tuple(e.value for e in Eviction)

# alpha of `flop-aware`, chosen by measurement (README, "Eviction under memory pressure", and
# `hycache.cache.eviction`): pool turnovers of recency per block-prefill's worth of FLOPs saved
DEFAULT_EVICTION_ALPHA = 0.05


def parse_eviction(value: str | Eviction) -> Eviction:
    return _parse_choice(Eviction, value, "eviction")


@dataclass(frozen=True)
class RecomputeCost:
    """What prefilling tokens costs, as the few numbers `flop-aware` eviction needs to value a
    cached entry (filled in from the cost model's own per-token terms by the simulator,
    `CostModel.recompute_cost`, and from the model's layers by the engine).

    Prefilling token `i` (at context `i`) costs `token_flops + pair_flops * (i + 1)`:
    `token_flops` is every layer's context-free work (weights, SSM state update, conv),
    `pair_flops` the attention work per (query, key) pair over every attention layer (the
    drafter's too). `ssm_fraction` of `token_flops` belongs to the SSM layers (their mixers and
    their share of the MLPs), the rest to the attention layers. The defaults describe a model
    whose tokens all cost the same, 90% of it in SSM layers (Bamba-9B: 29 of 32 mixers)."""

    token_flops: float = 1.0
    pair_flops: float = 0.0
    ssm_fraction: float = 0.9

    def __post_init__(self) -> None:
        for name in ("token_flops", "pair_flops"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"recompute_cost.{name}: must be a finite number >= 0, got {v}")
        if not 0.0 <= self.ssm_fraction <= 1.0:
            raise ValueError(
                f"recompute_cost.ssm_fraction: must lie in [0, 1], got {self.ssm_fraction}"
            )
        if self.token_flops == 0 and self.pair_flops == 0:
            raise ValueError("recompute_cost: token_flops and pair_flops cannot both be 0")


class GroupKind(StrEnum):
    ATTENTION = "attention"
    SSM = "ssm"


@dataclass(frozen=True)
class CacheKnobs:
    """The user's cache choices, each declared once and validated here, once: every front
    end (`LLM`, the simulator's `SimGeometry`, explain, the benches, the vLLM reference)
    holds one of these instead of copying the fields, and `CacheConfig` carries it beside
    the sizes computed from it. Adding a knob: a field and its check here, its flag in
    `hycache.cli.args` (`knobs_from_cli_args` reads it by name), and where it is consumed.

    `block_size` `B` and `prefix_match_unit` `u` (divides `B`; None: whole blocks);
    `policy` (architecture §4.5); `retention` (`semantic`, `dense` or an interval in tokens,
    a multiple of `B`); `enable_prefix_caching` (False: nothing kept, nothing hit);
    `hash_seed` (the chained hashes' seed, architecture §4.1).

    `internal_checkpoints`: SSM checkpoints are written inside a forward (the scan cut at
    them) instead of ending a prefill chunk at each; `lookahead` then splits as vLLM 0.33 does
    for Mamba2 models (`Boundaries.prefill_stops`).

    `eviction`: which free cached entry is reused first (`Eviction`); under `flop-aware`,
    `eviction_alpha` weighs the FLOPs a hit saves against recency (`CacheConfig.recompute_cost`
    prices them).

    `admission`: an SSM state whose keeping costs no prefill stop (written inside a forward,
    or a decode snapshot) is kept only while its kind's observed chance of a hit, times what
    a hit saves, beats what its page displaces (`hycache.cache.retention`); False keeps every
    one.

    `protect_declared`: under `lru` eviction, all a request frees after resuming from a hit
    that covers a prefix it declared (a prefix hint, `limit`) is evicted only after every
    block not so protected (a protected queue of up to 1/16 of the pool,
    `hycache.cache.block_pool`): a declared shared prefix, once reused, outlives a flood of
    one-off prompts. A request with no hints is never protected, so workloads without hints
    run as with it off.

    `protect_reused`: the same for every hit, declared or not, and a cached block hit at least
    once is protected too: an undeclared shared prefix outlives the flood as well. Off by
    default: it costs figures of docs/admission.md's table (its "Hints and floods").
    """

    block_size: int = 64
    prefix_match_unit: int | None = 16
    policy: Policy = Policy.LIMIT
    retention: str | int = "semantic"
    enable_prefix_caching: bool = True
    hash_seed: int = 0
    eviction: Eviction = Eviction.LRU
    eviction_alpha: float = DEFAULT_EVICTION_ALPHA
    internal_checkpoints: bool = True
    admission: bool = True
    protect_declared: bool = True
    protect_reused: bool = False

    def __post_init__(self) -> None:
        names = (
            "enable_prefix_caching",
            "internal_checkpoints",
            "admission",
            "protect_declared",
            "protect_reused",
        )
        for name in names:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be true or false, got {getattr(self, name)!r}")
        object.__setattr__(self, "policy", parse_policy(self.policy))
        object.__setattr__(self, "eviction", parse_eviction(self.eviction))
        a = self.eviction_alpha
        if isinstance(a, bool) or not isinstance(a, int | float) or not (0 <= a < math.inf):
            raise ValueError(f"eviction_alpha: must be a finite number >= 0, got {a!r}")
        object.__setattr__(self, "retention", parse_retention(self.retention))
        if isinstance(self.hash_seed, bool) or not isinstance(self.hash_seed, int):
            raise ValueError(f"hash_seed: must be an integer, got {self.hash_seed!r}")
        if self.block_size <= 0:
            raise ValueError(f"block_size: must be a positive integer, got {self.block_size}")
        if self.prefix_match_unit is not None:
            u = self.prefix_match_unit
            if u <= 0:
                raise ValueError(f"prefix_match_unit: must be a positive integer, got {u}")
            if self.block_size % u:
                raise ValueError(
                    f"prefix_match_unit: {u} does not divide block_size {self.block_size}; pick "
                    f"a divisor of {self.block_size} (or leave it unset to match whole blocks)"
                )
        if isinstance(self.retention, int) and (
            self.retention <= 0 or self.retention % self.block_size
        ):
            raise ValueError(
                f"retention: interval {self.retention} is not a positive multiple of block_size "
                f"{self.block_size}; use a multiple such as {self.block_size * 4}"
            )

    @property
    def unit(self) -> int:
        """The prefix-match unit `u` (equal to the block size when unset)."""
        return self.prefix_match_unit or self.block_size

    def replace(self, **changes: Any) -> CacheKnobs:
        """These knobs with `changes` (knob names; checked again)."""
        return replace(self, **changes)


KNOB_NAMES: frozenset[str] = frozenset(f.name for f in fields(CacheKnobs))


@dataclass(frozen=True)
class CacheConfig:
    """The cache's knobs (`CacheKnobs`) and the sizes computed for them.

    `groups` lists the model's layer groups in the order the runner sees them (e.g. target
    attention, SSM, drafter attention); every group uses the knobs' `block_size`.

    `num_state_pages`: SSM states live in a pool of their own of this many pages, and
    `num_blocks` counts attention blocks only; None: one pool of `num_blocks` pages serves both
    kinds (see `hycache.cache.layout`).

    `recompute_cost` prices a hit's saved FLOPs for `flop-aware` eviction (None:
    `RecomputeCost()`'s defaults).

    The knobs read through: `config.block_size` is `config.knobs.block_size`, for every knob.
    """

    knobs: CacheKnobs = field(default_factory=CacheKnobs)
    num_blocks: int = 1024
    num_state_pages: int | None = None
    max_model_len: int = 4096
    groups: tuple[GroupKind, ...] = (GroupKind.ATTENTION, GroupKind.SSM)
    recompute_cost: RecomputeCost | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.knobs, CacheKnobs):
            raise ValueError(f"knobs: must be a CacheKnobs, got {type(self.knobs).__name__}")
        object.__setattr__(self, "groups", tuple(GroupKind(g) for g in self.groups))
        if self.max_model_len <= 0:
            raise ValueError(f"max_model_len: must be positive, got {self.max_model_len}")
        if not self.groups:
            raise ValueError("groups: at least one layer group is required")
        need = self.min_blocks()
        if self.num_blocks < need:
            raise ValueError(
                f"num_blocks: {self.num_blocks} blocks cannot hold one request of max_model_len "
                f"{self.max_model_len} (needs at least {need} with {len(self.groups)} groups at "
                f"block_size {self.block_size}); raise num_blocks or lower max_model_len"
            )
        if self.num_state_pages is not None and self.num_state_pages < self.min_state_pages():
            raise ValueError(
                f"num_state_pages: {self.num_state_pages} pages cannot hold one request's SSM "
                f"states (needs at least {self.min_state_pages()}); raise num_state_pages"
            )

    def with_knobs(self, **changes: Any) -> CacheConfig:
        """This config with some knobs changed (an arm's policy, say); the sizes kept."""
        return replace(self, knobs=self.knobs.replace(**changes))

    def __getattr__(self, name: str) -> Any:
        """The knobs read through (`config.block_size` is `config.knobs.block_size`): called
        only for a name the config itself lacks, so no knob is declared twice."""
        if name in KNOB_NAMES:
            return getattr(object.__getattribute__(self, "knobs"), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def unit(self) -> int:
        """The prefix-match unit `u` (equal to the block size when unset)."""
        return self.knobs.unit

    # -- sizes -----------------------------------------------------------------------------------

    @property
    def num_attention_groups(self) -> int:
        return sum(g is GroupKind.ATTENTION for g in self.groups)

    @property
    def num_ssm_groups(self) -> int:
        return sum(g is GroupKind.SSM for g in self.groups)

    def min_blocks(self) -> int:
        """Blocks one maximal request needs: the null block, a full attention table per
        attention group, and per SSM group a running state, a held source and a fresh
        checkpoint, plus one copy-on-write block per attention group."""
        per_table = math.ceil(self.max_model_len / self.block_size)
        ssm = 0 if self.num_state_pages is not None else 3 * self.num_ssm_groups
        return 1 + self.num_attention_groups * (per_table + 1) + ssm

    def min_state_pages(self) -> int:
        """With a pool of SSM pages: the null page, and per SSM group a running state, a held
        source and a fresh checkpoint."""
        return 1 + 3 * self.num_ssm_groups


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding with an EAGLE/MTP drafter.

    `eagle_drop` defaults to on whenever drafts are proposed: the drafter needs the target's
    hidden state of the token before each position, so a hit must either recompute its last
    match unit (the drop policies, architecture §4.4) or be keyed on the next token as well
    (`lookahead`, `limit`: architecture §4.5).
    """

    num_speculative_tokens: int = 0
    eagle_drop: bool | None = None
    acceptance_rate: float = 0.7

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 0:
            raise ValueError(
                f"num_speculative_tokens: must be >= 0, got {self.num_speculative_tokens}"
            )
        if not 0.0 <= self.acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate: must lie in [0, 1], got {self.acceptance_rate}")
        if self.eagle_drop is None:
            object.__setattr__(self, "eagle_drop", self.num_speculative_tokens > 0)

    def drop(self, cache: CacheConfig) -> int:
        """The EAGLE drop `d`: one match unit (the block when unset), or 0 without a drafter."""
        return cache.unit if self.eagle_drop else 0


@dataclass(frozen=True)
class SchedulerConfig:
    """`wait_for_inflight_prefix`: a waiting request whose prefix a running request is
    computing (or will checkpoint) waits for it instead of recomputing it (architecture §4.7).

    `saturated_chunk_tokens`: while the batch is full of sequences (at most one of
    `max_num_seqs` free), more requests wait than slots are free, and the batch has decoding
    requests, a prefill chunk is at most this long (0: no cap). The requests then wait for
    decodes to finish, and each step that carries prefill hides the decoding requests'
    memory-bound pass under its compute: more, shorter chunks finish the decodes sooner
    (docs/admission.md, "The default against the split arms").

    `step_packing`: when the scheduler is given a step-cost oracle (the simulator's cost
    model), a chunk that finishes a prefill beside decoding requests, while nobody waits, is
    cut at the prefill tokens the step absorbs for free (`hycache.sched.chunking`); False:
    never cut (docs/admission.md, "Step packing")."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 64
    wait_for_inflight_prefix: bool = True
    saturated_chunk_tokens: int = 1024
    step_packing: bool = True

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens <= 0:
            raise ValueError(
                f"max_num_batched_tokens: must be positive, got {self.max_num_batched_tokens}"
            )
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs: must be positive, got {self.max_num_seqs}")
        if self.saturated_chunk_tokens < 0:
            raise ValueError(
                f"saturated_chunk_tokens: must be >= 0, got {self.saturated_chunk_tokens}"
            )


@dataclass(frozen=True)
class HycacheConfig:
    """The three configs together, with the checks that need more than one of them."""

    cache: CacheConfig = field(default_factory=CacheConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        b = self.cache.block_size
        k = self.speculative.num_speculative_tokens
        c = self.cache
        # a decode step also holds slots for k drafts and the drafter's k chained rows
        need = c.min_blocks() + c.num_attention_groups * (
            math.ceil((c.max_model_len + 2 * k) / b) - math.ceil(c.max_model_len / b)
        )
        if c.num_blocks < need:
            raise ValueError(
                f"num_blocks: {c.num_blocks} blocks cannot hold one request of max_model_len "
                f"{c.max_model_len} with {k} speculative tokens (needs {need}); raise num_blocks"
            )
        if self.scheduler.max_num_batched_tokens < 1 + k:
            raise ValueError(
                f"max_num_batched_tokens: {self.scheduler.max_num_batched_tokens} cannot fit one "
                f"speculative decode step of {1 + k} tokens"
            )
