"""The Mamba2 state-space-duality (SSD) scan: a chunked form for prefill and a recurrence.

Owns the pure tensor math of the selective scan; the mixer module in `mamba2.py` owns the
projections, the conv and the norm around it.

For one head with input x_t (head_dim P), step size dt_t > 0, scalar decay A < 0 and
input-dependent B_t, C_t (d_state N), the recurrence is

    h_t = exp(dt_t * A) * h_{t-1} + dt_t * x_t ⊗ B_t        h: (P, N)
    y_t = h_t · C_t                                         y: (P,)

(the D skip term, y_t += D * x_t, is added by the caller). Heads are split into `n_groups`
groups that share B and C: head h uses group h // (n_heads // n_groups).

`ssd_chunked` evaluates the same thing in blocks of `chunk_size` tokens: within a chunk as a
masked "attention" product (C_l · B_s) * exp(a_{s+1} + ... + a_l), across chunks by passing the
state h at chunk boundaries. It is exact up to rounding, for any chunk size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def segment_sum(a: torch.Tensor) -> torch.Tensor:
    """out[..., l, s] = a[..., s+1] + ... + a[..., l] for s <= l, and -inf above the diagonal.

    Computed by masked cumulative sums (no differences of large prefix sums, so no
    cancellation). a: (..., Q) -> (..., Q, Q).
    """
    q = a.shape[-1]
    tri_strict = torch.ones(q, q, dtype=torch.bool, device=a.device).tril(-1)
    x = a[..., :, None].expand(*a.shape, q)  # (..., Q_k, Q_s): x[k, s] = a[k]
    x = x.masked_fill(~tri_strict, 0.0)  # keep k > s
    out = torch.cumsum(x, dim=-2)  # (..., Q_l, Q_s): sum_{s < k <= l} a[k]
    tri = torch.ones(q, q, dtype=torch.bool, device=a.device).tril(0)
    return out.masked_fill(~tri, float("-inf"))


def segment_decay(a: torch.Tensor) -> torch.Tensor:
    """exp(segment_sum(a)): out[..., l, s] = exp(a[..., s+1] + ... + a[..., l]) for s <= l, and
    0 above the diagonal. The same sums as `segment_sum`, in four passes over (Q, Q) instead
    of six. a: (..., Q) -> (..., Q, Q)."""
    q = a.shape[-1]
    x = a[..., :, None].expand(*a.shape, q).tril(-1)  # x[k, s] = a[k] for k > s, else 0
    out = torch.cumsum(x, dim=-2)  # (..., Q_l, Q_s): sum_{s < k <= l} a[k]; 0 where s >= l
    return out.exp_().tril_()  # exp(0) = 1 above the diagonal, cleared


def ssd_chunked(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD scan over a whole sequence: `ssd_chunked_states(x, dt, A, B, C, chunk_size,
    initial_state=None)` with no state asked for inside the sequence. Returns y and the final
    state."""
    y, final, _ = ssd_chunked_states(*args)
    return y, final


