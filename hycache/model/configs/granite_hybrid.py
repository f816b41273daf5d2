"""Granite 4.0 hybrid's config (IBM; `GraniteMoeHybridForCausalLM`): `GraniteHybridConfig`.

Layer kinds from `layer_types`, the shared MLP and optional experts, the embedding, residual,
attention and logit multipliers, and RoPE only with `position_embedding_type: "rope"`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hycache.model.configs.base import (
    HybridConfig,
    parse_rope,
)
from hycache.model.configs.fields import parse_pair, required

_GRANITE_LAYERS = {
    "mamba": "mamba",
    "linear_attention": "mamba",
    "attention": "attention",
    "full_attention": "attention",
}


@dataclass(frozen=True, kw_only=True)
class GraniteHybridConfig(HybridConfig):
    """Granite 4.0 hybrid (IBM): every layer is a mixer followed by a SwiGLU shared MLP, plus a
    top-k MoE beside it when `num_local_experts` > 0; embedding, residual, attention and logit
    multipliers; RoPE or no positional encoding."""

    model_type: ClassVar[str] = "granitemoehybrid"
    architecture: ClassVar[str] = "GraniteMoeHybridForCausalLM"

    use_rope: bool = False
    rms_norm_eps: float = 1e-6
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    expert_intermediate_size: int = 0

    def validate(self) -> None:
        super().validate()
        need = self._need
        need(self.logits_scaling != 0, "logits_scaling", "must be non-zero")
        if self.num_local_experts:
            need(
                0 < self.num_experts_per_tok <= self.num_local_experts,
                "num_experts_per_tok",
                f"must be in [1, num_local_experts={self.num_local_experts}], got "
                f"{self.num_experts_per_tok}",
            )
            need(
                self.expert_intermediate_size > 0,
                "expert_intermediate_size",
                "must be positive when there are experts",
            )

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> GraniteHybridConfig:
        shape = cls._hf_read_shape(d)
        req = required(d)
        num_layers = int(req("num_hidden_layers"))
        layer_types = d.get("layer_types") or d.get("layers_block_type") or ["mamba"] * num_layers
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ValueError(
                f"config field 'layer_types' must list {num_layers} layers, got {layer_types!r}"
            )
        bad = sorted({str(t) for t in layer_types if t not in _GRANITE_LAYERS})
        if bad:
            raise ValueError(
                f"granitemoehybrid: unknown layer types {bad}; known: {sorted(_GRANITE_LAYERS)}"
            )
        pos = d.get("position_embedding_type")
        if pos not in (None, "nope", "rope"):
            raise ValueError(
                "config field 'position_embedding_type' must be 'rope', 'nope' or null, "
                f"got {pos!r}"
            )
        rope_theta, _ = parse_rope(d, default_partial=1.0)
        experts = int(d.get("num_local_experts") or 0)
        return cls(
            **shape,
            **cls._hf_read_mamba(
                d,
                shape["hidden_size"],
                n_heads=int(d.get("mamba_n_heads", 128)),
                d_state=int(d.get("mamba_d_state", 256)),
            ),
            intermediate_size=int(d.get("shared_intermediate_size", 1024)),
            num_hidden_layers=num_layers,
            attn_layer_indices=tuple(
                i for i, t in enumerate(layer_types) if _GRANITE_LAYERS[t] == "attention"
            ),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            use_rope=pos == "rope",
            rope_theta=rope_theta,
            partial_rotary_factor=1.0,
            # Granite scales attention scores by attention_multiplier, not head_dim ** -0.5.
            attention_scale=float(d.get("attention_multiplier", 1.0)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            time_step_limit=parse_pair(d.get("time_step_limit"), "time_step_limit"),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            hidden_act=str(d.get("hidden_act", "silu")),
            attention_bias=bool(d.get("attention_bias", False)),
            embedding_multiplier=float(d.get("embedding_multiplier", 1.0)),
            residual_multiplier=float(d.get("residual_multiplier", 1.0)),
            logits_scaling=float(d.get("logits_scaling", 1.0)),
            num_local_experts=experts,
            num_experts_per_tok=int(d.get("num_experts_per_tok") or 0) if experts else 0,
            expert_intermediate_size=int(d.get("intermediate_size") or 0) if experts else 0,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        layer_types = [
            "attention" if self.is_attention_layer(i) else "mamba"
            for i in range(self.num_hidden_layers)
        ]
        return {
            **self._hf_common(),
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": layer_types,
            "shared_intermediate_size": self.intermediate_size,
            "intermediate_size": self.expert_intermediate_size,
            "num_local_experts": self.num_local_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            **self._hf_mamba(),
            "position_embedding_type": "rope" if self.use_rope else None,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "attention_multiplier": self.attention_scale,
            "embedding_multiplier": self.embedding_multiplier,
            "residual_multiplier": self.residual_multiplier,
            "logits_scaling": self.logits_scaling,
        }
