"""Building blocks shared by the hybrid architectures and the EAGLE draft head.

Owns: `RMSNorm`, rotary embeddings (`rope_cos_sin`, `apply_rope`, honouring a partial rotary
factor), the SwiGLU `MLP`, grouped-query `Attention` over a `PagedKVCache` (with RoPE or with
no positional encoding, and a configurable score scale), and
`AttentionPlan` - the per-step slot bookkeeping (where new K/V go, which slots each request
reads, the causal masks) computed once per forward and shared by all attention layers that use
the same block tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from hycache.model.paged import PagedKVCache, StepBatch

if TYPE_CHECKING:
    from hycache.model.config import HybridConfig

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
    exponent = torch.arange(0, rotary_dim, 2, dtype=cdt, device=positions.device) / rotary_dim
    inv_freq = 1.0 / (theta**exponent)  # (rotary_dim / 2,)
    freqs = positions.to(cdt)[:, None] * inv_freq[None, :]  # (N, rotary_dim / 2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (N, rotary_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


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

    Attributes:
        write_slots: (N,) flat slot (block * block_size + row) where each new token's K/V go.
        starts: request r's tokens are rows starts[r] .. starts[r + 1] - 1.
        read_slots: per request, (context_len + query_len,) flat slots of positions 0.. in order.
        positions: (N,) absolute positions (for the causal masks).
        padded: one batched layout for the requests with short queries (decode / verify), or
            None when there are none.
        long_reqs: the other requests (prefill chunks), attended one at a time in query tiles.
    """

    write_slots: torch.Tensor
    starts: list[int]
    read_slots: list[torch.Tensor]
    positions: torch.Tensor
    padded: PaddedAttention | None
    long_reqs: list[int]

    @classmethod
    def build(cls, batch: StepBatch, kv: PagedKVCache, device: torch.device) -> AttentionPlan:
        block_size = kv.block_size
        starts = batch.query_starts()
        positions = batch.positions.to(device)
        write_parts: list[torch.Tensor] = []
        read_slots: list[torch.Tensor] = []
        for r in range(batch.num_requests):
            total = batch.context_lens[r] + batch.query_lens[r]
            table = batch.block_tables[r]
            if len(table) * block_size < total:
                raise ValueError(
                    f"StepBatch.block_tables[{r}] has {len(table)} blocks of {block_size}, "
                    f"too few for {total} tokens"
                )
            used = table[: -(-total // block_size)]
            if any(not 0 <= blk < kv.num_blocks for blk in used):
                raise ValueError(
                    f"StepBatch.block_tables[{r}] holds block ids outside [0, {kv.num_blocks})"
                )
            bt = torch.tensor(used, dtype=torch.int64, device=device)  # (blocks,)
            pos = torch.arange(total, dtype=torch.int64, device=device)  # (T,)
            slots = bt[pos // block_size] * block_size + pos % block_size  # (T,)
            read_slots.append(slots)
            write_parts.append(slots[batch.context_lens[r] :])
        write_slots = torch.cat(write_parts)  # (N,)
        short = [r for r, q in enumerate(batch.query_lens) if q <= PADDED_ATTENTION_MAX_QUERY]
        long_reqs = [r for r, q in enumerate(batch.query_lens) if q > PADDED_ATTENTION_MAX_QUERY]
        padded = None
        if short:
            padded = PaddedAttention.build(batch, short, read_slots, positions, starts, device)
        return cls(write_slots, starts, read_slots, positions, padded, long_reqs)


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
        positions: torch.Tensor,
        starts: list[int],
        device: torch.device,
    ) -> PaddedAttention:
        nreq = len(reqs)
        q_max = max(batch.query_lens[r] for r in reqs)
        t_max = max(read_slots[r].shape[0] for r in reqs)
        rows = torch.zeros(nreq, q_max, dtype=torch.int64, device=device)  # (R, q_max)
        valid = torch.zeros(nreq, q_max, dtype=torch.bool, device=device)  # (R, q_max)
        slots = torch.zeros(nreq, t_max, dtype=torch.int64, device=device)  # (R, T_max)
        lens = torch.tensor([read_slots[r].shape[0] for r in reqs], device=device)  # (R,)
        for i, r in enumerate(reqs):
            q = batch.query_lens[r]
            rows[i, :q] = torch.arange(starts[r], starts[r] + q, device=device)
            valid[i, :q] = True
            slots[i, : read_slots[r].shape[0]] = read_slots[r]
        qpos = torch.where(valid, positions[rows], lens[:, None] - 1)  # (R, q_max)
        keys = torch.arange(t_max, device=device)  # (T_max,)
        causal = keys[None, None, :] <= qpos[:, :, None]  # (R, q_max, T_max)
        mask = causal & (keys[None, None, :] < lens[:, None, None])  # (R, q_max, T_max)
        return cls(rows, valid, slots, mask[:, None])  # mask: (R, 1, q_max, T_max)


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
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)  # (N, heads, head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)  # (N, kv_heads, head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)  # (N, kv_heads, head_dim)
        if cos is not None and sin is not None:
            q = apply_rope(q, cos, sin)  # (N, heads, head_dim)
            k = apply_rope(k, cos, sin)  # (N, kv_heads, head_dim)
        kv.write(kv_layer, plan.write_slots, k, v)

        out = torch.empty_like(q)  # (N, heads, head_dim)
        if plan.padded is not None:
            self._padded(q, out, plan.padded, kv, kv_layer)
        for r in plan.long_reqs:
            s, e = plan.starts[r], plan.starts[r + 1]
            out[s:e] = self._one_request(
                q[s:e], plan.positions[s:e], plan.read_slots[r], kv, kv_layer
            )
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))

    def _sdpa(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """q: (B, heads, L, head_dim), k, v: (B, kv_heads, S, head_dim), mask: bool broadcastable
        to (B, heads, L, S) -> (B, heads, L, head_dim)."""
        return F.scaled_dot_product_attention(
            q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=self.scale, enable_gqa=True
        )

    def _one_request(
        self,
        q: torch.Tensor,
        qpos: torch.Tensor,
        slots: torch.Tensor,
        kv: PagedKVCache,
        kv_layer: int,
    ) -> torch.Tensor:
        """q: (q_len, heads, head_dim) attending causally to the keys at `slots` (T,)."""
        k, v = kv.gather(kv_layer, slots)  # (T, kv_heads, head_dim) each
        k = k.transpose(0, 1)[None]  # (1, kv_heads, T, head_dim)
        v = v.transpose(0, 1)[None]  # (1, kv_heads, T, head_dim)
        keys = torch.arange(slots.shape[0], device=q.device)  # (T,)
        out = torch.empty_like(q)  # (q_len, heads, head_dim)
        for a in range(0, q.shape[0], ATTENTION_QUERY_TILE):
            b = min(a + ATTENTION_QUERY_TILE, q.shape[0])
            hi = int(qpos[b - 1].item()) + 1  # keys beyond the tile's last position are unused
            mask = keys[None, :hi] <= qpos[a:b, None]  # (tile, hi)
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
