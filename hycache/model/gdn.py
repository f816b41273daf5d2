"""The Gated DeltaNet (GDN) token mixer of Qwen3-Next and Qwen3.5, on the paged state cache.

Owns `GatedDeltaNet` (input projections -> causal depthwise conv over q, k, v -> L2-normalised
q, k -> gated delta rule -> per-head gated RMSNorm -> out-proj) and its `HeadGatedRMSNorm`.
Parameter names match the Hugging Face mixers (`in_proj_qkvz` + `in_proj_ba` for Qwen3-Next,
`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` for Qwen3.5; `conv1d`, `dt_bias`,
`A_log`, `norm`, `out_proj`).

A GDN layer's state is one Mamba2-shaped page entry (see `configs/qwen3_next.py`):

    conv  (conv_dim, d_conv - 1)   the last d_conv - 1 inputs of the conv over q, k, v
    ssm   (H, V, K)                the delta-rule state S of every value head

and the mixer follows the Mamba2 mixer's plan (`MambaPlan`) exactly: every request starts from
its `state_src` slot (or zeros); requests with at most `SHORT_QUERY` new tokens (decode, the
k + 1 positions of a speculative verification) step the recurrence token by token and write
the state after each offset `state_writes` asks for (the per-position states a rollback
resumes from); longer ones run the chunked rule, cut at every requested offset, so an
in-forward checkpoint holds the state after exactly that many tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hycache.model.configs.qwen3_next import Qwen3NextConfig
from hycache.model.gated_delta import causal_conv_silu, gdr_chunked, gdr_update_, l2_normalize
from hycache.model.layers import compute_dtype
from hycache.model.mamba2 import MambaPlan
from hycache.model.paged import StateCache

__all__ = ["GatedDeltaNet", "HeadGatedRMSNorm"]


class HeadGatedRMSNorm(nn.Module):
    """y -> (weight * rms_norm(y)) * silu(z) over each head's V values (norm before gate)."""

    def __init__(self, head_dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim))
        self.eps = eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z: (N, H, V) in the model dtype -> (N, H, V) in the model dtype."""
        cdt = compute_dtype(y.dtype)
        normed = F.rms_norm(y.to(cdt), self.weight.shape, None, self.eps).to(y.dtype)
        return ((self.weight * normed).to(cdt) * F.silu(z.to(cdt))).to(y.dtype)


class GatedDeltaNet(nn.Module):
    """GDN mixer on the paged state cache (the layout of `Mamba2Mixer`'s states)."""

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__()
        self.n_heads = config.linear_num_value_heads  # H
        self.n_k_heads = config.linear_num_key_heads
        self.k_dim = config.linear_key_head_dim  # K
        self.v_dim = config.linear_value_head_dim  # V
        self.d_conv = config.mamba_d_conv
        self.chunk_size = config.mamba_chunk_size
        self.key_width = self.n_k_heads * self.k_dim
        self.value_width = self.n_heads * self.v_dim
        self.conv_dim = config.mamba_conv_dim
        self.split = config.gdn_projection == "split"
        hidden = config.hidden_size
        if self.split:
            self.in_proj_qkv = nn.Linear(hidden, self.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(hidden, self.value_width, bias=False)
            self.in_proj_b = nn.Linear(hidden, self.n_heads, bias=False)
            self.in_proj_a = nn.Linear(hidden, self.n_heads, bias=False)
        else:
            self.in_proj_qkvz = nn.Linear(hidden, self.conv_dim + self.value_width, bias=False)
            self.in_proj_ba = nn.Linear(hidden, 2 * self.n_heads, bias=False)
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            kernel_size=self.d_conv,
            groups=self.conv_dim,
            bias=False,
            padding=self.d_conv - 1,
        )
        self.dt_bias = nn.Parameter(torch.ones(self.n_heads))
        self.A_log = nn.Parameter(torch.zeros(self.n_heads))
        self.norm = HeadGatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_width, hidden, bias=False)

    # ------------------------------------------------------------------ projections
    def _project(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, hidden) -> (qkv (N, conv_dim), z (N, H, V), b (N, H), a (N, H))."""
        n, h, v = x.shape[0], self.n_heads, self.v_dim
        if self.split:
            qkv = self.in_proj_qkv(x)
            z = self.in_proj_z(x).view(n, h, v)
            return qkv, z, self.in_proj_b(x), self.in_proj_a(x)
        # Qwen3-Next interleaves per key head: [q (K), k (K), v (r V), z (r V)], r = H / Hk,
        # and [b (r), a (r)]; value head h belongs to key head h // r
        hk, k, r = self.n_k_heads, self.k_dim, h // self.n_k_heads
        qkvz = self.in_proj_qkvz(x).view(n, hk, 2 * k + 2 * r * v)
        q, kk, vv, z = qkvz.split([k, k, r * v, r * v], dim=-1)
        b, a = self.in_proj_ba(x).view(n, hk, 2 * r).split([r, r], dim=-1)
        qkv = torch.cat([q.reshape(n, -1), kk.reshape(n, -1), vv.reshape(n, -1)], dim=-1)
        return qkv, z.reshape(n, h, v), b.reshape(n, h), a.reshape(n, h)

    def _qkv(
        self, act: torch.Tensor, cdt: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv output (..., conv_dim) -> q, k (..., H, K) L2-normalised, q scaled by K ** -0.5,
        repeated from the key heads to the value heads; v (..., H, V); all in `cdt`."""
        q, k, v = act.to(cdt).split([self.key_width, self.key_width, self.value_width], dim=-1)
        lead = act.shape[:-1]
        rep = self.n_heads // self.n_k_heads
        q = l2_normalize(q.reshape(*lead, self.n_k_heads, self.k_dim)) * self.k_dim**-0.5
        k = l2_normalize(k.reshape(*lead, self.n_k_heads, self.k_dim))
        if rep > 1:
            q = q.repeat_interleave(rep, dim=-2)
            k = k.repeat_interleave(rep, dim=-2)
        return q, k, v.reshape(*lead, self.n_heads, self.v_dim)

    # ------------------------------------------------------------------ forward
    def forward(
        self, hidden: torch.Tensor, plan: MambaPlan, states: StateCache, layer: int
    ) -> torch.Tensor:
        """hidden: (N, hidden_size) -> (N, hidden_size); reads/writes `states` layer `layer`."""
        if plan.in_place is not None:
            raise ValueError("GatedDeltaNet needs a MambaPlan built with in_place=False")
        n, dtype, cdt = hidden.shape[0], hidden.dtype, states.ssm_dtype
        qkv, z, b, a = self._project(hidden)
        beta = torch.sigmoid(b).to(cdt)  # (N, H)
        g = -torch.exp(self.A_log.to(cdt)) * F.softplus(a.to(cdt) + self.dt_bias.to(cdt))
        o = torch.empty(n, self.n_heads, self.v_dim, dtype=cdt, device=hidden.device)
        if plan.gathered:
            self._run(plan, qkv, g, beta, states.conv[layer], states.ssm[layer], o)
        y = self.norm(o.to(dtype), z)  # (N, H, V)
        return self.out_proj(y.reshape(n, self.value_width))  # (N, hidden_size)

    def _run(
        self,
        plan: MambaPlan,
        qkv: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        conv_cache: torch.Tensor,
        ssm_cache: torch.Tensor,
        o: torch.Tensor,
    ) -> None:
        """Every request of the step: conv + rule from its starting state, the requested state
        writes. qkv: (N, conv_dim); g, beta: (N, H); fills o (N, H, V)."""
        cdt = ssm_cache.dtype
        weight = self.conv1d.weight  # (conv_dim, 1, d_conv)
        # read every starting state before anything is written (copies)
        conv0 = conv_cache.index_select(0, plan.src)  # (G, conv_dim, d_conv - 1)
        ssm0 = ssm_cache.index_select(0, plan.src)  # (G, H, V, K)
        if not plan.all_valid:
            keep = plan.src_valid
            conv0 = torch.where(keep[:, None, None], conv0, torch.zeros_like(conv0))
            ssm0 = torch.where(keep[:, None, None, None], ssm0, torch.zeros_like(ssm0))
        conv0 = conv0.to(qkv.dtype)

        for grp in plan.short:
            rows, ri = grp.rows, grp.idx  # (R_g, q), (R_g,)
            seq = torch.cat([conv0[ri], qkv[rows].transpose(1, 2)], dim=-1)
            # seq: (R_g, conv_dim, d_conv - 1 + q)
            act = causal_conv_silu(seq, weight, None)  # (R_g, q, conv_dim)
            q, k, v = self._qkv(act, cdt)  # (R_g, q, H, K|V)
            state = ssm0[ri]  # (R_g, H, V, K), a copy stepped in place
            for t in range(grp.q):
                rt = rows[:, t]
                o[rt] = gdr_update_(state, q[:, t], k[:, t], v[:, t], g[rt], beta[rt])
                w = grp.writes_at[t]
                if w is not None:
                    conv_w = seq[:, :, t + 1 : t + self.d_conv]  # (R_g, conv_dim, d_conv - 1)
                    conv_cache.index_copy_(0, w.slots, conv_w[w.sel].to(conv_cache.dtype))
                    ssm_cache.index_copy_(0, w.slots, state[w.sel])

        for r, i in plan.prefill:
            s, e = plan.starts[r], plan.starts[r + 1]
            seq = torch.cat([conv0[i], qkv[s:e].t()], dim=-1)  # (conv_dim, d_conv - 1 + q)
            act = causal_conv_silu(seq[None], weight, None)[0]  # (q, conv_dim)
            q, k, v = self._qkv(act, cdt)  # (q, H, K|V)
            state = ssm0[i]  # (H, V, K)
            by_offset: dict[int, list[int]] = {}
            for off, slot in plan.writes[r]:
                by_offset.setdefault(off, []).append(slot)
            prev = 0
            for off in [*sorted(by_offset), e - s]:
                if off == prev:
                    continue
                o[s + prev : s + off], state = gdr_chunked(
                    q[prev:off],
                    k[prev:off],
                    v[prev:off],
                    g[s + prev : s + off],
                    beta[s + prev : s + off],
                    state,
                    self.chunk_size,
                )
                for slot in by_offset.get(off, ()):
                    conv_cache[slot].copy_(seq[:, off : off + self.d_conv - 1])
                    ssm_cache[slot].copy_(state)
                prev = off
