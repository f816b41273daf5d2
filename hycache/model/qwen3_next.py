"""The Gated DeltaNet hybrids: Qwen3-Next and Qwen3.5 (dense and MoE text models).

Owns what these architectures add to the hybrid machinery: the zero-centred RMSNorm (the norm
multiplies by 1 + weight), gated full attention (`q_proj` yields each head's query and an
output gate, per-head q/k RMSNorms, partial RoPE, the output times sigmoid(gate)), the sparse
MoE (softmax router, top-k, experts and one shared expert scaled by sigmoid(shared_expert_gate
(x))), the decoder layer (norm -> GDN or gated attention -> residual, norm -> MLP or MoE ->
residual) and `Qwen3NextForCausalLM` / `Qwen35ForCausalLM` / `Qwen35MoeForCausalLM`, whose
parameter names match the checkpoints (`model.layers.{i}.linear_attn.*`, `.self_attn.*`,
`.mlp.experts.{j}.gate_proj.weight`, ...). A multimodal Qwen3.5 checkpoint loads its text part:
`model.language_model.*` maps onto `model.*`, the vision tower (`model.visual.*`) and the MTP
layer (`mtp.*`) are not loaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hycache.model.configs.qwen3_next import Qwen3NextConfig, Qwen35Config, Qwen35MoeConfig
from hycache.model.gdn import GatedDeltaNet
from hycache.model.hybrid import HybridForCausalLM, HybridStep
from hycache.model.layers import MLP, Attention, compute_dtype
from hycache.model.moe import dispatch_to_experts

__all__ = [
    "GatedAttention",
    "Qwen3NextForCausalLM",
    "Qwen35ForCausalLM",
    "Qwen35MoeForCausalLM",
    "SparseMoE",
    "ZeroCentredRMSNorm",
]


class ZeroCentredRMSNorm(nn.Module):
    """y = (1 + weight) * x / sqrt(mean(x^2) + eps), in float32 (float64 for float64), then
    cast back to the input dtype."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cdt = compute_dtype(x.dtype)
        normed = F.rms_norm(x.to(cdt), self.weight.shape, None, self.eps)
        return (normed * (1.0 + self.weight.to(cdt))).to(x.dtype)


class GatedAttention(Attention):
    """Grouped-query attention whose `q_proj` also yields a per-head output gate, with q/k
    RMSNorms per head before RoPE."""

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.attention_bias,
        )
        heads, hd = config.num_attention_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, 2 * heads * hd, bias=config.attention_bias)
        self.q_norm = ZeroCentredRMSNorm(hd, config.rms_norm_eps)
        self.k_norm = ZeroCentredRMSNorm(hd, config.rms_norm_eps)

    def project(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """As `Attention.project`: q and its gate from one projection, q and k normed."""
        n, h, hd = x.shape[0], self.num_heads, self.head_dim
        q, gate = self.q_proj(x).view(n, h, 2 * hd).chunk(2, dim=-1)  # (N, heads, hd) each
        k = self.k_norm(self.k_proj(x).view(n, self.num_kv_heads, hd))  # (N, kv_heads, hd)
        v = self.v_proj(x).view(n, self.num_kv_heads, hd)  # (N, kv_heads, hd)
        return self.q_norm(q), k, v, gate


class TopKRouter(nn.Module):
    """Softmax over the experts (in float32, float64 for float64), the top k, renormalised to
    sum 1 when `normalise`."""

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.normalise = config.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (N, hidden) -> (weights (N, k) in x's dtype, expert ids (N, k))."""
        logits = F.linear(x, self.weight)  # (N, experts)
        probs = torch.softmax(logits.to(compute_dtype(x.dtype)), dim=-1)
        top, idx = probs.topk(self.top_k, dim=-1)  # (N, k) each
        if self.normalise:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(x.dtype), idx


class SparseMoE(nn.Module):
    """sum_k w_k expert_k(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)."""

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__()
        self.gate = TopKRouter(config)
        self.experts = nn.ModuleList(
            MLP(config.hidden_size, config.moe_intermediate_size, bias=False)
            for _ in range(config.num_experts)
        )
        self.shared_expert = MLP(
            config.hidden_size, config.shared_expert_intermediate_size, bias=False
        )
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, hidden) -> (N, hidden)."""
        weights, idx = self.gate(x)  # (N, k) each
        experts = self.experts

        def expert(e: int, xe: torch.Tensor) -> torch.Tensor:
            return experts[e](xe)

        routed = dispatch_to_experts(x, idx, weights, expert)  # (N, hidden)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return routed + shared


class Qwen3NextDecoderLayer(nn.Module):
    """norm -> (GDN | gated attention) -> residual; norm -> (MLP | sparse MoE) -> residual."""

    def __init__(
        self,
        config: Qwen3NextConfig,
        layer_idx: int,
        *,
        attention: bool | None = None,
        moe: bool | None = None,
    ) -> None:
        """`attention` / `moe`: the mixer and MLP kinds (default: layer `layer_idx`'s in the
        config; the MTP layer sets them)."""
        super().__init__()
        self.linear_attn: GatedDeltaNet | None = None
        self.self_attn: GatedAttention | None = None
        if attention is None:
            attention = config.is_attention_layer(layer_idx)
        if moe is None:
            moe = config.is_moe_layer(layer_idx)
        if attention:
            self.self_attn = GatedAttention(config)
        else:
            self.linear_attn = GatedDeltaNet(config)
        self.mlp: nn.Module
        if moe:
            self.mlp = SparseMoE(config)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size, bias=False)
        self.input_layernorm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, step: HybridStep, i: int) -> torch.Tensor:
        mixer = self.self_attn if self.self_attn is not None else self.linear_attn
        assert mixer is not None
        hidden = hidden + step.mix(i, mixer, self.input_layernorm(hidden))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Qwen3NextForCausalLM(HybridForCausalLM):
    """Qwen3-Next decoder + LM head, run one paged `StepBatch` at a time."""

    config_class = Qwen3NextConfig
    config: Qwen3NextConfig
    checkpoint_renames = ((r"^model\.language_model\.", "model."),)
    checkpoint_ignored = (*HybridForCausalLM.checkpoint_ignored, r"^mtp\.", r"^model\.visual\.")

    def __init__(self, config: Qwen3NextConfig) -> None:
        super().__init__(config)
        self._add_decoder(
            Qwen3NextDecoderLayer, ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)
        )


class Qwen35ForCausalLM(Qwen3NextForCausalLM):
    """Qwen3.5 dense text model (or a multimodal checkpoint's text part)."""

    config_class = Qwen35Config


class Qwen35MoeForCausalLM(Qwen3NextForCausalLM):
    """Qwen3.5 MoE text model (or a multimodal checkpoint's text part)."""

    config_class = Qwen35MoeConfig
