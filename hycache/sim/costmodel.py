"""Roofline cost model: how long one scheduled step takes on a given GPU.

This module owns the step-time arithmetic of the simulator. The simulator runs the real
scheduler and cache; for every step it describes the work (:class:`StepWork`: per request, how
many tokens are computed, over how much cached context, how many of them are drafts) and asks
:meth:`CostModel.step_time` how far to advance its virtual clock. It also sizes the cache:
:meth:`CostModel.block_bytes` and :meth:`CostModel.num_blocks` (one shared pool), or
:meth:`CostModel.pool_sizes` (either layout, see :data:`POOL_LAYOUTS`).

A step is a sequence of phases, each timed by a roofline,
``max(FLOPs / (peak * compute_eff), bytes / (bandwidth * bw_eff))``, plus fixed overheads:
block copies (memory only), the target's forward, and, with speculative decoding, the drafter's
passes (one over every new token, then ``k - 1`` more over the decoding requests). The
equations, what they ignore and where the constants come from are in ``docs/cost-model.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from hycache.cache.layout import PoolSizes, shared_page_bytes, split_budget
from hycache.cache.layout import attention_block_bytes as layout_block_bytes
from hycache.config import RecomputeCost
from hycache.sched.chunking import StepSeq
from hycache.sim.model_spec import ModelSpec
from hycache.sim.presets import GpuSpec
from hycache.sim.terms import resolve

__all__ = [
    "POOL_LAYOUTS",
    "CostModel",
    "PhaseCost",
    "PoolLayout",
    "SeqWork",
    "StepWork",
]

# How the cache budget becomes pools (`hycache.cache.layout`): "shared", one pool whose page is
# the larger kind (vLLM's layout, the simulator's default); "separate", attention blocks and SSM
# pages in pools of their own, the budget split in the proportion one max-length sequence uses.
PoolLayout = Literal["shared", "separate"]
POOL_LAYOUTS: tuple[PoolLayout, ...] = get_args(PoolLayout)

# FLOPs per SSM-state element per token (state update a*h + dt*x*B, then the C.h read-out).
SSM_STATE_FLOPS_PER_ELEMENT = 6
# FLOPs per GDN state element per token: decay a*S, the read S.k, the rank-1 write delta k^T,
# the read-out S.q (the chunked form does the same reads and writes once per token: 6).
GDN_STATE_FLOPS_PER_ELEMENT = 7
# FLOPs per attention (query, key) pair per head per head_dim element: QK^T (2) + PV (2).
ATTENTION_FLOPS_PER_PAIR_ELEMENT = 4


@dataclass(frozen=True)
class SeqWork:
    """One request's share of a step."""

    num_new_tokens: int  # target tokens computed: a prefill chunk, or 1 + k when verifying k
    context_len: int  # tokens already in the cache before this step (attention reads them)
    num_draft_tokens: int  # k when this is a speculative decode step for this request, else 0
    is_prefill: bool
    # SSM checkpoints written inside this forward before its end (internal checkpoints): each
    # is a state write (bytes), not a step boundary
    num_state_writes: int = 0
    # of a decoding request's context, the tokens in blocks an earlier decoding request of the
    # same step reads too (warm in a CPU's caches by then: `warm_kv_bytes_factor`)
    shared_context_len: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.shared_context_len <= self.context_len:
            raise ValueError(
                f"shared_context_len must be in [0, context_len={self.context_len}], "
                f"got {self.shared_context_len}"
            )
        if self.num_state_writes < 0:
            raise ValueError(f"num_state_writes must be >= 0, got {self.num_state_writes}")
        if self.num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be >= 1, got {self.num_new_tokens}")
        if self.context_len < 0:
            raise ValueError(f"context_len must be >= 0, got {self.context_len}")
        if self.num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {self.num_draft_tokens}")
        if self.num_draft_tokens >= self.num_new_tokens:
            raise ValueError(
                f"num_draft_tokens ({self.num_draft_tokens}) must be < num_new_tokens "
                f"({self.num_new_tokens}): a verify step computes 1 + k positions"
            )
        if self.is_prefill and self.num_draft_tokens:
            raise ValueError("a prefill chunk carries no draft tokens")


