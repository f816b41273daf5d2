"""The gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024): chunked and recurrent.

Owns the two forms of the rule the GDN mixer (`gdn.py`) runs on the paged state cache:
`gdr_chunked` (prefill: a chunk-parallel scan from any initial state, over any length, so a
prefill cut at any offset gives the state after exactly that many tokens) and `gdr_update_`
(decode and speculative verification: one token, the state stepped in place). Both compute in
the state dtype (float32, float64 for float64 models); `gdr_reference` is the token-by-token
recurrence written plainly, for tests.

Per value head, with the state S of shape (V, K) (the value-by-key orientation the cache
stores, so that a state page has the Mamba2 shape (heads, head_dim, d_state)):

    S_t = exp(g_t) S_{t-1} + beta_t (v_t - exp(g_t) S_{t-1} k_t) k_t^T
    o_t = S_t q_t

q and k are L2-normalised per head and q is scaled by K ** -0.5 by the caller. Glossary:

    q, k     (T, H, K)  query / key, already repeated from the key heads to the H value heads
    v        (T, H, V)  value
    g        (T, H)     log decay, <= 0 (g = -exp(A_log) * softplus(a + dt_bias))
    beta     (T, H)     write strength in (0, 1) (sigmoid(b))
    S        (H, V, K)  recurrent state

The chunked form (chunk length C, positions i, j inside a chunk, gamma_i = g_1 + ... + g_i):
the delta-rule writes u_i = beta_i (v_i - S'_{i-1} k_i) of a chunk solve one unit lower
triangular system (I + A) U = diag(beta) V - diag(beta exp(gamma)) K S0^T with
A_ij = beta_i exp(gamma_i - gamma_j) k_i . k_j for j < i; then

    O   = diag(exp(gamma)) Q S0^T + (M * Q K^T) U,   M_ij = exp(gamma_i - gamma_j), j <= i
    S_C = exp(gamma_C) S0 + U^T diag(exp(gamma_C - gamma)) K
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["causal_conv_silu", "gdr_chunked", "gdr_reference", "gdr_update_", "l2_normalize"]


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (the FLA / transformers convention)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gdr_update_(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> torch.Tensor:
    """One token of the rule for a batch, updating `state` in place.

    state: (R, H, V, K) in the state dtype; q, k: (R, H, K); v: (R, H, V); g, beta: (R, H).
    Returns o: (R, H, V) in the state dtype.
    """
    cdt = state.dtype
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    state.mul_(torch.exp(g.to(cdt))[..., None, None])
    kv_mem = torch.einsum("rhvk,rhk->rhv", state, k)  # (R, H, V)
    delta = (v - kv_mem) * beta.to(cdt)[..., None]  # (R, H, V)
    state.add_(delta[..., :, None] * k[..., None, :])
    return torch.einsum("rhvk,rhk->rhv", state, q)  # (R, H, V)


def gdr_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-by-token recurrence: q, k (T, H, K), v (T, H, V), g, beta (T, H), state
    (H, V, K) -> (o (T, H, V), final state (H, V, K)); `state` is not modified."""
    s = state.clone()[None]  # (1, H, V, K)
    outs = [
        gdr_update_(s, q[t][None], k[t][None], v[t][None], g[t][None], beta[t][None])[0]
        for t in range(q.shape[0])
    ]
    o = torch.stack(outs) if outs else v.new_zeros(v.shape, dtype=state.dtype)
    return o, s[0]


def gdr_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked rule over one sequence of any length T >= 1 from `state`.

    q, k: (T, H, K); v: (T, H, V); g, beta: (T, H); state: (H, V, K) in the state dtype (not
    modified). Returns (o (T, H, V), final state (H, V, K)), both in the state dtype. The last
    chunk is zero-padded (g = 0, beta = 0 there: padding leaves the state unchanged).
    """
    cdt = state.dtype
    t_len, h, kd = k.shape
    vd = v.shape[-1]
    c = min(chunk_size, t_len)
    pad = (-t_len) % c
    n = (t_len + pad) // c

    def chunks(x: torch.Tensor) -> torch.Tensor:
        """(T, H, ...) -> (H, n, C, ...) in the state dtype, zero-padded."""
        x = x.to(cdt)
        if pad:
            x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
        x = x.movedim(0, 1)  # (H, T + pad, ...)
        return x.reshape(h, n, c, *x.shape[2:])

    qc, kc, vc = chunks(q), chunks(k), chunks(v)  # (H, n, C, K|V)
    gc, bc = chunks(g), chunks(beta)  # (H, n, C)
    gamma = gc.cumsum(-1)  # (H, n, C) cumulative log decay inside each chunk
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()  # j <= i
    # M_ij = exp(gamma_i - gamma_j) on and below the diagonal, 0 above (masked before exp)
    diff = gamma[..., :, None] - gamma[..., None, :]  # (H, n, C, C)
    decay = torch.exp(diff.masked_fill(~lower, float("-inf")))  # (H, n, C, C)
    kk = kc @ kc.transpose(-1, -2)  # (H, n, C, C)
    eye = torch.eye(c, dtype=cdt, device=q.device)
    # I + A: A strictly lower (decay is 0 above the diagonal; its diagonal is replaced by 1)
    system = torch.where(eye.bool(), eye, bc[..., :, None] * kk * decay)  # (H, n, C, C)
    rhs = torch.cat([bc[..., None] * vc, (bc * torch.exp(gamma))[..., None] * kc], dim=-1)
    sol = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    w, kd_ = sol.split([vd, kd], dim=-1)  # (H, n, C, V), (H, n, C, K)
    attn = (qc @ kc.transpose(-1, -2)) * decay  # (H, n, C, C), zero above the diagonal
    q_dec = qc * torch.exp(gamma)[..., None]  # (H, n, C, K)
    tail = torch.exp(gamma[..., -1:] - gamma)[..., None] * kc  # (H, n, C, K)
    chunk_decay = torch.exp(gamma[..., -1])  # (H, n)

    s = state.clone()  # (H, V, K)
    out = torch.empty(h, n, c, vd, dtype=cdt, device=q.device)
    for i in range(n):
        u = w[:, i] - kd_[:, i] @ s.transpose(-1, -2)  # (H, C, V)
        out[:, i] = q_dec[:, i] @ s.transpose(-1, -2) + attn[:, i] @ u
        s = s * chunk_decay[:, i, None, None] + u.transpose(-1, -2) @ tail[:, i]
    o = out.reshape(h, n * c, vd)[:, :t_len].movedim(0, 1)  # (T, H, V)
    return o, s


def causal_conv_silu(
    seq: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """silu(depthwise causal conv): seq (batch, channels, width - 1 + L) whose first width - 1
    columns are the previous inputs (the conv state), weight (channels, 1, width) ->
    (batch, L, channels)."""
    b = None if bias is None else bias.to(seq.dtype)
    out = F.conv1d(seq, weight.to(seq.dtype), b, groups=seq.shape[1])  # (batch, channels, L)
    return F.silu(out).transpose(1, 2)
