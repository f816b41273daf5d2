"""The Granite 4.0 hybrid architecture (IBM; `GraniteMoeHybridForCausalLM` in transformers).

Owns what is Granite's own: the decoder layer (RMSNorm -> Mamba2 or attention mixer, scaled
by `residual_multiplier`, -> residual -> RMSNorm -> SwiGLU shared MLP plus, when the config
has experts, a top-k softmax-routed MoE of SwiGLU experts -> scaled residual); the embedding
multiplier and the logit divisor (`logits_scaling`); the `model.`-prefixed module tree whose
parameter names match IBM's checkpoints (`block_sparse_moe.input_linear.weight` (experts,
2 * width, hidden), `block_sparse_moe.output_linear.weight`, `block_sparse_moe.router.layer
.weight`, `shared_mlp.input_linear.weight`, ...); and `GraniteHybridForCausalLM`. Checkpoints
written with transformers' in-memory expert names (`experts.gate_up_proj`, ...) load too.
Attention scores are scaled by `attention_multiplier`; RoPE only with
`position_embedding_type: "rope"`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hycache.model.configs.granite_hybrid import GraniteHybridConfig
from hycache.model.hybrid import HybridForCausalLM, HybridStep, MambaOrAttentionLayer
from hycache.model.layers import RMSNorm, compute_dtype
from hycache.model.moe import dispatch_to_experts

__all__ = [
    "GraniteDecoderLayer",
    "GraniteHybridForCausalLM",
    "GraniteMoE",
    "GraniteSharedMLP",
]


class GraniteSharedMLP(nn.Module):
    """SwiGLU with a fused gate|up projection: output(silu(gate) * up)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.input_linear = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.output_linear = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.input_linear(x).chunk(2, dim=-1)
        return self.output_linear(F.silu(gate) * up)


class _ExpertWeights(nn.Module):
    """One stacked weight for every expert: `weight` (num_experts, out_features, in_features)."""

    def __init__(self, num_experts: int, out_features: int, in_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features))


class _Router(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.layer = nn.Linear(hidden_size, num_experts, bias=False)


class GraniteMoE(nn.Module):
    """Top-k MoE: softmax over the k largest router logits weights k SwiGLU experts."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.input_linear = _ExpertWeights(num_experts, 2 * intermediate_size, hidden_size)
        self.output_linear = _ExpertWeights(num_experts, hidden_size, intermediate_size)
        self.router = _Router(hidden_size, num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (N, hidden) -> (N, hidden)."""
        logits = self.router.layer(x).to(compute_dtype(x.dtype))  # (N, experts)
        top_logits, top_idx = logits.topk(self.top_k, dim=-1)  # (N, k) each
        weights = torch.softmax(top_logits, dim=-1).to(x.dtype)  # (N, k)
        w_in, w_out = self.input_linear.weight, self.output_linear.weight

        def swiglu(e: int, xe: torch.Tensor) -> torch.Tensor:
            gate, up = F.linear(xe, w_in[e]).chunk(2, dim=-1)  # (n_e, width) each
            return F.linear(F.silu(gate) * up, w_out[e])  # (n_e, hidden)

        return dispatch_to_experts(x, top_idx, weights, swiglu)


class GraniteDecoderLayer(MambaOrAttentionLayer):
    """RMSNorm -> mixer -> scaled residual -> RMSNorm -> (MoE +) shared MLP -> scaled residual."""

    def __init__(self, config: GraniteHybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.residual_multiplier = config.residual_multiplier
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.block_sparse_moe: GraniteMoE | None = None
        if config.num_local_experts:
            self.block_sparse_moe = GraniteMoE(
                config.hidden_size,
                config.expert_intermediate_size,
                config.num_local_experts,
                config.num_experts_per_tok,
            )
        self.shared_mlp = GraniteSharedMLP(config.hidden_size, config.intermediate_size)
        self._add_mixer(config, layer_idx)

    def forward(self, hidden: torch.Tensor, step: HybridStep, i: int) -> torch.Tensor:
        mixed = self._mix(step, i, self.input_layernorm(hidden))  # (N, hidden_size)
        hidden = hidden + mixed * self.residual_multiplier
        x = self.post_attention_layernorm(hidden)
        ff = self.shared_mlp(x)
        if self.block_sparse_moe is not None:
            ff = self.block_sparse_moe(x) + ff
        return hidden + ff * self.residual_multiplier


class GraniteHybridForCausalLM(HybridForCausalLM):
    """Granite 4.0 hybrid decoder + LM head, run one paged `StepBatch` at a time."""

    config_class = GraniteHybridConfig
    config: GraniteHybridConfig
    checkpoint_renames = (
        (r"block_sparse_moe\.experts\.gate_up_proj$", "block_sparse_moe.input_linear.weight"),
        (r"block_sparse_moe\.experts\.down_proj$", "block_sparse_moe.output_linear.weight"),
        (r"block_sparse_moe\.router\.weight$", "block_sparse_moe.router.layer.weight"),
    )

    def __init__(self, config: GraniteHybridConfig) -> None:
        super().__init__(config)
        self.embedding_multiplier = config.embedding_multiplier
        self.logits_divisor = config.logits_scaling
        self._add_decoder(GraniteDecoderLayer, RMSNorm(config.hidden_size, config.rms_norm_eps))