@dataclass(frozen=True)
class StepWork:
    """Everything one engine step computes."""

    seqs: tuple[SeqWork, ...]
    num_block_copies: int = 0  # block copies (copy-on-write, checkpoint freezes) run first

    def __post_init__(self) -> None:
        if self.num_block_copies < 0:
            raise ValueError(f"num_block_copies must be >= 0, got {self.num_block_copies}")

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)


@dataclass(frozen=True)
class PhaseCost:
    """One roofline-timed phase of a step."""

    name: str
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    overhead_s: float
    overlap: bool = True  # compute and memory overlap (a roofline); False: they add up

    @property
    def time_s(self) -> float:
        if not self.overlap:
            return self.compute_s + self.memory_s + self.overhead_s
        return max(self.compute_s, self.memory_s) + self.overhead_s


def _attention_pairs(num_new: int, context: int) -> float:
    """(query, key) pairs of a causal chunk of ``num_new`` queries after ``context`` keys."""
    return num_new * context + num_new * (num_new + 1) / 2


class CostModel:
    """Step times for ``model`` on ``gpu``.

    The terms (efficiencies, overheads, K/V factors and switches, each with its meaning,
    range and fallback: :data:`hycache.sim.terms.TERMS`) are keyword arguments; one unset
    takes the GPU preset's value, else its fallback (:func:`hycache.sim.terms.resolve`), and
    each is an attribute of the model (``cost.kv_bytes_factor``). Every GPU preset leaves
    the CPU engine's terms unset, so their fallbacks keep the GPU roofline.

    ``block_size`` (optional) lets block copies cost a whole page (:meth:`block_bytes`); without
    it a copy costs one SSM state. ``pool_layout`` is the cache layout the copies run in: with
    ``"separate"`` pools a copy (always a copy-on-write of an attention block) moves one
    attention block (:meth:`attention_block_bytes`), not a shared page.
    ``intermediate_state_writes`` models verify kernels that write the SSM state after every
    verified position (so a rejected draft can be rolled back); turn it off for kernels that
    write only the final state.
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        *,
        speculative: bool,
        num_speculative_tokens: int,
        block_size: int | None = None,
        intermediate_state_writes: bool = True,
        pool_layout: PoolLayout = "shared",
        **terms: float | bool | None,
    ) -> None:
        self.model = model
        self.gpu = gpu
        # every term (`hycache.sim.terms.TERMS`) as an attribute: the caller's value, else
        # the preset's, else its fallback
        self.terms = resolve(terms, gpu)
        for name, value in self.terms.terms().items():
            setattr(self, name, value)
        if num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
        if speculative and num_speculative_tokens < 1:
            raise ValueError("speculative decoding needs num_speculative_tokens >= 1")
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        check_pool_layout(pool_layout)
        self.speculative = speculative
        self.num_speculative_tokens = num_speculative_tokens if speculative else 0
        self.block_size = block_size
        self.intermediate_state_writes = intermediate_state_writes
        self.pool_layout: PoolLayout = pool_layout

        self._flops_rate = gpu.peak_flops * self.compute_efficiency
        self._bytes_rate = gpu.hbm_bandwidth * self.bandwidth_efficiency
        self._copy_rate = gpu.hbm_bandwidth * self.copy_efficiency
        self._state_rate = gpu.hbm_bandwidth * self.state_copy_efficiency

    @property
    def prices_warm_context(self) -> bool:
        """Whether a decoding request's shared context costs other than its own
        (`SeqWork.shared_context_len` matters to the step time)."""
        return self.warm_kv_bytes_factor != self.decode_kv_bytes_factor

    def without_drafter(self) -> CostModel:
        """The same model, GPU and constants with speculative decoding off: no drafter passes,
        no drafter weights or KV in memory (so more cache pages fit)."""
        return CostModel(
            self.model,
            self.gpu,
            speculative=False,
            num_speculative_tokens=0,
            block_size=self.block_size,
            intermediate_state_writes=self.intermediate_state_writes,
            pool_layout=self.pool_layout,
            **self.terms.terms(),
        )

    # --- memory sizing ------------------------------------------------------------------------

    @property
    def _cached_attention_layers(self) -> int:
        """Attention layers whose K/V is cached: the drafter's too when speculative (its KV
        is kept for every cached position)."""
        m = self.model
        return m.layers.attention + (m.drafter.num_layers if self.speculative else 0)

    @property
    def attention_bytes_per_token(self) -> int:
        """K and V of one token across every cached attention layer."""
        return self.attention_block_bytes(1)

    def attention_block_bytes(self, block_size: int) -> int:
        """Bytes of one attention block: ``block_size`` tokens of K and V for every cached
        attention layer (`hycache.cache.layout.attention_block_bytes`)."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        a, m = self.model.attention, self.model
        layers = self._cached_attention_layers
        return layout_block_bytes(layers, block_size, a.num_kv_heads, a.head_dim, m.dtype_bytes)

    def block_bytes(self, block_size: int) -> int:
        """Bytes of one page of the shared pool.

        An attention block holds ``block_size`` tokens of K and V for every attention layer; an
        SSM block holds one conv + SSM state for every Mamba layer. The pool is shared, so one
        page is as large as the larger of the two.
        """
        return shared_page_bytes(self.attention_block_bytes(block_size), self.model.ssm_state_bytes)

    def balanced_block_size(self, multiple: int = 16) -> int:
        """Smallest block size (a multiple of ``multiple``) whose attention block is at least
        as large as one SSM state, so neither kind of page wastes much of the shared pool."""
        if multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {multiple}")
        per_token = self.attention_bytes_per_token
        if per_token == 0:
            return multiple
        tokens = -(-self.model.ssm_state_bytes // per_token)
        return max(multiple, -(-tokens // multiple) * multiple)

    @property
    def resident_weight_bytes(self) -> int:
        """Target weights, plus the drafter's own layers when speculative decoding is on."""
        extra = self.model.drafter_weight_bytes if self.speculative else 0
        return self.model.weight_bytes + extra

    def num_blocks(self, block_size: int, *, memory_fraction: float = 0.9) -> int:
        """Pages of one shared pool that fit in ``memory_fraction`` of GPU memory after the
        weights."""
        return self.cache_budget_bytes(memory_fraction) // self.block_bytes(block_size)

    def pool_sizes(
        self,
        block_size: int,
        max_model_len: int,
        *,
        layout: PoolLayout,
        memory_fraction: float = 0.9,
        attention_groups: int = 1,
    ) -> PoolSizes:
        """The cache's pools in ``memory_fraction`` of GPU memory after the weights.

        ``"shared"``: :meth:`num_blocks` pages of one pool, ``num_state_pages`` None (the
        :class:`~hycache.config.CacheConfig` meaning of one shared pool). ``"separate"``:
        :func:`hycache.cache.layout.split_budget` of the same budget into attention blocks of
        :meth:`attention_block_bytes` and SSM pages of one state each, in the proportion one
        ``max_model_len`` sequence uses. ``attention_groups`` is the number of attention
        groups in the cache config; the simulator's config has one (the drafter's K/V rides in
        the same blocks: :attr:`attention_bytes_per_token` counts its layer).
        """
        check_pool_layout(layout)
        if layout == "shared":
            pages = self.num_blocks(block_size, memory_fraction=memory_fraction)
            # None: CacheConfig's "one shared pool" (PoolSizes annotates the field as int)
            return PoolSizes(pages, None)
        return split_budget(
            self.cache_budget_bytes(memory_fraction),
            attention_block_bytes=self.attention_block_bytes(block_size),
            state_page_bytes=self.model.ssm_state_bytes,
            max_model_len=max_model_len,
            block_size=block_size,
            attention_groups=attention_groups,
        )

    def cache_budget_bytes(self, memory_fraction: float = 0.9) -> int:
        """Bytes left for the cache in ``memory_fraction`` of GPU memory after the weights."""
        if not 0.0 < memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
        budget = int(self.gpu.memory_bytes * memory_fraction) - self.resident_weight_bytes
        if budget <= 0:
            raise ValueError(
                f"model {self.model.name!r} weights ({self.resident_weight_bytes / 1e9:.1f} GB) "
                f"do not fit in {memory_fraction:.0%} of {self.gpu.name} memory "
                f"({self.gpu.memory_bytes / 1e9:.1f} GB)"
            )
        return budget

    # --- step time ------------------------------------------------------------------------

    def _phase(
        self,
        name: str,
        flops: float,
        nbytes: float,
        overhead_s: float,
        *,
        copy_bytes: float = 0.0,
        state_bytes: float = 0.0,
    ) -> PhaseCost:
        """A phase moving `nbytes` at the forward's bandwidth, plus `copy_bytes` of block
        copies and `state_bytes` of SSM state copies at their own."""
        memory_s = nbytes / self._bytes_rate
        memory_s += copy_bytes / self._copy_rate + state_bytes / self._state_rate
        return PhaseCost(
            name=name,
            flops=flops,
            bytes=nbytes + copy_bytes + state_bytes,
            compute_s=flops / self._flops_rate,
            memory_s=memory_s,
            overhead_s=overhead_s,
            overlap=self.phase_overlap,
        )

    def _ssm_flops_per_layer(self, num_new: int) -> float:
        mb = self.model.mamba
        conv = 2 * mb.d_conv * mb.conv_dim
        q = min(mb.chunk_size, num_new)
        if mb.kind == "gdn":
            # per value head: the state term on a (V, K) state; chunked, per token and chunk
            # position, K.K^T and Q.K^T (2K each), the triangular solve (V + K) and the
            # intra-chunk read (2V): q (5K + 3V)
            k, v = mb.d_state, mb.head_dim
            per_token = GDN_STATE_FLOPS_PER_ELEMENT * mb.num_heads * v * k + conv
            if num_new > 1:
                per_token += q * mb.num_heads * (5 * k + 3 * v)
            return per_token * num_new
        state = SSM_STATE_FLOPS_PER_ELEMENT * mb.num_heads * mb.head_dim * mb.d_state
        per_token = state + conv
        if num_new > 1:  # chunked SSD: the quadratic intra-chunk term
            per_token += 2 * q * (mb.n_groups * mb.d_state + mb.num_heads * mb.head_dim)
        return per_token * num_new

    def _attention_flops_per_layer(self, num_new: int, context: int) -> float:
        a = self.model.attention
        pairs = _attention_pairs(num_new, context)
        return ATTENTION_FLOPS_PER_PAIR_ELEMENT * a.num_heads * a.head_dim * pairs

    def _moe_weight_bytes(self, num_tokens: int) -> float:
        """Routed-expert bytes read: experts touched by ``num_tokens`` uniform top-k draws."""
        m = self.model
        moe = m.moe
        if moe is None or moe.num_blocks == 0:
            return 0.0
        e, k = moe.num_experts, moe.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** num_tokens)
        per_expert = m.moe_expert_params / (moe.num_blocks * e)
        return moe.num_blocks * touched * per_expert * m.dtype_bytes

    def _check(self, work: StepWork) -> None:
        for s in work.seqs:
            if s.num_draft_tokens and not self.speculative:
                raise ValueError("num_draft_tokens > 0 but speculative decoding is off")
            if s.num_draft_tokens > self.num_speculative_tokens:
                raise ValueError(
                    f"num_draft_tokens ({s.num_draft_tokens}) exceeds num_speculative_tokens "
                    f"({self.num_speculative_tokens})"
                )

    def phases(self, work: StepWork) -> list[PhaseCost]:
        """The step's phases in execution order (empty for an empty step)."""
        self._check(work)
        out: list[PhaseCost] = []
        if not work.seqs and not work.num_block_copies:
            return out

        if work.num_block_copies:
            page = self.copy_bytes()
            nbytes = 2.0 * work.num_block_copies * page
            out.append(self._phase("block_copies", 0.0, 0.0, 0.0, copy_bytes=nbytes))

        if work.seqs:
            out.append(self._target_phase(work))
        if work.seqs and self.speculative:
            out.extend(self._drafter_phases(work))

        # The fixed per-step cost: scheduling, input preparation, sampling, launches (and,
        # when a calibrated profile has one, a cost per request scheduled).
        overhead = self.step_overhead_s + self.seq_overhead_s * len(work.seqs)
        out.append(self._phase("step_overhead", 0.0, 0.0, overhead))
        return out

    def _target_phase(self, work: StepWork) -> PhaseCost:
        m = self.model
        dt = m.dtype_bytes
        tokens = work.num_tokens
        n_attn, n_mamba = m.layers.attention, m.layers.mamba

        logits = sum(1 if s.is_prefill else s.num_new_tokens for s in work.seqs)
        flops = 2.0 * m.body_active_params * tokens + 2.0 * m.hidden_size * m.vocab_size * logits
        dense_body = m.body_total_params - m.moe_expert_params
        nbytes = float(dense_body * dt) + self._moe_weight_bytes(tokens) + m.lm_head_params * dt
        state_bytes = 0.0

        for s, attended in zip(work.seqs, self._attended(work), strict=True):
            n, c = s.num_new_tokens, s.context_len
            flops += n_attn * self._attention_flops_per_layer(n, attended)
            flops += n_mamba * self._ssm_flops_per_layer(n)
            # read the context, write the new ones
            nbytes += n_attn * m.kv_bytes_per_token_per_layer * self._kv_tokens(s, attended, n)
            if n_mamba:
                reads = 1 if c > 0 else 0  # a fresh request starts from a zero state
                writes = 1 + s.num_state_writes
                if self.intermediate_state_writes and s.num_draft_tokens:
                    writes += s.num_draft_tokens
                if not s.is_prefill:  # one read and one write per rewrite
                    reads += self.decode_state_rewrites * n
                    writes += self.decode_state_rewrites * n
                state_bytes += (reads + writes) * m.ssm_state_bytes
        return self._phase("target", flops, nbytes, 0.0, state_bytes=state_bytes)

    def _kv_tokens(self, s: SeqWork, attended: int, new: int) -> float:
        """K/V token rows a request moves reading `attended` keys and `new` more, each at its
        factor: a prefill chunk's at `kv_bytes_factor`; a decoding request's own context and
        new rows at `decode_kv_bytes_factor`, its shared context and padding at
        `warm_kv_bytes_factor`."""
        if s.is_prefill:
            return self.kv_bytes_factor * (attended + new)
        cold = s.context_len - s.shared_context_len
        warm = attended - cold
        return self.decode_kv_bytes_factor * (cold + new) + self.warm_kv_bytes_factor * warm

    def _attended(self, work: StepWork) -> list[int]:
        """The context each request's attention reads: its own, or with
        `padded_decode_attention` the longest among the step's decoding requests."""
        ctx = [s.context_len for s in work.seqs]
        if not self.padded_decode_attention:
            return ctx
        longest = max((s.context_len for s in work.seqs if not s.is_prefill), default=0)
        return [c if s.is_prefill else longest for s, c in zip(work.seqs, ctx, strict=True)]

    def _drafter_phases(self, work: StepWork) -> list[PhaseCost]:
        m = self.model
        dt = m.dtype_bytes
        kv_layer = m.kv_bytes_per_token_per_layer * m.drafter.num_layers
        a = m.attention
        attn_per_pair = ATTENTION_FLOPS_PER_PAIR_ELEMENT * a.num_heads * a.head_dim
        attn_per_pair *= m.drafter.num_layers
        head_flops_per_row = 2.0 * m.hidden_size * m.vocab_size
        weights = float(m.drafter_weight_bytes + m.lm_head_params * dt)
        out: list[PhaseCost] = []

        # Pass 1: over every new token of the step (prefill chunks build the drafter's KV;
        # verified positions feed the first draft). One draft logit row per request.
        tokens = work.num_tokens
        flops = 2.0 * m.drafter_layer_params * tokens + head_flops_per_row * len(work.seqs)
        nbytes = weights
        attended = self._attended(work)
        for s, a_ctx in zip(work.seqs, attended, strict=True):
            flops += attn_per_pair * _attention_pairs(s.num_new_tokens, a_ctx)
            nbytes += kv_layer * self._kv_tokens(s, a_ctx, s.num_new_tokens)
        out.append(self._phase("draft_1", flops, nbytes, self.draft_pass_overhead_s))

        # Passes 2..k: one token per decoding request, sequential.
        decoding = [(s, a) for s, a in zip(work.seqs, attended, strict=True) if not s.is_prefill]
        if decoding:
            for j in range(2, self.num_speculative_tokens + 1):
                flops = (2.0 * m.drafter_layer_params + head_flops_per_row) * len(decoding)
                nbytes = weights
                for s, a_ctx in decoding:
                    ctx = a_ctx + s.num_new_tokens + j - 2
                    flops += attn_per_pair * _attention_pairs(1, ctx)
                    nbytes += kv_layer * self._kv_tokens(s, a_ctx, ctx + 1 - a_ctx)
                out.append(self._phase(f"draft_{j}", flops, nbytes, self.draft_pass_overhead_s))
        return out

    def recompute_cost(self) -> RecomputeCost:
        """The prefill FLOPs `flop-aware` eviction values cache entries by, from this model's
        own per-token terms (the target's, and the drafter's first pass when speculative):

        - `token_flops`: `2 * P_body` + every Mamba layer's state update, conv and SSD
          intra-chunk term (at a full `chunk_size` chunk) + `2 * P_draft`;
        - `pair_flops`: `4 * H_q * d` per attention layer, the drafter's included;
        - `ssm_fraction`: the Mamba layers' share of `token_flops` (their mixers' weights and
          SSM terms, plus their share, by mixer count, of the MLP / MoE weights)."""
        m = self.model
        n_attn, n_mamba = m.layers.attention, m.layers.mamba
        ssm_terms = n_mamba * self._ssm_flops_per_layer(m.mamba.chunk_size) / m.mamba.chunk_size
        mixers = n_attn * m.attention_layer_params + n_mamba * m.mamba_layer_params
        rest = max(m.body_active_params - mixers, 0)
        mamba_share = n_mamba / (n_attn + n_mamba) if n_attn + n_mamba else 0.0
        ssm = 2.0 * (n_mamba * m.mamba_layer_params + rest * mamba_share) + ssm_terms
        drafter = 2.0 * m.drafter_layer_params if self.speculative else 0.0
        token = 2.0 * m.body_active_params + ssm_terms + drafter
        a = m.attention
        layers = n_attn + (m.drafter.num_layers if self.speculative else 0)
        pair = float(ATTENTION_FLOPS_PER_PAIR_ELEMENT * a.num_heads * a.head_dim * layers)
        return RecomputeCost(token, pair, min(ssm / token, 1.0) if token else 0.0)

    def copy_bytes(self) -> int:
        """Bytes one block copy moves (read and written once each). The copies are
        copy-on-write copies of attention blocks: a whole shared page in one shared pool, one
        attention block with separate pools; without a ``block_size``, one SSM state."""
        if not self.block_size:
            return self.model.ssm_state_bytes
        if self.pool_layout == "separate":
            return self.attention_block_bytes(self.block_size)
        return self.block_bytes(self.block_size)

    def free_prefill_tokens(self, step: Sequence[StepSeq], context_len: int, limit: int) -> int:
        """The most prefill tokens (at most `limit`, after `context_len` cached ones) that can
        join `step` while every phase stays bound by its memory traffic, or is no more
        compute-bound than without them: the chunk's compute hides under time the step takes
        anyway (`hycache.sched.chunking.StepCostOracle`). 0 when phases add up instead of
        overlapping. Found by bisection: a phase's compute grows faster with the chunk than
        its memory."""
        if not self.phase_overlap or limit <= 0:
            return 0
        seqs = tuple(
            SeqWork(s.num_new_tokens, s.context_len, s.num_draft_tokens, s.is_prefill) for s in step
        )
        base = {p.name: p.compute_s for p in self.phases(StepWork(seqs))}

        def hidden(n: int) -> bool:
            work = StepWork((*seqs, SeqWork(n, context_len, 0, True)))
            return all(
                p.compute_s <= max(p.memory_s, base.get(p.name, 0.0)) for p in self.phases(work)
            )

        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hidden(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def prefill_cost(self, context: int, num_tokens: int) -> float:
        """Seconds one pass prefilling `num_tokens` after `context` cached ones takes, alone
        (`hycache.cache.stops.PassPricer`)."""
        if num_tokens <= 0:
            return 0.0
        return self.step_time(StepWork((SeqWork(num_tokens, context, 0, True),)))

    def split_cost(self, context: int, first: int, rest: int) -> float:
        """Seconds that running `first + rest` prefill tokens as two passes adds over one
        (`hycache.cache.stops.PassPricer`): the second pass's weight read and overheads, less
        what the first chunk's compute already hid."""
        if first <= 0 or rest <= 0:
            return 0.0
        two = self.prefill_cost(context, first) + self.prefill_cost(context + first, rest)
        return max(two - self.prefill_cost(context, first + rest), 0.0)

    def step_time(self, work: StepWork) -> float:
        """Seconds the step takes (0 for a step with no work)."""
        return sum(p.time_s for p in self.phases(work))

    def breakdown(self, work: StepWork) -> dict[str, float]:
        """Totals of the step's phases, for docs and debugging.

        ``compute_s`` and ``memory_s`` sum each phase's compute and memory terms; ``time_s``
        is the step time (each phase contributes its larger term, plus overheads).
        """
        ph = self.phases(work)
        target = [p for p in ph if p.name == "target"]
        draft = [p for p in ph if p.name.startswith("draft_")]
        copies = [p for p in ph if p.name == "block_copies"]
        return {
            "flops": sum(p.flops for p in ph),
            "bytes": sum(p.bytes for p in ph),
            "compute_s": sum(p.compute_s for p in ph),
            "memory_s": sum(p.memory_s for p in ph),
            "overhead_s": sum(p.overhead_s for p in ph),
            "time_s": sum(p.time_s for p in ph),
            "target_flops": sum(p.flops for p in target),
            "target_bytes": sum(p.bytes for p in target),
            "target_s": sum(p.time_s for p in target),
            "draft_flops": sum(p.flops for p in draft),
            "draft_bytes": sum(p.bytes for p in draft),
            "draft_s": sum(p.time_s for p in draft),
            "num_draft_passes": float(len(draft)),
            "copy_bytes": sum(p.bytes for p in copies),
            "tokens": float(work.num_tokens),
        }


def check_pool_layout(layout: str) -> None:
    """Raise ValueError unless ``layout`` is one of :data:`POOL_LAYOUTS`."""
    if layout not in POOL_LAYOUTS:
        raise ValueError(f"pool layout must be one of {', '.join(POOL_LAYOUTS)}, got {layout!r}")
