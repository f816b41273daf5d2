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

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hycache.model.configs.base import HybridConfig
from hycache.model.layers import compute_dtype
from hycache.model.paged import StateCache, StepBatch
from hycache.model.ssd import ssd_chunked_states, ssd_update_

__all__ = [
    "SCAN_CHUNK_MAX",
    "SHORT_QUERY",
    "GatedRMSNorm",
    "InPlaceDecode",
    "Mamba2Mixer",
    "MambaPlan",
]


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
        # the RMS over each group, in one fused op
        normed = F.rms_norm(grouped, (self.group_size,), None, self.eps).view(g.shape)
        return self.weight.to(cdt) * normed  # (N, d_inner)


SCAN_CHUNK_MAX = 64
"""Longest chunk of the chunked prefill scan: min(config chunk size, this). Any chunk length
gives the same result up to rounding (see `ssd_chunked`); the within-chunk (Q x Q) work grows
with it, and at 128 it dominated the scan on CPU (64 measured 1.4x faster)."""

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
    idx: torch.Tensor  # (R_g,) positions of the requests among the gathered ones
    rows: torch.Tensor  # (R_g, q) token rows
    writes_at: list[StateWrites | None]  # per token t: the state writes after t + 1 tokens
    whole: bool = False  # the group is every request of the step, rows in order


@dataclass
class InPlaceDecode:
    """Decoding requests (one new token each) whose only write goes to the slot they read, no
    other request of the step touching those slots, the slots forming the progression
    first, first + stride, ... < stop in some request order: their conv and SSM states are
    updated through one strided view of the cache, without a gather or a scatter.

    Attributes:
        reqs: the requests, in slot order.
        rows: (R_d,) their token rows in slot order, or None when that is 0 .. N - 1 (the
            whole step, in order: the layer's activations are used as they are).
    """

    reqs: list[int]
    first: int
    stop: int
    stride: int
    rows: torch.Tensor | None

    @property
    def slots(self) -> slice:
        return slice(self.first, self.stop, self.stride)

    @classmethod
    def build(
        cls, batch: StepBatch, writes: list[list[tuple[int, int]]], device: torch.device
    ) -> InPlaceDecode | None:
        src = batch.state_src
        cand = [
            r
            for r, q in enumerate(batch.query_lens)
            if q == 1 and src[r] >= 0 and writes[r] == [(1, src[r])]
        ]
        if not cand:
            return None
        chosen = set(cand)
        others = {src[r] for r in range(batch.num_requests) if r not in chosen}
        others.update(slot for r, w in enumerate(writes) if r not in chosen for _, slot in w)
        cand = sorted((r for r in cand if src[r] not in others), key=lambda r: src[r])
        slots = [src[r] for r in cand]
        if not slots:
            return None
        stride = slots[1] - slots[0] if len(slots) > 1 else 1
        if stride < 1 or any(b - a != stride for a, b in itertools.pairwise(slots)):
            return None
        starts = batch.query_starts()
        rows = [starts[r] for r in cand]
        whole = len(cand) == batch.num_requests and rows == list(range(batch.num_tokens))
        rows_t = (
            None if whole else torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
        )
        return cls(cand, slots[0], slots[-1] + 1, stride, rows_t)


