"""The Gated DeltaNet hybrids' configs: Qwen3-Next and Qwen3.5 (dense and MoE, text part).

Owns `Qwen3NextConfig` (model_type "qwen3_next"), `Qwen35Config` ("qwen3_5_text", and the text
part of a multimodal "qwen3_5" checkpoint) and `Qwen35MoeConfig` ("qwen3_5_moe_text" /
"qwen3_5_moe"). Layers are `linear_attention` (a GDN mixer) or `full_attention` (gated
attention with q/k norms and partial RoPE), each followed by a SwiGLU MLP or a sparse MoE with
a gated shared expert.

A GDN layer's state has the Mamba2 state's shape, so the GDN geometry is stored in the
`mamba_*` fields every cache size is computed from (`cache/layout.py`, `sim/model_spec.py`),
and nothing outside the model learns which recurrent mixer a layer runs:

    GDN (config.json)          HybridConfig field   role in the state page
    linear_num_value_heads     mamba_n_heads        state heads H
    linear_value_head_dim      mamba_d_head         V, rows of each head's (V, K) state
    linear_key_head_dim        mamba_d_state        K, columns of each head's state
    linear_num_key_heads       mamba_n_groups       q/k heads, each shared by H / n_groups
                                                    value heads (like Mamba2's B/C groups)
    linear_conv_kernel_dim     mamba_d_conv         conv window d_conv - 1
    (derived)                  mamba_conv_dim       q, k, v channels: 2 * Hk * K + H * V
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hycache.model.configs.base import HybridConfig, parse_rope
from hycache.model.configs.fields import required

_LAYER_KINDS = ("linear_attention", "full_attention")
GDN_CHUNK_SIZE = 64  # the chunk length of the chunked gated delta rule (FLA's and transformers')


class _Alias:
    """A read-only attribute that is another field under a second name."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __get__(self, config: object, owner: type | None = None) -> Any:
        return self if config is None else getattr(config, self.field)


@dataclass(frozen=True, kw_only=True)
class Qwen3NextConfig(HybridConfig):
    """Qwen3-Next: GDN + gated full attention, a sparse MoE (softmax top-k of `num_experts`,
    plus one shared expert scaled by a sigmoid gate) on every `decoder_sparse_step`-th layer
    not in `mlp_only_layers`, a SwiGLU MLP of `intermediate_size` elsewhere. RMSNorm weights
    are zero-centred (the norm multiplies by 1 + weight), except the GDN's gated norm."""

    model_type: ClassVar[str] = "qwen3_next"
    architecture: ClassVar[str] = "Qwen3NextForCausalLM"
    recurrent_mixer: ClassVar[str] = "gdn"
    mtp_drafter: ClassVar[bool] = True
    # the GDN input projections: "qkvz" (Qwen3-Next's fused, per-key-head interleaved
    # in_proj_qkvz + in_proj_ba) or "split" (Qwen3.5's in_proj_qkv, _z, _b, _a)
    gdn_projection: ClassVar[str] = "qkvz"

    mamba_expand: int | None = None
    mamba_d_conv: int = 4
    mamba_chunk_size: int = GDN_CHUNK_SIZE
    mamba_conv_bias: bool = False
    rms_norm_eps: float = 1e-6
    partial_rotary_factor: float = 0.25
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    # ------------------------------------------------------------------ GDN names
    # the Gated DeltaNet's names for the recurrent mixer's fields (read-only)
    linear_num_value_heads = _Alias("mamba_n_heads")
    linear_num_key_heads = _Alias("mamba_n_groups")
    linear_key_head_dim = _Alias("mamba_d_state")
    linear_value_head_dim = _Alias("mamba_d_head")

    def is_moe_layer(self, layer: int) -> bool:
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    def validate(self) -> None:
        super().validate()
        need = self._need
        layers = set(self.attn_layer_indices) | set(self.mamba_layer_indices)
        need(
            layers == set(range(self.num_hidden_layers)),
            "attn_layer_indices",
            "every layer must be linear_attention or full_attention",
        )
        need(self.decoder_sparse_step >= 1, "decoder_sparse_step", "must be >= 1")
        if self.num_experts:
            need(
                0 < self.num_experts_per_tok <= self.num_experts,
                "num_experts_per_tok",
                f"must be in [1, num_experts={self.num_experts}], got {self.num_experts_per_tok}",
            )
            self._need_positive_ints("moe_intermediate_size", "shared_expert_intermediate_size")

    # ------------------------------------------------------------------ HF mapping
    @classmethod
    def _text_part(cls, d: Mapping[str, Any]) -> Mapping[str, Any]:
        return d

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> HybridConfig:
        d = cls._text_part(d)
        shape = cls._hf_read_shape(d)
        req = required(d)
        num_layers = int(req("num_hidden_layers"))
        layer_types = d.get("layer_types")
        if layer_types is None:  # transformers' default: every 4th layer full attention
            interval = int(d.get("full_attention_interval", 4))
            layer_types = [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention"
                for i in range(num_layers)
            ]
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ValueError(
                f"config field 'layer_types' must list {num_layers} layers, got {layer_types!r}"
            )
        bad = sorted({str(t) for t in layer_types if t not in _LAYER_KINDS})
        if bad:
            raise ValueError(f"{cls.model_type}: unknown layer types {bad}; known: {_LAYER_KINDS}")
        rope_theta, partial = parse_rope(d, default_partial=0.25)
        attn = tuple(i for i, t in enumerate(layer_types) if t == "full_attention")
        return cls(
            **shape,
            intermediate_size=int(d.get("intermediate_size") or 0) or 1,
            num_hidden_layers=num_layers,
            attn_layer_indices=attn,
            mamba_layers=tuple(i for i in range(num_layers) if i not in attn),
            mamba_n_heads=int(d.get("linear_num_value_heads", 32)),
            mamba_d_head=int(d.get("linear_value_head_dim", 128)),
            mamba_n_groups=int(d.get("linear_num_key_heads", 16)),
            mamba_d_state=int(d.get("linear_key_head_dim", 128)),
            mamba_d_conv=int(d.get("linear_conv_kernel_dim", 4)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            partial_rotary_factor=partial,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
            hidden_act=str(d.get("hidden_act", "silu")),
            attention_bias=bool(d.get("attention_bias", False)),
            **cls._moe_fields(d),
        )

    @classmethod
    def _moe_fields(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        experts = int(d.get("num_experts") or 0)
        if not experts:
            return {}
        return {
            "num_experts": experts,
            "num_experts_per_tok": int(d.get("num_experts_per_tok") or 0),
            "moe_intermediate_size": int(d.get("moe_intermediate_size") or 0),
            "shared_expert_intermediate_size": int(d.get("shared_expert_intermediate_size") or 0),
            "norm_topk_prob": bool(d.get("norm_topk_prob", True)),
            "decoder_sparse_step": int(d.get("decoder_sparse_step") or 1),
            "mlp_only_layers": tuple(int(i) for i in d.get("mlp_only_layers") or ()),
        }

    def to_hf_dict(self) -> dict[str, Any]:
        common = self._hf_common()
        for key in ("mlp_bias", "time_step_limit"):
            common.pop(key)
        out = {
            **common,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": [
                "full_attention" if self.is_attention_layer(i) else "linear_attention"
                for i in range(self.num_hidden_layers)
            ],
            "linear_num_value_heads": self.mamba_n_heads,
            "linear_value_head_dim": self.mamba_d_head,
            "linear_num_key_heads": self.mamba_n_groups,
            "linear_key_head_dim": self.mamba_d_state,
            "linear_conv_kernel_dim": self.mamba_d_conv,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": self.hidden_act,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
        }
        if self.num_experts:
            out.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                shared_expert_intermediate_size=self.shared_expert_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
            )
        return out


