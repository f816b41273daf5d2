"""The Mamba2 token mixer shared by every hybrid architecture, on the paged state cache.

Owns `Mamba2Mixer` (in-proj -> causal depthwise conv -> SSD scan -> gated RMSNorm -> out-proj),
its `GatedRMSNorm` (the gate applied before a per-group RMS norm over `n_groups` groups, as in
Bamba, Nemotron-H and Granite 4.0 alike) and `MambaPlan`, the per-step bookkeeping shared by all
Mamba layers of a forward (which requests are stepped as batched recurrences, which are scanned
in chunks, where states are read and written). Parameter names match the Hugging Face mixers
(`in_proj`, `conv1d`, `dt_bias`, `A_log`, `D`, `norm`, `out_proj`).

Glossary (code name -> symbol in the Mamba2 / SSD paper, Dao & Gu 2024):

    x (mixer)          X    SSM input, (tokens, n_heads, head_dim); head_dim is P
    gate / z           z    gate of the output RMSNorm, silu(z) multiplies y before the norm
    dt                 Δ    per-head step size, softplus(dt_raw + dt_bias), clamped to
                            time_step_limit
    A_log              log(-A); A = -exp(A_log) < 0 is the per-head scalar decay rate
    a = dt * A              log of the per-step decay exp(Δ A) (the "A-bar" of the discretisation)
    B, C               B, C input / output projections of the state, (tokens, n_groups, d_state);
                            heads are split into n_groups groups that share B and C
    D                  D    per-head skip connection, y += D * x
    d_state            N    state size; n_heads is H; head_dim is P; chunk_size is Q
    ssm state / h      h    (n_heads, head_dim, d_state) hidden state, float32 (float64 models)
    conv state              last d_conv - 1 inputs of the depthwise causal conv over (x, B, C)
    segment_sum             the L matrix of the SSD "attention" form (decay between positions)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hycache.model.config import HybridConfig
from hycache.model.layers import compute_dtype
from hycache.model.paged import StateCache, StepBatch
from hycache.model.ssd import ssd_chunked, ssd_step

__all__ = ["SHORT_QUERY", "GatedRMSNorm", "Mamba2Mixer", "MambaPlan"]


class GatedRMSNorm(nn.Module):
    """y -> weight * norm(y * silu(z)), the RMS taken separately over each of n_groups groups."""

    def __init__(self, hidden_size: int, n_groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.group_size = hidden_size // n_groups
        self.eps = eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y: (N, d_inner) in the compute dtype, z: (N, d_inner) -> (N, d_inner) compute dtype."""
        cdt = compute_dtype(y.dtype)
        g = y.to(cdt) * F.silu(z.to(cdt))  # (N, d_inner)
        grouped = g.view(*g.shape[:-1], -1, self.group_size)  # (N, n_groups, group_size)
        var = grouped.pow(2).mean(-1, keepdim=True)  # (N, n_groups, 1)
        normed = (grouped * torch.rsqrt(var + self.eps)).view(g.shape)  # (N, d_inner)
        return self.weight.to(cdt) * normed


SHORT_QUERY = 8
"""Requests with at most this many new tokens (decode, verify) run as batched recurrences."""


@dataclass
class StateWrites:
    """State writes of a short group after one token: group positions -> slots."""

    sel: torch.Tensor  # (W,) positions in the group
    slots: torch.Tensor  # (W,) state slots
    in_order: bool  # sel is exactly 0 .. R_g - 1: write the whole group without a gather


@dataclass
class ShortGroup:
    """Requests with the same short query length `q`, stepped together token by token."""

    q: int
    reqs: list[int]
    idx: torch.Tensor  # (R_g,) request indices
    rows: torch.Tensor  # (R_g, q) token rows
    writes_at: list[StateWrites | None]  # per token t: the state writes after t + 1 tokens
    whole: bool = False  # the group is every request of the step, rows in order


