"""Bamba's config (IBM; `BambaForCausalLM`): `BambaConfig` and its HF `config.json` mapping.

Every Bamba layer is a mixer (Mamba2 at the layers not in `attn_layer_indices`) followed by a
SwiGLU MLP; the fields are the common `HybridConfig`'s, under transformers' Bamba names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hycache.model.configs.base import (
    HybridConfig,
    attention_shape,
    mamba_head_dim,
    parse_rope,
)
from hycache.model.configs.fields import parse_pair, required


@dataclass(frozen=True, kw_only=True)
class BambaConfig(HybridConfig):
    """Bamba (IBM): every layer is a mixer (Mamba2 or attention) followed by a SwiGLU MLP."""

    model_type: ClassVar[str] = "bamba"
    architecture: ClassVar[str] = "BambaForCausalLM"

    # Bamba hard-codes a partial rotary factor of 0.5 when a config does not name one.
    partial_rotary_factor: float = 0.5

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> BambaConfig:
        cls._check_model_type(d)
        req = required(d)
        hidden_size = int(req("hidden_size"))
        num_heads, kv_heads, head_dim = attention_shape(d, hidden_size)
        mamba_expand = int(d.get("mamba_expand", 2))
        mamba_n_heads = int(req("mamba_n_heads"))
        rope_theta, partial = parse_rope(d, default_partial=0.5)
        return cls(
            vocab_size=int(req("vocab_size")),
            hidden_size=hidden_size,
            intermediate_size=int(req("intermediate_size")),
            num_hidden_layers=int(req("num_hidden_layers")),
            num_attention_heads=num_heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            attn_layer_indices=tuple(int(i) for i in d.get("attn_layer_indices") or ()),
            mamba_n_heads=mamba_n_heads,
            mamba_d_head=mamba_head_dim(d, hidden_size, mamba_n_heads, mamba_expand),
            mamba_n_groups=int(d.get("mamba_n_groups", 1)),
            mamba_d_state=int(req("mamba_d_state")),
            mamba_d_conv=int(d.get("mamba_d_conv", 4)),
            mamba_expand=mamba_expand,
            mamba_chunk_size=int(d.get("mamba_chunk_size", 256)),
            mamba_conv_bias=bool(d.get("mamba_conv_bias", True)),
            mamba_proj_bias=bool(d.get("mamba_proj_bias", False)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            rope_theta=rope_theta,
            partial_rotary_factor=partial,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            time_step_limit=parse_pair(d.get("time_step_limit"), "time_step_limit"),
            max_position_embeddings=int(d.get("max_position_embeddings", 262144)),
            hidden_act=str(d.get("hidden_act", "silu")),
            attention_bias=bool(d.get("attention_bias", False)),
            mlp_bias=bool(d.get("mlp_bias", False)),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        return {
            **self._hf_common(),
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "attn_layer_indices": list(self.attn_layer_indices),
            **self._hf_mamba(),
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
        }
