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
        shape = cls._hf_read_shape(d)
        req = required(d)
        rope_theta, partial = parse_rope(d, default_partial=0.5)
        return cls(
            **shape,
            **cls._hf_read_mamba(
                d,
                shape["hidden_size"],
                n_heads=int(req("mamba_n_heads")),
                d_state=int(req("mamba_d_state")),
            ),
            intermediate_size=int(req("intermediate_size")),
            num_hidden_layers=int(req("num_hidden_layers")),
            attn_layer_indices=tuple(int(i) for i in d.get("attn_layer_indices") or ()),
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