@dataclass
class MambaPlan:
    """Per-step bookkeeping shared by all Mamba layers.

    Attributes:
        starts: request r's tokens are rows starts[r] .. starts[r + 1] - 1.
        src: (R,) state slot each request starts from (-1 mapped to 0 and masked by src_valid).
        src_valid: (R,) bool, False where the request starts from zeros.
        short: groups of requests with <= SHORT_QUERY new tokens, by query length.
        prefill_reqs: requests with more new tokens, scanned one at a time.
        writes: per request, state writes sorted by offset.
    """

    starts: list[int]
    src: torch.Tensor
    src_valid: torch.Tensor
    all_valid: bool
    short: list[ShortGroup]
    prefill_reqs: list[int]
    writes: list[list[tuple[int, int]]]

    @classmethod
    def build(cls, batch: StepBatch, device: torch.device) -> MambaPlan:
        starts = batch.query_starts()
        src_list = batch.state_src
        src = torch.tensor([max(s, 0) for s in src_list], dtype=torch.int64, device=device)
        src_valid = torch.tensor([s >= 0 for s in src_list], dtype=torch.bool, device=device)
        by_q: dict[int, list[int]] = {}
        for r, q in enumerate(batch.query_lens):
            if q <= SHORT_QUERY:
                by_q.setdefault(q, []).append(r)
        writes = [sorted(w) for w in batch.state_writes]

        def writes_at(reqs: list[int], q: int) -> list[StateWrites | None]:
            out: list[StateWrites | None] = []
            for t in range(q):
                pairs = [
                    (k, slot) for k, r in enumerate(reqs) for off, slot in writes[r] if off == t + 1
                ]
                if not pairs:
                    out.append(None)
                    continue
                sel, slots = zip(*pairs, strict=True)
                out.append(
                    StateWrites(
                        torch.tensor(sel, dtype=torch.int64, device=device),
                        torch.tensor(slots, dtype=torch.int64, device=device),
                        list(sel) == list(range(len(reqs))),
                    )
                )
            return out

        short = [
            ShortGroup(
                q,
                reqs,
                torch.tensor(reqs, dtype=torch.int64, device=device),
                torch.tensor(
                    [[starts[r] + t for t in range(q)] for r in reqs],
                    dtype=torch.int64,
                    device=device,
                ),
                writes_at(reqs, q),
            )
            for q, reqs in sorted(by_q.items())
        ]
        if len(short) == 1 and len(short[0].reqs) == batch.num_requests:
            short[0].whole = True
        prefill_reqs = [r for r, q in enumerate(batch.query_lens) if q > SHORT_QUERY]
        all_valid = all(s >= 0 for s in src_list)
        return cls(starts, src, src_valid, all_valid, short, prefill_reqs, writes)