def ssd_chunked_states(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
    state_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked SSD scan over a whole sequence, and the states after `state_at` tokens.

    Args:
        x: (batch, seqlen, n_heads, head_dim) SSM input.
        dt: (batch, seqlen, n_heads) step sizes, already softplus'ed and clamped.
        A: (n_heads,) negative decay rates.
        B: (batch, seqlen, n_groups, d_state) input matrix.
        C: (batch, seqlen, n_groups, d_state) output matrix.
        chunk_size: block length Q (any positive int; only rounding depends on it).
        initial_state: (batch, n_heads, head_dim, d_state) state before the first token, or
            None for zeros.
        state_at: token counts 1 .. seqlen - 1 after which the state is wanted too (internal
            checkpoints). Each is read out of the chunk that holds it, `start state decayed +
            the chunk's inputs up to there` (one row of the chunk's decay matrix), so the scan
            is not cut there: the chunk grid, hence y, is the same whatever is asked for.

    Returns:
        y: (batch, seqlen, n_heads, head_dim) outputs (without the D skip term).
        final_state: (batch, n_heads, head_dim, d_state) state after the last token.
        states: (batch, len(state_at), n_heads, head_dim, d_state), in `state_at`'s order.

    The sequence is scanned in pieces of `SCAN_PIECE_CHUNKS` chunks, the state carried from
    one to the next (the chunk grid is the same as in one piece).

    Everything is computed in x's dtype; callers pass float32 (or float64).
    """
    b, t, h, p = x.shape
    if not all(0 < o < t for o in state_at):
        raise ValueError(f"state_at: token counts in 1 .. {t - 1}, got {list(state_at)}")
    piece = max(1, min(chunk_size, t)) * SCAN_PIECE_CHUNKS
    if t <= piece:
        return _scan(x, dt, A, B, C, chunk_size, initial_state, state_at)
    ys: list[torch.Tensor] = []
    found: dict[int, torch.Tensor] = {}  # token count -> (batch, n_heads, head_dim, d_state)
    state = initial_state
    for a in range(0, t, piece):
        e = min(a + piece, t)
        local = [o - a for o in state_at if a < o < e]
        y, state, at = _scan(
            x[:, a:e], dt[:, a:e], A, B[:, a:e], C[:, a:e], chunk_size, state, local
        )
        ys.append(y)
        found.update((o + a, at[:, k]) for k, o in enumerate(local))
        found[e] = state
    states = [found[o] for o in state_at]
    y_all = torch.cat(ys, dim=1)  # (batch, seqlen, n_heads, head_dim)
    if not states:
        return y_all, state, x.new_empty(b, 0, h, p, B.shape[3])
    return y_all, state, torch.stack(states, dim=1)


SCAN_PIECE_CHUNKS = 8
"""Chunks per piece of `ssd_chunked_states`: the within-chunk tensors of one piece (its decay
and score matrices, chunks x Q x Q per head) stay small enough for the CPU's caches (measured
with `benchmarks/ssd_scan_paths.py`; figures in docs/admission.md)."""


def _scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None,
    state_at: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`ssd_chunked_states` over one piece."""
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = h // g
    q = max(1, min(chunk_size, t))
    nc = -(-t // q)
    pad = nc * q - t
    dtype = x.dtype
    if initial_state is None:
        initial_state = x.new_zeros(b, h, p, n)

    if pad:
        # Padded steps have dt = 0: no decay (exp(0) = 1) and no input, so states are unchanged.
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad))
        dt = torch.nn.functional.pad(dt, (0, 0, 0, pad))
        B = torch.nn.functional.pad(B, (0, 0, 0, 0, 0, pad))
        C = torch.nn.functional.pad(C, (0, 0, 0, 0, 0, pad))

    xc = x.reshape(b, nc, q, g, r, p)  # (batch, chunk, l, group, head_in_group, head_dim)
    dtc = dt.to(dtype).reshape(b, nc, q, g, r)  # (batch, chunk, l, group, head_in_group)
    Bc = B.to(dtype).reshape(b, nc, q, g, n)  # (batch, chunk, s, group, d_state)
    Cc = C.to(dtype).reshape(b, nc, q, g, n)  # (batch, chunk, l, group, d_state)
    a = dtc * A.to(dtype).view(g, r)  # (batch, chunk, l, group, head_in_group) log-decay per step
    a_t = a.permute(0, 1, 3, 4, 2)  # (batch, chunk, group, head_in_group, l)
    a_cum = torch.cumsum(a_t, dim=-1)  # (batch, chunk, group, head_in_group, l)
    decay = segment_decay(a_t)  # (batch, chunk, group, head_in_group, l, s)
    xdt = xc * dtc[..., None]  # (batch, chunk, s, group, head_in_group, head_dim)

    # 1. Within each chunk: y_l += sum_{s <= l} (C_l · B_s) exp(a_{s+1..l}) dt_s x_s.
    cb = torch.einsum("bclgn,bcsgn->bcgls", Cc, Bc)  # (batch, chunk, group, l, s)
    scores = cb[:, :, :, None] * decay  # (batch, chunk, group, head_in_group, l, s)
    y = torch.einsum("bcgrls,bcsgrp->bclgrp", scores, xdt)  # (batch, chunk, l, g, hig, head_dim)

    # 2. What each chunk adds to the state at its end: sum_s exp(a_{s+1..Q-1}) dt_s x_s ⊗ B_s.
    to_end = decay[..., -1, :]  # (batch, chunk, group, head_in_group, s)
    chunk_states = torch.einsum(
        "bcgrs,bcsgn,bcsgrp->bcgrpn", to_end, Bc, xdt
    )  # (batch, chunk, group, head_in_group, head_dim, d_state)

    # 3. Pass the state across chunk boundaries (sequential over chunks, cheap).
    chunk_decay = torch.exp(a_cum[..., -1])  # (batch, chunk, group, head_in_group)
    state = initial_state.to(dtype).reshape(b, g, r, p, n)  # (batch, g, hig, head_dim, d_state)
    starts = []
    for c in range(nc):
        starts.append(state)
        state = chunk_decay[:, c, :, :, None, None] * state + chunk_states[:, c]
    start_states = torch.stack(starts, dim=1)  # (batch, chunk, g, hig, head_dim, d_state)

    # 4. Contribution of the chunk's start state: y_l += exp(a_{0..l}) C_l · h_start.
    y_off = torch.einsum(
        "bclgn,bcgrpn->bclgrp", Cc, start_states
    )  # (batch, chunk, l, group, head_in_group, head_dim)
    y = y + y_off * torch.exp(a_cum).permute(0, 1, 4, 2, 3)[..., None]

    y = y.reshape(b, nc * q, h, p)[:, :t]  # (batch, seqlen, n_heads, head_dim)

    # 5. States inside the sequence: after `o` tokens, o - 1 is row l of chunk c, and
    #    h = exp(a_{0..l}) h_start(c) + sum_{s <= l} exp(a_{s+1..l}) dt_s x_s ⊗ B_s.
    #    Only the chunk's first l + 1 rows enter the sum (the decay is 0 above the diagonal),
    #    so each state is one (r * head_dim, l + 1) @ (l + 1, d_state) product per group
    #    (`row` below is l).
    found = []
    for o in state_at:
        c, row = divmod(o - 1, q)
        m = row + 1
        dec = decay[:, c, :, :, row, :m].permute(0, 3, 1, 2)  # (batch, m, group, head_in_group)
        w = (xdt[:, c, :m] * dec[..., None]).reshape(b, m, g, r * p)  # rows s <= row
        into = torch.matmul(w.permute(0, 2, 3, 1), Bc[:, c, :m].permute(0, 2, 1, 3))
        # into: (batch, group, head_in_group * head_dim, d_state)
        grow = torch.exp(a_cum[:, c, :, :, row])  # (batch, group, head_in_group)
        into = into.view(b, g, r, p, n).addcmul_(
            grow[..., None, None], start_states[:, c]
        )  # (batch, group, head_in_group, head_dim, d_state)
        found.append(into.reshape(b, h, p, n))
    states = torch.stack(found, dim=1) if found else x.new_empty(b, 0, h, p, n)
    return y, state.reshape(b, h, p, n), states


