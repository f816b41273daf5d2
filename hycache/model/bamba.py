"""The Bamba hybrid architecture (IBM; `BambaForCausalLM` in transformers), inference only.

Owns the Mamba2 mixer, the decoder layers and the top-level `BambaForCausalLM`, whose forward
runs one `StepBatch` against a `PagedKVCache` (attention layers) and a `StateCache` (Mamba
layers). Parameter names match the Hugging Face checkpoints (`model.layers.{i}.mamba.in_proj
.weight`, ...). Re-exports the config and cache types so callers can import everything from here.

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

Attention layers are grouped-query attention with RoPE applied to the first
`head_dim * partial_rotary_factor` dims of each head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hycache.model.config import BambaConfig
from hycache.model.layers import (
    MLP,
    Attention,
    AttentionPlan,
    RMSNorm,
    compute_dtype,
    rope_cos_sin,
)
from hycache.model.paged import PagedKVCache, StateCache, StepBatch
from hycache.model.ssd import ssd_chunked, ssd_step

__all__ = [
    "BambaConfig",
    "BambaDecoder",
    "BambaDecoderLayer",
    "BambaForCausalLM",
    "BambaModel",
    "GatedRMSNorm",
    "Mamba2Mixer",
    "MambaPlan",
    "PagedKVCache",
    "StateCache",
    "StepBatch",
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

    def __init__(self, config: BambaConfig) -> None:
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


class BambaDecoderLayer(nn.Module):
    """RMSNorm -> (Mamba2 mixer | attention) -> residual -> RMSNorm -> SwiGLU MLP -> residual."""

    def __init__(self, config: BambaConfig, layer_idx: int) -> None:
        super().__init__()
        self.is_attention = config.is_attention_layer(layer_idx)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward = MLP(config.hidden_size, config.intermediate_size, config.mlp_bias)
        if self.is_attention:
            self.self_attn = Attention.for_config(config)
        else:
            self.mamba = Mamba2Mixer(config)


class BambaDecoder(nn.Module):
    """Embedding, decoder layers and final norm (the `model.` prefix of the checkpoint)."""

    def __init__(self, config: BambaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            BambaDecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.final_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class BambaForCausalLM(nn.Module):
    """Bamba decoder + LM head, run one paged `StepBatch` at a time."""

    def __init__(self, config: BambaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = BambaDecoder(config)
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # Position of each layer among the attention layers / among the Mamba layers.
        self.kv_layer_of: dict[int, int] = {i: k for k, i in enumerate(config.attn_layer_indices)}
        self.state_layer_of: dict[int, int] = {
            i: k for k, i in enumerate(config.mamba_layer_indices)
        }

    # ------------------------------------------------------------------ construction
    @classmethod
    def empty(
        cls,
        config: BambaConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> BambaForCausalLM:
        """A model with uninitialised weights (no RNG use); fill it with `load_state_dict`."""
        with torch.device("meta"):
            model = cls(config)
        return model.to_empty(device=device).to(dtype=dtype).eval()

    @classmethod
    def random(
        cls,
        config: BambaConfig,
        seed: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> BambaForCausalLM:
        """A model with random weights; the same seed gives bit-identical weights."""
        model = cls.empty(config, torch.float32, "cpu")
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(_random_init(name, param, config, gen))
        return model.to(device=device, dtype=dtype).eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    @property
    def final_layernorm(self) -> RMSNorm:
        return self.model.final_layernorm

    def make_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """An empty KV cache for this model's attention layers, in its dtype and device."""
        return PagedKVCache.for_model(self.config, num_blocks, block_size, self.dtype, self.device)

    def make_state_cache(self, num_slots: int) -> StateCache:
        """An empty state cache for this model's Mamba layers, in its dtype and device."""
        return StateCache(self.config, num_slots, self.dtype, self.device)

    # ------------------------------------------------------------------ forward
    def _check_caches(self, kv: PagedKVCache | None, states: StateCache | None) -> None:
        cfg = self.config
        if cfg.num_attention_layers:
            if kv is None:
                raise ValueError("this model has attention layers: a PagedKVCache is required")
            if (
                kv.num_layers < cfg.num_attention_layers
                or kv.num_kv_heads != cfg.num_key_value_heads
                or kv.head_dim != cfg.head_dim
            ):
                raise ValueError(
                    f"PagedKVCache shape (layers={kv.num_layers}, kv_heads={kv.num_kv_heads}, "
                    f"head_dim={kv.head_dim}) does not fit the config (layers="
                    f"{cfg.num_attention_layers}, kv_heads={cfg.num_key_value_heads}, "
                    f"head_dim={cfg.head_dim})"
                )
        if cfg.num_mamba_layers:
            if states is None:
                raise ValueError("this model has Mamba layers: a StateCache is required")
            want = (cfg.num_mamba_layers, cfg.mamba_conv_dim, cfg.mamba_d_conv - 1)
            got = (states.conv.shape[0], states.conv.shape[2], states.conv.shape[3])
            want_ssm = (cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_d_state)
            if got != want or tuple(states.ssm.shape[2:]) != want_ssm:
                raise ValueError(
                    f"StateCache shape {tuple(states.conv.shape)}/{tuple(states.ssm.shape)} "
                    "does not fit the config"
                )

    @torch.no_grad()
    def forward(
        self, batch: StepBatch, kv: PagedKVCache | None, states: StateCache | None
    ) -> torch.Tensor:
        """Run one step; returns (N, hidden_size) hidden states after the final norm.

        Attention layers write the new tokens' K/V, then attend causally over positions
        [0, context_len + query_len). Mamba layers start from `state_src` (or zeros) and write
        the conv + SSM state after each offset requested in `state_writes`.
        """
        cfg = self.config
        batch.validate(need_states=cfg.num_mamba_layers > 0)
        self._check_caches(kv, states)
        device = self.device
        hidden = self.model.embed_tokens(batch.input_ids.to(device))  # (N, hidden_size)

        attn_plan = cos = sin = None
        if cfg.num_attention_layers:
            assert kv is not None
            attn_plan = AttentionPlan.build(batch, kv, device)
            cos, sin = rope_cos_sin(
                attn_plan.positions, cfg.rotary_dim, cfg.rope_theta, self.dtype
            )  # (N, rotary_dim) each
        mamba_plan = MambaPlan.build(batch, device) if cfg.num_mamba_layers else None

        for i, layer in enumerate(self.model.layers):
            x = layer.input_layernorm(hidden)  # (N, hidden_size)
            if layer.is_attention:
                assert attn_plan is not None and cos is not None and sin is not None
                assert kv is not None
                x = layer.self_attn(x, cos, sin, attn_plan, kv, self.kv_layer_of[i])
            else:
                assert mamba_plan is not None and states is not None
                x = layer.mamba(x, mamba_plan, states, self.state_layer_of[i])
            hidden = hidden + x
            hidden = hidden + layer.feed_forward(layer.pre_ff_layernorm(hidden))
        return self.model.final_layernorm(hidden)  # (N, hidden_size)

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, hidden_size) final-normed hidden states -> (M, vocab) logits (float32, or
        float64 for float64 models)."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden.to(weight.dtype), weight).to(compute_dtype(weight.dtype))


BambaModel = BambaForCausalLM
"""Alias: the runner's name for the top-level model."""


def _random_init(
    name: str, param: torch.Tensor, config: BambaConfig, gen: torch.Generator
) -> torch.Tensor:
    """Deterministic float32 CPU values for parameter `name` (drawn in named_parameters order)."""
    shape = param.shape
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "A_log":
        return torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=gen))
    if leaf == "D":
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if leaf == "dt_bias":
        # dt log-uniform in [1e-3, 1e-1], stored as softplus^-1(dt) (the Mamba2 init).
        lo, hi = torch.log(torch.tensor(1e-3)), torch.log(torch.tensor(1e-1))
        dt = torch.exp(lo + (hi - lo) * torch.rand(shape, generator=gen))
        return dt + torch.log(-torch.expm1(-dt))
    if "norm" in name:  # RMSNorm / gated norm weights
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if "conv1d" in name:
        std = 0.3 if leaf == "weight" else 0.05
        return std * torch.randn(shape, generator=gen)
    if leaf == "bias":
        return 0.02 * torch.randn(shape, generator=gen)
    return 0.02 * torch.randn(shape, generator=gen)
