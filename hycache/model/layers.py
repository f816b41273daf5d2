"""Building blocks shared by the hybrid architectures and the EAGLE draft head.

Owns: `RMSNorm`, rotary embeddings (`rope_cos_sin`, `apply_rope`, honouring a partial rotary
factor), the SwiGLU `MLP`, grouped-query `Attention` over a `PagedKVCache` (with RoPE or with
no positional encoding, and a configurable score scale), and
`AttentionPlan` - the per-step slot bookkeeping (where new K/V go, which slots each request
reads, the causal masks) computed once per forward and shared by all attention layers that use
the same block tables.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from hycache.model.paged import PagedKVCache, StepBatch

if TYPE_CHECKING:
    from hycache.model.configs.base import HybridConfig

# Requests whose query length is at most this go through one padded, batched attention call;
# longer ones (prefill chunks) are handled one request at a time in query tiles.
PADDED_ATTENTION_MAX_QUERY = 32
# Query rows per SDPA call in the per-request path (bounds the size of the mask).
ATTENTION_QUERY_TILE = 2048


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision for norms, softmax-side math and SSM states: float32, or float64 if asked."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps), normalised in float32 (float64 for float64).

    `weight_in_compute_dtype`: multiply by the weight before casting back to the input dtype
    (Nemotron-H) rather than after (Llama, Bamba, Granite); the same in float32.
    """

    def __init__(
        self, hidden_size: int, eps: float, *, weight_in_compute_dtype: bool = False
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.weight_in_compute_dtype = weight_in_compute_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        cdt = compute_dtype(in_dtype)
        if cdt == in_dtype == self.weight.dtype:
            # no casts: both weight placements are the same math; one fused op (bit-identical)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.to(cdt)  # (..., hidden)
        var = xf.pow(2).mean(-1, keepdim=True)  # (..., 1)
        normed = xf * torch.rsqrt(var + self.eps)
        if self.weight_in_compute_dtype:
            return (self.weight.to(cdt) * normed).to(in_dtype)
        return self.weight * normed.to(in_dtype)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_cos_sin(
    positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (N, rotary_dim) for absolute positions (N,).

    Angles are computed in float32 as transformers does (float64 for float64 models), in the
    non-interleaved layout: frequencies repeated as [f_0 .. f_{d/2-1}, f_0 .. f_{d/2-1}].
    """
    cdt = compute_dtype(dtype)
    inv_freq = _inv_freq(rotary_dim, theta, cdt, positions.device)  # (rotary_dim / 2,)
    freqs = positions.to(cdt)[:, None] * inv_freq[None, :]  # (N, rotary_dim / 2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (N, rotary_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@functools.cache
def _inv_freq(
    rotary_dim: int, theta: float, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """RoPE inverse frequencies (rotary_dim / 2,), computed once per (dim, theta, dtype, device)."""
    exponent = torch.arange(0, rotary_dim, 2, dtype=dtype, device=device) / rotary_dim
    return 1.0 / (theta**exponent)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim dims of x (N, heads, head_dim); the rest pass through."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]  # (N, heads, rot), (N, heads, head_dim - rot)
    half = rot // 2
    rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)  # (N, heads, rot)
    x_rot = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat([x_rot, x_pass], dim=-1)  # (N, heads, head_dim)


@dataclass
class AttentionPlan:
    """Slot bookkeeping for one step, shared by every attention layer using these block tables.

    Index tensors are built on the host and moved to the device once.

    Attributes:
        write_slots: (N,) flat slot (block * block_size + row) where each new token's K/V go.
        starts: request r's tokens are rows starts[r] .. starts[r + 1] - 1.
        context_lens: per request, the tokens cached before this step (its first position).
        read_slots: per request attended through `padded` or `long_reqs`, (context_len +
            query_len,) flat slots of positions 0.. in order (None for the others).
        positions: (N,) absolute positions (for the causal masks).
        decode: the batched layout when every request has exactly one new token, else None.
        padded: one batched layout for the requests with short queries (verify), or None.
        long_reqs: the other requests (prefill chunks), attended one at a time in query tiles.
    """

    write_slots: torch.Tensor
    starts: list[int]
    context_lens: list[int]
    read_slots: list[torch.Tensor | None]
    positions: torch.Tensor
    decode: DecodeAttention | None
    padded: PaddedAttention | None
    long_reqs: list[int]

    @classmethod
    def build(cls, batch: StepBatch, kv: PagedKVCache, device: torch.device) -> AttentionPlan:
        block_size = kv.block_size
        starts = batch.query_starts()
        positions = batch.positions.to(device, non_blocking=True)
        nreq = batch.num_requests
        totals = [c + q for c, q in zip(batch.context_lens, batch.query_lens, strict=True)]
        used: list[list[int]] = []
        for r in range(nreq):
            table = batch.block_tables[r]
            if len(table) * block_size < totals[r]:
                raise ValueError(
                    f"StepBatch.block_tables[{r}] has {len(table)} blocks of {block_size}, "
                    f"too few for {totals[r]} tokens"
                )
            blocks = table[: -(-totals[r] // block_size)]
            if any(not 0 <= blk < kv.num_blocks for blk in blocks):
                raise ValueError(
                    f"StepBatch.block_tables[{r}] holds block ids outside [0, {kv.num_blocks})"
                )
            used.append(blocks)
        if PADDED_ATTENTION_MAX_QUERY >= 1 and all(q == 1 for q in batch.query_lens):
            writes = [
                used[r][p // block_size] * block_size + p % block_size
                for r, p in enumerate(batch.context_lens)
            ]
            write_slots = torch.tensor(writes, dtype=torch.int64).to(device, non_blocking=True)
            decode = DecodeAttention.build(used, totals, block_size, device)
            return cls(
                write_slots, starts, batch.context_lens, [None] * nreq, positions, decode, None, []
            )
        read_cpu = [
            _slots(blocks, total, block_size) for blocks, total in zip(used, totals, strict=True)
        ]
        write_slots = torch.cat(
            [slots[c:] for slots, c in zip(read_cpu, batch.context_lens, strict=True)]
        ).to(device, non_blocking=True)  # (N,)
        read_slots: list[torch.Tensor | None] = [t.to(device, non_blocking=True) for t in read_cpu]
        short = [r for r, q in enumerate(batch.query_lens) if q <= PADDED_ATTENTION_MAX_QUERY]
        long_reqs = [r for r, q in enumerate(batch.query_lens) if q > PADDED_ATTENTION_MAX_QUERY]
        padded = None
        if short:
            padded = PaddedAttention.build(batch, short, read_cpu, starts, device)
        return cls(
            write_slots, starts, batch.context_lens, read_slots, positions, None, padded, long_reqs
        )


def _slots(blocks: list[int], total: int, block_size: int) -> torch.Tensor:
    """(total,) flat slots of positions 0 .. total - 1 on the host, from the block ids."""
    bt = torch.tensor(blocks, dtype=torch.int64)  # (blocks,)
    pos = torch.arange(total, dtype=torch.int64)  # (T,)
    return bt[pos // block_size] * block_size + pos % block_size  # (T,)


@dataclass
class DecodeAttention:
    """Every request has one new token: its keys are gathered whole blocks at a time from the
    block tables into (R, nb * block_size) rows, and one SDPA call attends them all.

    Attributes:
        blocks: (R * nb,) block ids, request-major, padded with block 0.
        nb: blocks per request after padding.
        keys: keys attended (the longest request's context + 1); the gathered rows are cut there.
        mask: (R, 1, 1, keys) bool, True for real keys, or None when every request has
            `keys` of them (the fast, mask-free SDPA path).
    """

    blocks: torch.Tensor
    nb: int
    keys: int
    mask: torch.Tensor | None

    @classmethod
    def build(
        cls, used: list[list[int]], totals: list[int], block_size: int, device: torch.device
    ) -> DecodeAttention:
        nb = max(len(b) for b in used)
        flat = [blk for b in used for blk in (*b, *[0] * (nb - len(b)))]
        keys = max(totals)
        mask = None
        if min(totals) != keys:
            lens = torch.tensor(totals, dtype=torch.int64)  # (R,)
            mask = (torch.arange(keys)[None, :] < lens[:, None])[:, None, None, :].to(
                device, non_blocking=True
            )
        return cls(
            torch.tensor(flat, dtype=torch.int64).to(device, non_blocking=True), nb, keys, mask
        )


@dataclass
class PaddedAttention:
    """Requests padded to (R, q_max) queries and (R, T_max) keys, for one SDPA call (R counts
    only the requests in this layout).

    Attributes:
        rows: (R, q_max) token row of each padded query (padding points at row 0).
        valid: (R, q_max) bool, True for real queries.
        slots: (R, T_max) flat key slots (padding points at slot 0 and is masked).
        mask: (R, 1, q_max, T_max) bool, True where a query may attend to a key.
    """

    rows: torch.Tensor
    valid: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def build(
        cls,
        batch: StepBatch,
        reqs: list[int],
        read_slots: list[torch.Tensor],
        starts: list[int],
        device: torch.device,
    ) -> PaddedAttention:
        nreq = len(reqs)
        q_max = max(batch.query_lens[r] for r in reqs)
        t_max = max(read_slots[r].shape[0] for r in reqs)
        rows = torch.zeros(nreq, q_max, dtype=torch.int64)  # (R, q_max)
        valid = torch.zeros(nreq, q_max, dtype=torch.bool)  # (R, q_max)
        qpos = torch.zeros(nreq, q_max, dtype=torch.int64)  # (R, q_max)
        slots = torch.zeros(nreq, t_max, dtype=torch.int64)  # (R, T_max)
        lens = torch.tensor([read_slots[r].shape[0] for r in reqs])  # (R,)
        for i, r in enumerate(reqs):
            q = batch.query_lens[r]
            rows[i, :q] = torch.arange(starts[r], starts[r] + q)
            valid[i, :q] = True
            # a request's positions are context_len .. context_len + q - 1; padding queries
            # sit at the last position (fully masked rows would give NaN)
            c = batch.context_lens[r]
            qpos[i] = c + q - 1
            qpos[i, :q] = torch.arange(c, c + q)
            slots[i, : read_slots[r].shape[0]] = read_slots[r]
        keys = torch.arange(t_max)  # (T_max,)
        causal = keys[None, None, :] <= qpos[:, :, None]  # (R, q_max, T_max)
        mask = causal & (keys[None, None, :] < lens[:, None, None])  # (R, q_max, T_max)
        return cls(
            rows.to(device, non_blocking=True),
            valid.to(device, non_blocking=True),
            slots.to(device, non_blocking=True),
            mask[:, None].to(device, non_blocking=True),
        )


class Attention(nn.Module):
    """Grouped-query attention over a paged KV cache, with (partial) rotary embeddings when the
    caller passes cos / sin and no positional encoding when it passes None."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        bias: bool,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)

    @classmethod
    def for_config(cls, config: HybridConfig) -> Attention:
        return cls(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.attention_bias,
            config.attention_scale,
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        plan: AttentionPlan,
        kv: PagedKVCache,
        kv_layer: int,
    ) -> torch.Tensor:
        """x: (N, hidden) -> (N, hidden). Writes the new K/V into `kv` layer `kv_layer` first.
        cos, sin: (N, rotary_dim) from `rope_cos_sin`, or None for no positional encoding."""
        n = x.shape[0]
        q, k, v, gate = self.project(x)
        if cos is not None and sin is not None:
            q = apply_rope(q, cos, sin)  # (N, heads, head_dim)
            k = apply_rope(k, cos, sin)  # (N, kv_heads, head_dim)
        out = self.attend(q, k, v, plan, kv, kv_layer)  # (N, heads, head_dim)
        out = out.reshape(n, self.num_heads * self.head_dim)
        if gate is not None:
            out = out * torch.sigmoid(gate.reshape(n, self.num_heads * self.head_dim))
        return self.o_proj(out)

    def project(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x (N, hidden) -> q (N, heads, head_dim), k, v (N, kv_heads, head_dim) and an
        output gate (N, heads, head_dim), or None for an ungated attention."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        return q, k, v, None

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        plan: AttentionPlan,
        kv: PagedKVCache,
        kv_layer: int,
    ) -> torch.Tensor:
        """Write the new k, v (N, kv_heads, head_dim) into `kv` layer `kv_layer`, then attend
        q (N, heads, head_dim) causally over each request's cached and new keys -> (N, heads,
        head_dim)."""
        kv.write(kv_layer, plan.write_slots, k, v)
        if plan.decode is not None:
            return self._decode(q, plan.decode, kv, kv_layer)  # (N, heads, head_dim)
        out = torch.empty_like(q)  # (N, heads, head_dim)
        if plan.padded is not None:
            self._padded(q, out, plan.padded, kv, kv_layer)
        for r in plan.long_reqs:
            s, e = plan.starts[r], plan.starts[r + 1]
            slots = plan.read_slots[r]
            assert slots is not None
            out[s:e] = self._one_request(
                q[s:e], plan.positions[s:e], plan.context_lens[r], slots, kv, kv_layer
            )
        return out

    def _sdpa(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """q: (B, heads, L, head_dim), k, v: (B, kv_heads, S, head_dim), mask: bool broadcastable
        to (B, heads, L, S), or None for causal attention with L == S -> (B, heads, L,
        head_dim)."""
        return F.scaled_dot_product_attention(
            q,
            k.to(q.dtype),
            v.to(q.dtype),
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
            enable_gqa=True,
        )

    def _decode(
        self, q: torch.Tensor, dec: DecodeAttention, kv: PagedKVCache, kv_layer: int
    ) -> torch.Tensor:
        """q: (R, heads, head_dim), one query per request -> (R, heads, head_dim)."""
        nreq = q.shape[0]
        kvh, rep, hd = self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim
        blocks = kv.kv[kv_layer].index_select(1, dec.blocks)  # (2, R * nb, block_size, kvh, hd)
        kv_rows = blocks.view(2, nreq, -1, kvh, hd)[:, :, : dec.keys]  # (2, R, T, kvh, hd)
        k = kv_rows[0].transpose(1, 2).to(q.dtype)  # (R, kvh, T, hd)
        v = kv_rows[1].transpose(1, 2).to(q.dtype)  # (R, kvh, T, hd)
        # One query per request: the `rep` heads sharing a KV head become `rep` query rows of
        # that head (all at the same position), so no KV head is repeated.
        qg = q.view(nreq, kvh, rep, hd)  # (R, kvh, rep, hd)
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=dec.mask, scale=self.scale)
        return o.reshape(nreq, self.num_heads, hd)

    def _one_request(
        self,
        q: torch.Tensor,
        qpos: torch.Tensor,
        context: int,
        slots: torch.Tensor,
        kv: PagedKVCache,
        kv_layer: int,
    ) -> torch.Tensor:
        """q: (q_len, heads, head_dim) at positions qpos = context .. context + q_len - 1,
        attending causally to the keys at `slots` (T,)."""
        k, v = kv.gather(kv_layer, slots)  # (T, kv_heads, head_dim) each
        k = k.transpose(0, 1)[None]  # (1, kv_heads, T, head_dim)
        v = v.transpose(0, 1)[None]  # (1, kv_heads, T, head_dim)
        keys = torch.arange(slots.shape[0], device=q.device)  # (T,)
        out = torch.empty_like(q)  # (q_len, heads, head_dim)
        for a in range(0, q.shape[0], ATTENTION_QUERY_TILE):
            b = min(a + ATTENTION_QUERY_TILE, q.shape[0])
            hi = context + b  # keys beyond the tile's last position are unused
            # a tile from position 0 is plain causal attention: the mask-free SDPA path
            mask = None if context + a == 0 else keys[None, :hi] <= qpos[a:b, None]  # (tile, hi)
            qt = q[a:b].transpose(0, 1)[None]  # (1, heads, tile, head_dim)
            o = self._sdpa(qt, k[:, :, :hi], v[:, :, :hi], mask)  # (1, heads, tile, head_dim)
            out[a:b] = o[0].transpose(0, 1)
        return out

    def _padded(
        self,
        q: torch.Tensor,
        out: torch.Tensor,
        pad: PaddedAttention,
        kv: PagedKVCache,
        kv_layer: int,
    ) -> None:
        """Attend the padded requests' queries; results go to their rows of out (N, heads,
        head_dim)."""
        k, v = kv.gather(kv_layer, pad.slots)  # (R, T_max, kv_heads, head_dim) each
        qp = q[pad.rows].transpose(1, 2)  # (R, heads, q_max, head_dim)
        o = self._sdpa(qp, k.transpose(1, 2), v.transpose(1, 2), pad.mask)  # (R, h, q_max, hd)
        o = o.transpose(1, 2)  # (R, q_max, heads, head_dim)
        out[pad.rows[pad.valid]] = o[pad.valid]