@dataclass
class MambaPlan:
    """Per-step bookkeeping shared by all Mamba layers.

    Attributes:
        starts: request r's tokens are rows starts[r] .. starts[r + 1] - 1.
        in_place: decoding requests updated in place in the cache, or None.
        gathered: the other requests, whose starting states are gathered (copied) first.
        src: (G,) state slot each gathered request starts from (-1 mapped to 0 and masked by
            src_valid).
        src_valid: (G,) bool, False where the request starts from zeros.
        short: groups of gathered requests with <= SHORT_QUERY new tokens, by query length.
        prefill: (request, position among the gathered) of requests with more new tokens,
            scanned one at a time.
        writes: per request, state writes sorted by offset.
    """

    starts: list[int]
    in_place: InPlaceDecode | None
    gathered: list[int]
    src: torch.Tensor
    src_valid: torch.Tensor
    all_valid: bool
    short: list[ShortGroup]
    prefill: list[tuple[int, int]]
    writes: list[list[tuple[int, int]]]

    @classmethod
    def build(cls, batch: StepBatch, device: torch.device, *, in_place: bool = True) -> MambaPlan:
        """The plan of `batch`; `in_place=False`: every request is gathered (mixers without an
        in-place decode path)."""
        starts = batch.query_starts()
        writes = [sorted(w) for w in batch.state_writes]
        in_place_decode = InPlaceDecode.build(batch, writes, device) if in_place else None
        skip = set(in_place_decode.reqs) if in_place_decode is not None else set()
        gathered = [r for r in range(batch.num_requests) if r not in skip]
        pos = {r: i for i, r in enumerate(gathered)}
        src_list = [batch.state_src[r] for r in gathered]
        # built on the host, moved once: no device syncs while planning
        src = torch.tensor([max(s, 0) for s in src_list], dtype=torch.int64).to(
            device, non_blocking=True
        )
        src_valid = torch.tensor([s >= 0 for s in src_list], dtype=torch.bool).to(
            device, non_blocking=True
        )
        by_q: dict[int, list[int]] = {}
        for r in gathered:
            q = batch.query_lens[r]
            if q <= SHORT_QUERY:
                by_q.setdefault(q, []).append(r)

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
                        torch.tensor(sel, dtype=torch.int64).to(device, non_blocking=True),
                        torch.tensor(slots, dtype=torch.int64).to(device, non_blocking=True),
                        list(sel) == list(range(len(reqs))),
                    )
                )
            return out

        short = [
            ShortGroup(
                q,
                reqs,
                torch.tensor([pos[r] for r in reqs], dtype=torch.int64).to(
                    device, non_blocking=True
                ),
                torch.tensor(
                    [[starts[r] + t for t in range(q)] for r in reqs], dtype=torch.int64
                ).to(device, non_blocking=True),
                writes_at(reqs, q),
            )
            for q, reqs in sorted(by_q.items())
        ]
        if len(short) == 1 and len(short[0].reqs) == batch.num_requests:
            short[0].whole = True
        prefill = [(r, pos[r]) for r in gathered if batch.query_lens[r] > SHORT_QUERY]
        all_valid = all(s >= 0 for s in src_list)
        return cls(
            starts, in_place_decode, gathered, src, src_valid, all_valid, short, prefill, writes
        )


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
        h, p = self.n_heads, self.head_dim
        proj = self.in_proj(hidden)  # (N, d_inner + conv_dim + n_heads)
        z, xbc, dt_raw = proj.split([self.d_inner, self.conv_dim, h], dim=-1)
        # z: (N, d_inner), xbc: (N, conv_dim), dt_raw: (N, n_heads)

        A = -torch.exp(self.A_log.to(cdt))  # (n_heads,)
        dt = F.softplus(dt_raw.to(cdt) + self.dt_bias.to(cdt))  # (N, n_heads)
        if self.time_step_limit != (0.0, math.inf):  # softplus is already >= 0
            dt = dt.clamp(self.time_step_limit[0], self.time_step_limit[1])

        conv_cache = states.conv[layer]  # (slots, conv_dim, d_conv - 1)
        ssm_cache = states.ssm[layer]  # (slots, n_heads, head_dim, d_state)
        ip = plan.in_place
        if ip is not None and ip.rows is None:  # the whole step decodes in place
            xbc_act, y = self._decode_in_place(ip, xbc, dt, A, conv_cache, ssm_cache)
        else:
            xbc_act = torch.empty_like(xbc)  # (N, conv_dim) conv output after silu
            y = torch.empty(n, h, p, dtype=cdt, device=hidden.device)  # (N, n_heads, head_dim)
            if plan.gathered:
                self._gathered(plan, xbc, dt, A, conv_cache, ssm_cache, xbc_act, y)
            if ip is not None:
                assert ip.rows is not None
                act, y_d = self._decode_in_place(ip, xbc, dt, A, conv_cache, ssm_cache)
                xbc_act[ip.rows] = act
                y[ip.rows] = y_d

        x_all = xbc_act[:, : self.d_inner].view(n, h, p).to(cdt)  # (N, n_heads, head_dim)
        y = torch.addcmul(y, x_all, self.D.to(cdt)[:, None])  # (N, n_heads, head_dim)
        out = self.norm(y.view(n, self.d_inner), z)  # (N, d_inner)
        return self.out_proj(out.to(dtype))  # (N, hidden_size)

    def _decode_in_place(
        self,
        ip: InPlaceDecode,
        xbc: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        conv_cache: torch.Tensor,
        ssm_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token for each of `ip`'s requests, their states updated through strided views
        of the caches. Returns (R_d, conv_dim) conv outputs after silu and (R_d, n_heads,
        head_dim) SSM outputs (without D), in slot order."""
        h, p, g, ds = self.n_heads, self.head_dim, self.n_groups, self.d_state
        conv_s = conv_cache[ip.slots]  # (R_d, conv_dim, d_conv - 1) view
        ssm_s = ssm_cache[ip.slots]  # (R_d, n_heads, head_dim, d_state) view
        xbc_d = xbc if ip.rows is None else xbc[ip.rows]  # (R_d, conv_dim)
        dt_d = dt if ip.rows is None else dt[ip.rows]  # (R_d, n_heads)
        # the depthwise conv over the window ending at the new token, tap by tap (a handful of
        # fused multiply-adds on (R_d, conv_dim) beat building the window and reducing it)
        w = self.conv1d.weight[:, 0].to(xbc.dtype)  # (conv_dim, d_conv)
        last = self.d_conv - 1
        bias = self.conv1d.bias
        out = xbc_d * w[:, last] if bias is None else torch.addcmul(bias, xbc_d, w[:, last])
        for j in range(last):
            out.addcmul_(conv_s[:, :, j], w[:, j])  # (R_d, conv_dim)
        act = F.silu(out)  # (R_d, conv_dim)
        # shift the window by one: as flat rows, (x_0 x_1 x_2)(x_0 ...) moves left by one
        # element, then every row's last element is overwritten with the new input
        if last:
            flat = conv_s.view(conv_s.shape[0], -1)  # (R_d, conv_dim * (d_conv - 1))
            flat[:, :-1].copy_(flat[:, 1:].clone())
            conv_s[:, :, -1].copy_(xbc_d)
        x, B, C = act.split([self.d_inner, g * ds, g * ds], dim=-1)
        y = ssd_update_(
            ssm_s,
            x.reshape(-1, h, p),  # (R_d, n_heads, head_dim)
            dt_d,
            A,
            B.reshape(-1, g, ds),  # (R_d, n_groups, d_state)
            C.reshape(-1, g, ds),  # (R_d, n_groups, d_state)
        )  # (R_d, n_heads, head_dim)
        return act, y

    def _gathered(
        self,
        plan: MambaPlan,
        xbc: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        conv_cache: torch.Tensor,
        ssm_cache: torch.Tensor,
        xbc_act: torch.Tensor,
        y: torch.Tensor,
    ) -> None:
        """The requests whose states are gathered: short groups as batched recurrences,
        prefill chunks as chunked scans. Fills their rows of xbc_act (N, conv_dim) and
        y (N, n_heads, head_dim)."""
        dtype = xbc.dtype
        cdt = ssm_cache.dtype
        h, p, g, ds = self.n_heads, self.head_dim, self.n_groups, self.d_state
        # Read every gathered request's starting state before anything is written (copies).
        keep = plan.src_valid
        conv0 = conv_cache.index_select(0, plan.src)  # (G, conv_dim, d_conv - 1)
        ssm0 = ssm_cache.index_select(0, plan.src)  # (G, n_heads, head_dim, d_state)
        if not plan.all_valid:
            conv0 = torch.where(keep[:, None, None], conv0, torch.zeros_like(conv0))
            ssm0 = torch.where(keep[:, None, None, None], ssm0, torch.zeros_like(ssm0))
        conv0 = conv0.to(dtype)  # (G, conv_dim, d_conv - 1) in the model dtype
        # ssm0: (G, n_heads, head_dim, d_state) in the state dtype, a copy stepped in place

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
                y_t = ssd_update_(
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
                        conv_cache.index_copy_(0, w.slots, conv_w.to(conv_cache.dtype))
                        ssm_cache.index_copy_(0, w.slots, state)
                    else:
                        conv_cache.index_copy_(0, w.slots, conv_w[w.sel].to(conv_cache.dtype))
                        ssm_cache.index_copy_(0, w.slots, state[w.sel])

        for r, i in plan.prefill:
            s, e = plan.starts[r], plan.starts[r + 1]
            seq = torch.cat([conv0[i], xbc[s:e].t()], dim=-1)  # (conv_dim, d_conv - 1 + q)
            act = self._conv_act(seq[None])[0]  # (q, conv_dim)
            xbc_act[s:e] = act
            x, B, C = act.split([self.d_inner, g * ds, g * ds], dim=-1)
            # x: (q, d_inner), B, C: (q, n_groups * d_state)
            x = x.reshape(1, -1, h, p).to(cdt)  # (1, q, n_heads, head_dim)
            B = B.reshape(1, -1, g, ds)  # (1, q, n_groups, d_state)
            C = C.reshape(1, -1, g, ds)  # (1, q, n_groups, d_state)
            dtr = dt[None, s:e]  # (1, q, n_heads)
            state = ssm0[i : i + 1]  # (1, n_heads, head_dim, d_state)
            by_offset: dict[int, list[int]] = {}
            for off, slot in plan.writes[r]:
                by_offset.setdefault(off, []).append(slot)
            # one scan over the whole chunk; the states at internal checkpoints are read out
            # of it (not cut: a cut ended the scan there, a call and a padded chunk apiece)
            inner = [off for off in sorted(by_offset) if 0 < off < e - s]
            # y_r: (1, q, n_heads, head_dim), final: (1, n_heads, head_dim, d_state),
            # at: (1, len(inner), n_heads, head_dim, d_state)
            y_r, final, at = ssd_chunked_states(
                x, dtr, A, B, C, min(self.chunk_size, SCAN_CHUNK_MAX), state, inner
            )
            y[s:e] = y_r[0]
            for off, slots in by_offset.items():
                h_off = state[0] if off == 0 else final[0] if off == e - s else None
                if h_off is None:
                    h_off = at[0, inner.index(off)]
                for slot in slots:
                    conv_cache[slot].copy_(seq[:, off : off + self.d_conv - 1])
                    ssm_cache[slot].copy_(h_off)