class Mamba2Mixer(nn.Module):
    """Mamba2 token mixer: in-proj -> causal conv -> SSD scan -> gated RMSNorm -> out-proj."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.n_heads = config.mamba_n_heads
        self.head_dim = config.mamba_d_head
        self.n_groups = config.mamba_n_groups
        self.d_state = config.mamba_d_state
        self.d_conv = config.mamba_d_conv
        self.d_inner = config.mamba_intermediate_size
        self.conv_dim = config.mamba_conv_dim
        self.chunk_size = config.mamba_chunk_size
        self.time_step_limit = config.time_step_limit
        self.in_proj = nn.Linear(
            config.hidden_size, config.mamba_in_proj_size, bias=config.mamba_proj_bias
        )
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            kernel_size=self.d_conv,
            groups=self.conv_dim,
            bias=config.mamba_conv_bias,
            padding=self.d_conv - 1,
        )
        self.dt_bias = nn.Parameter(torch.ones(self.n_heads))
        self.A_log = nn.Parameter(torch.zeros(self.n_heads))
        self.D = nn.Parameter(torch.ones(self.n_heads))
        self.norm = GatedRMSNorm(self.d_inner, self.n_groups, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.d_inner, config.hidden_size, bias=config.mamba_proj_bias)

    def _conv_act(self, seq: torch.Tensor) -> torch.Tensor:
        """silu(depthwise causal conv) over seq (batch, conv_dim, d_conv - 1 + L) -> (batch, L,
        conv_dim), where the first d_conv - 1 columns are the previous inputs (conv state)."""
        out = F.conv1d(seq, self.conv1d.weight, self.conv1d.bias, groups=self.conv_dim)
        return F.silu(out).transpose(1, 2)  # (batch, L, conv_dim)

    def _conv_act_short(self, seq: torch.Tensor) -> torch.Tensor:
        """Like `_conv_act` for a few tokens: a windowed multiply-add beats conv1d's setup.
        seq: (batch, conv_dim, d_conv - 1 + L) -> (batch, L, conv_dim)."""
        windows = seq.unfold(2, self.d_conv, 1)  # (batch, conv_dim, L, d_conv)
        w = self.conv1d.weight[:, 0]  # (conv_dim, d_conv)
        out = (windows * w[None, :, None, :].to(seq.dtype)).sum(-1)  # (batch, conv_dim, L)
        if self.conv1d.bias is not None:
            out = out + self.conv1d.bias.to(seq.dtype)[None, :, None]
        return F.silu(out).transpose(1, 2)  # (batch, L, conv_dim)

    def forward(
        self, hidden: torch.Tensor, plan: MambaPlan, states: StateCache, layer: int
    ) -> torch.Tensor:
        """hidden: (N, hidden_size) -> (N, hidden_size); reads/writes `states` layer `layer`."""
        n = hidden.shape[0]
        dtype = hidden.dtype
        cdt = states.ssm_dtype
        h, p, g, ds = self.n_heads, self.head_dim, self.n_groups, self.d_state
        proj = self.in_proj(hidden)  # (N, d_inner + conv_dim + n_heads)
        z, xbc, dt_raw = proj.split([self.d_inner, self.conv_dim, h], dim=-1)
        # z: (N, d_inner), xbc: (N, conv_dim), dt_raw: (N, n_heads)

        A = -torch.exp(self.A_log.to(cdt))  # (n_heads,)
        dt = F.softplus(dt_raw.to(cdt) + self.dt_bias.to(cdt))  # (N, n_heads)
        dt = dt.clamp(self.time_step_limit[0], self.time_step_limit[1])

        conv_cache = states.conv[layer]  # (slots, conv_dim, d_conv - 1)
        ssm_cache = states.ssm[layer]  # (slots, n_heads, head_dim, d_state)
        # Read every request's starting state before anything is written (copies).
        keep = plan.src_valid
        conv0 = conv_cache.index_select(0, plan.src)  # (R, conv_dim, d_conv - 1)
        ssm0 = ssm_cache.index_select(0, plan.src)  # (R, n_heads, head_dim, d_state)
        if not plan.all_valid:
            conv0 = torch.where(keep[:, None, None], conv0, torch.zeros_like(conv0))
            ssm0 = torch.where(keep[:, None, None, None], ssm0, torch.zeros_like(ssm0))
        conv0 = conv0.to(dtype)  # (R, conv_dim, d_conv - 1) in the model dtype
        # ssm0: (R, n_heads, head_dim, d_state) in the state dtype

        xbc_act = torch.empty_like(xbc)  # (N, conv_dim) conv output after silu
        y = torch.empty(n, h, p, dtype=cdt, device=hidden.device)  # (N, n_heads, head_dim)

        for grp in plan.short:
            rows, ri = grp.rows, grp.idx  # (R_g, q), (R_g,)
            nq = rows.numel()
            if grp.whole:  # every request of the step, in order: views instead of gathers
                xbc_g = xbc.view(-1, grp.q, self.conv_dim)  # (R_g, q, conv_dim)
                conv_g, state = conv0, ssm0
            else:
                xbc_g, conv_g, state = xbc[rows], conv0[ri], ssm0[ri]
            seq = torch.cat([conv_g, xbc_g.transpose(1, 2)], dim=-1)
            # seq: (R_g, conv_dim, d_conv - 1 + q); state: (R_g, n_heads, head_dim, d_state)
            act = self._conv_act_short(seq)  # (R_g, q, conv_dim)
            if grp.whole:
                xbc_act.copy_(act.reshape(nq, self.conv_dim))
            else:
                xbc_act[rows.reshape(-1)] = act.reshape(nq, self.conv_dim)
            x, B, C = act.split([self.d_inner, g * ds, g * ds], dim=-1)
            # x: (R_g, q, d_inner), B, C: (R_g, q, n_groups * d_state)
            dt_g = dt.view(-1, grp.q, h) if grp.whole else dt[rows]  # (R_g, q, n_heads)
            y_g = y.view(-1, grp.q, h, p) if grp.whole else None  # (R_g, q, n_heads, head_dim)
            for t in range(grp.q):
                y_t, state = ssd_step(
                    state,
                    x[:, t].reshape(-1, h, p),  # (R_g, n_heads, head_dim)
                    dt_g[:, t],  # (R_g, n_heads)
                    A,
                    B[:, t].reshape(-1, g, ds),  # (R_g, n_groups, d_state)
                    C[:, t].reshape(-1, g, ds),  # (R_g, n_groups, d_state)
                )
                if y_g is not None:
                    y_g[:, t] = y_t
                else:
                    y[rows[:, t]] = y_t
                w = grp.writes_at[t]
                if w is not None:
                    conv_w = seq[:, :, t + 1 : t + self.d_conv]  # (R_g, conv_dim, d_conv - 1)
                    if w.in_order:
                        conv_cache.index_copy_(0, w.slots, conv_w)
                        ssm_cache.index_copy_(0, w.slots, state)
                    else:
                        conv_cache.index_copy_(0, w.slots, conv_w[w.sel])
                        ssm_cache.index_copy_(0, w.slots, state[w.sel])

        for r in plan.prefill_reqs:
            s, e = plan.starts[r], plan.starts[r + 1]
            seq = torch.cat([conv0[r], xbc[s:e].t()], dim=-1)  # (conv_dim, d_conv - 1 + q)
            act = self._conv_act(seq[None])[0]  # (q, conv_dim)
            xbc_act[s:e] = act
            x, B, C = act.split([self.d_inner, g * ds, g * ds], dim=-1)
            # x: (q, d_inner), B, C: (q, n_groups * d_state)
            x = x.reshape(1, -1, h, p).to(cdt)  # (1, q, n_heads, head_dim)
            B = B.reshape(1, -1, g, ds)  # (1, q, n_groups, d_state)
            C = C.reshape(1, -1, g, ds)  # (1, q, n_groups, d_state)
            dtr = dt[None, s:e]  # (1, q, n_heads)
            state = ssm0[r : r + 1]  # (1, n_heads, head_dim, d_state)
            by_offset: dict[int, list[int]] = {}
            for off, slot in plan.writes[r]:
                by_offset.setdefault(off, []).append(slot)
            prev = 0
            for off in [*sorted(by_offset), e - s]:
                if off == prev:
                    continue
                # y_seg: (1, seg_len, n_heads, head_dim), state: (1, n_heads, head_dim, d_state)
                y_seg, state = ssd_chunked(
                    x[:, prev:off],
                    dtr[:, prev:off],
                    A,
                    B[:, prev:off],
                    C[:, prev:off],
                    self.chunk_size,
                    state,
                )
                y[s + prev : s + off] = y_seg[0]
                for slot in by_offset.get(off, ()):
                    conv_cache[slot].copy_(seq[:, off : off + self.d_conv - 1])
                    ssm_cache[slot].copy_(state[0])
                prev = off

        x_all = xbc_act[:, : self.d_inner].view(n, h, p).to(cdt)  # (N, n_heads, head_dim)
        y = y + x_all * self.D.to(cdt)[:, None]  # (N, n_heads, head_dim)
        out = self.norm(y.view(n, self.d_inner), z)  # (N, d_inner)
        return self.out_proj(out.to(dtype))  # (N, hidden_size)