def ssd_update_(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
) -> torch.Tensor:
    """One recurrence step that overwrites `state` (h_{t-1} -> h_t) and returns y_t.

    `state` may be a view into a larger cache, strided along the batch axis (the paged state
    slots of decoding requests): it is read once and written twice, with no gather, scatter
    or state-sized allocation besides the one product that forms y.

    Args:
        state: (batch, n_heads, head_dim, d_state), each batch item contiguous.
        x: (batch, n_heads, head_dim); dt: (batch, n_heads); A: (n_heads,);
        B, C: (batch, n_groups, d_state).

    Returns:
        y: (batch, n_heads, head_dim) = h_t · C_t (without D), in the state's dtype.
    """
    dtype = state.dtype
    bsz, h = dt.shape
    g, n = B.shape[1], B.shape[2]
    p = x.shape[-1]
    r = h // g
    dt = dt.to(dtype)  # (batch, n_heads)
    dA = torch.exp(dt * A.to(dtype))  # (batch, n_heads)
    state.mul_(dA[..., None, None])
    # heads of one group share B and C: view (batch, g, r * head_dim, d_state) instead of
    # repeating them; h_t += (dt x) outer B
    grouped = state.view(bsz, g, r * p, n)
    dtx = (dt[..., None] * x.to(dtype)).view(bsz, g, r * p, 1)  # (batch, g, r*head_dim, 1)
    grouped.addcmul_(dtx, B.to(dtype).view(bsz, g, 1, n))
    Cg = C.to(dtype).view(bsz, g, 1, n)  # (batch, g, 1, d_state)
    if state.is_contiguous():
        # C (1 x N) @ h^T: a row-vector product, ~1.5x a multiply-sum on CPU (the batched
        # matrix-vector product h @ C^T measured 5x slower)
        y = torch.matmul(Cg, grouped.transpose(-1, -2))  # (batch, g, 1, r*head_dim)
    else:  # strided slots: matmul would copy the state first
        y = (grouped * Cg).sum(-1)  # (batch, g, r*head_dim)
    return y.reshape(bsz, h, p)


def ssd_step(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrence step for a batch of sequences, leaving `state` untouched.

    Args:
        state: (batch, n_heads, head_dim, d_state) h_{t-1}.
        x: (batch, n_heads, head_dim); dt: (batch, n_heads); A: (n_heads,);
        B, C: (batch, n_groups, d_state).

    Returns:
        y: (batch, n_heads, head_dim) = h_t · C_t (without D), and the new state h_t.
    """
    new_state = state.clone(memory_format=torch.contiguous_format)
    y = ssd_update_(new_state, x, dt, A, B, C)
    return y, new_state


def ssd_recurrent(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token reference with the same signature and results as `ssd_chunked`."""
    b, t, h, p = x.shape
    n = B.shape[-1]
    state = x.new_zeros(b, h, p, n) if initial_state is None else initial_state.to(x.dtype)
    ys = []
    for i in range(t):
        y, state = ssd_step(state, x[:, i], dt[:, i], A, B[:, i], C[:, i])
        ys.append(y)
    return torch.stack(ys, dim=1), state  # (batch, seqlen, n_heads, head_dim), final state