@dataclass(frozen=True, kw_only=True)
class Qwen35Config(Qwen3NextConfig):
    """Qwen3.5 dense (text part): Qwen3-Next's layers with split GDN projections and a SwiGLU
    MLP on every layer. A multimodal "qwen3_5" config.json is read through its `text_config`
    (the checkpoint's vision tower is not loaded)."""

    model_type: ClassVar[str] = "qwen3_5_text"
    architecture: ClassVar[str] = "Qwen3_5ForCausalLM"
    gdn_projection: ClassVar[str] = "split"
    multimodal_type: ClassVar[str] = "qwen3_5"

    @classmethod
    def _text_part(cls, d: Mapping[str, Any]) -> Mapping[str, Any]:
        if d.get("model_type") != cls.multimodal_type:
            return d
        text = d.get("text_config")
        if not isinstance(text, Mapping):
            raise ValueError(f"{cls.multimodal_type}: config field 'text_config' must be a dict")
        out = {**text, "model_type": cls.model_type}
        if "tie_word_embeddings" in d:  # the head belongs to the multimodal model
            out["tie_word_embeddings"] = d["tie_word_embeddings"]
        return out

    @classmethod
    def _moe_fields(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        return {}


@dataclass(frozen=True, kw_only=True)
class Qwen35MoeConfig(Qwen35Config):
    """Qwen3.5 MoE (text part): every layer's MLP is the sparse MoE with a gated shared
    expert; the top-k weights are always normalised."""

    model_type: ClassVar[str] = "qwen3_5_moe_text"
    architecture: ClassVar[str] = "Qwen3_5MoeForCausalLM"
    multimodal_type: ClassVar[str] = "qwen3_5_moe"

    @classmethod
    def _moe_fields(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "num_experts": int(d.get("num_experts") or 0),
            "num_experts_per_tok": int(d.get("num_experts_per_tok") or 0),
            "moe_intermediate_size": int(d.get("moe_intermediate_size") or 0),
            "shared_expert_intermediate_size": int(d.get("shared_expert_intermediate_size") or 0),
        }

    def to_hf_dict(self) -> dict[str, Any]:
        out = super().to_hf_dict()
        for key in ("norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"):
            out.pop(key, None)
        return out
