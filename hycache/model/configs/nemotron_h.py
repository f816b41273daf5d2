"""Nemotron-H's config (NVIDIA; `NemotronHForCausalLM`): `NemotronHConfig` and its HF mapping.

The per-layer block pattern (Mamba2 `M`, attention `*`, MLP `-`, MoE `E`) from any of the
layouts transformers has used (`layers_block_type`, `layer_types`, `hybrid_override_pattern`),
the renamed Mamba fields (`mamba_num_heads`, `ssm_state_size`, ...) and the MoE routing fields.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hycache.model.configs.base import HybridConfig
from hycache.model.configs.fields import first, required

_NEMOTRON_BLOCKS = {
    "M": "M",
    "mamba": "M",
    "linear_attention": "M",
    "*": "*",
    "attention": "*",
    "full_attention": "*",
    "-": "-",
    "mlp": "-",
    "E": "E",
    "moe": "E",
}


@dataclass(frozen=True, kw_only=True)
class NemotronHConfig(HybridConfig):
    """Nemotron-H (NVIDIA): one block per layer - Mamba2 `M`, attention `*` (no positional
    encoding), a squared-ReLU MLP `-` or a mixture of squared-ReLU experts `E` - each
    pre-normed with its own residual.

    `E` blocks (`moe_layers`): a sigmoid router with a score-correction bias picks
    `num_experts_per_tok` of `n_routed_experts` experts, only among the `topk_group` best of
    `n_group` expert groups (a group scores the sum of its two best biased scores); the chosen
    unbiased scores, normalised when `norm_topk_prob`, times `routed_scaling_factor`, weight
    the experts (width `moe_intermediate_size`, run in a `moe_latent_size` space when set), and
    one shared expert (width `moe_shared_expert_intermediate_size`) is always added. Field
    names and defaults are transformers'."""

    model_type: ClassVar[str] = "nemotron_h"
    architecture: ClassVar[str] = "NemotronHForCausalLM"

    use_rope: bool = False
    mamba_expand: int | None = None
    mlp_hidden_act: str = "relu2"
    moe_layers: tuple[int, ...] = ()
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 7688
    moe_shared_expert_intermediate_size: int = 7688
    moe_latent_size: int | None = None
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "moe_layers", tuple(sorted(self.moe_layers)))
        super().__post_init__()

    @property
    def pattern(self) -> str:
        """The layer pattern in Nemotron-H's notation, e.g. "M-M*E"."""
        moe = set(self.moe_layers)
        kinds = []
        for i in range(self.num_hidden_layers):
            kinds.append(
                "*"
                if self.is_attention_layer(i)
                else "M"
                if self.is_mamba_layer(i)
                else "E"
                if i in moe
                else "-"
            )
        return "".join(kinds)

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def num_mlp_layers(self) -> int:
        """Dense MLP `-` blocks."""
        mixers = self.num_attention_layers + self.num_mamba_layers
        return self.num_hidden_layers - mixers - self.num_moe_layers

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self.moe_layers

    def validate(self) -> None:
        super().validate()
        need = self._need
        need(not self.use_rope, "use_rope", "Nemotron-H attention has no RoPE")
        need(
            self.mlp_hidden_act == "relu2",
            "mlp_hidden_act",
            f"only 'relu2' is supported, got {self.mlp_hidden_act!r}",
        )
        moe = self.moe_layers
        need(
            all(0 <= i < self.num_hidden_layers for i in moe) and len(set(moe)) == len(moe),
            "moe_layers",
            f"{moe} out of range for {self.num_hidden_layers} layers or duplicated",
        )
        mixers = set(self.attn_layer_indices) | set(self.mamba_layer_indices)
        both = sorted(mixers & set(moe))
        need(not both, "moe_layers", f"layers {both} are also attention or Mamba2 layers")
        if not moe:
            return
        self._need_positive_ints(
            "n_routed_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "moe_shared_expert_intermediate_size",
            "n_group",
            "topk_group",
        )
        if self.moe_latent_size is not None:
            need(
                isinstance(self.moe_latent_size, int) and self.moe_latent_size > 0,
                "moe_latent_size",
                f"must be a positive int or null, got {self.moe_latent_size!r}",
            )
        experts, groups = self.n_routed_experts, self.n_group
        need(
            experts % groups == 0 and experts // groups >= 2,
            "n_group",
            f"{groups} groups of n_routed_experts={experts} must be equal and hold at least two "
            "experts each (a group scores the sum of its two best)",
        )
        need(
            self.topk_group <= groups,
            "topk_group",
            f"must be in [1, n_group={groups}], got {self.topk_group}",
        )
        selectable = self.topk_group * (experts // groups)
        need(
            self.num_experts_per_tok <= selectable,
            "num_experts_per_tok",
            f"{self.num_experts_per_tok} exceeds the {selectable} experts of the topk_group="
            f"{self.topk_group} selected groups",
        )

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> NemotronHConfig:
        shape = cls._hf_read_shape(d, head_dim_keys=("head_dim", "attention_head_dim"))
        req = required(d)
        pattern = _nemotron_pattern(d)
        latent = d.get("moe_latent_size")
        mamba_act = str(d.get("mamba_hidden_act", "silu"))
        # transformers' mixer clamps dt to (time_step_min, inf); `time_step_limit` is unused.
        dt_min = float(first(d, ("time_step_min", "mamba_dt_min"), 0.001))
        return cls(
            **shape,
            intermediate_size=int(req("intermediate_size")),
            num_hidden_layers=len(pattern),
            attn_layer_indices=tuple(i for i, c in enumerate(pattern) if c == "*"),
            mamba_layers=tuple(i for i, c in enumerate(pattern) if c == "M"),
            mamba_n_heads=int(req("mamba_num_heads")),
            mamba_d_head=int(req("mamba_head_dim")),
            mamba_n_groups=int(first(d, ("n_groups", "mamba_n_groups"), 8)),
            mamba_d_state=int(req("ssm_state_size")),
            mamba_d_conv=int(first(d, ("conv_kernel", "mamba_d_conv"), 4)),
            mamba_expand=None,
            mamba_chunk_size=int(first(d, ("chunk_size", "mamba_chunk_size"), 128)),
            mamba_conv_bias=bool(first(d, ("use_conv_bias", "mamba_conv_bias"), True)),
            mamba_proj_bias=bool(d.get("use_bias", False)),
            rms_norm_eps=float(d.get("layer_norm_epsilon", 1e-5)),
            use_rope=False,
            # transformers' NemotronH never ties the head: lm_head.weight is always stored.
            tie_word_embeddings=False,
            time_step_limit=(dt_min, math.inf),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            hidden_act=mamba_act,
            attention_bias=False,  # transformers builds q/k/v/o without biases
            mlp_bias=bool(d.get("mlp_bias", False)),
            mlp_hidden_act=str(d.get("mlp_hidden_act", "relu2")),
            moe_layers=tuple(i for i, c in enumerate(pattern) if c == "E"),
            n_routed_experts=int(first(d, ("n_routed_experts", "num_local_experts"), 8)),
            num_experts_per_tok=int(d.get("num_experts_per_tok", 2)),
            moe_intermediate_size=int(d.get("moe_intermediate_size", 7688)),
            moe_shared_expert_intermediate_size=int(
                d.get("moe_shared_expert_intermediate_size", 7688)
            ),
            moe_latent_size=None if latent is None else int(latent),
            n_group=int(d.get("n_group", 1)),
            topk_group=int(d.get("topk_group", 1)),
            norm_topk_prob=bool(d.get("norm_topk_prob", True)),
            routed_scaling_factor=float(d.get("routed_scaling_factor", 1.0)),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
        return {
            **self._hf_common(),
            "intermediate_size": self.intermediate_size,
            "layers_block_type": [names[c] for c in self.pattern],
            "mamba_num_heads": self.mamba_n_heads,
            "mamba_head_dim": self.mamba_d_head,
            "n_groups": self.mamba_n_groups,
            "ssm_state_size": self.mamba_d_state,
            "conv_kernel": self.mamba_d_conv,
            "chunk_size": self.mamba_chunk_size,
            "use_conv_bias": self.mamba_conv_bias,
            "use_bias": self.mamba_proj_bias,
            "layer_norm_epsilon": self.rms_norm_eps,
            "time_step_min": self.time_step_limit[0],
            "mamba_hidden_act": self.hidden_act,
            "mlp_hidden_act": self.mlp_hidden_act,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "moe_shared_expert_intermediate_size": self.moe_shared_expert_intermediate_size,
            "moe_latent_size": self.moe_latent_size,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "norm_topk_prob": self.norm_topk_prob,
            "routed_scaling_factor": self.routed_scaling_factor,
        }


def _nemotron_pattern(d: Mapping[str, Any]) -> str:
    """The per-layer block pattern ("M-*E...") from any layout transformers has used."""
    raw = first(d, ("layers_block_type", "layer_types", "hybrid_override_pattern"), None)
    if raw is None:
        raise ValueError(
            "config field 'layers_block_type' (or 'hybrid_override_pattern') is missing"
        )
    items = list(raw) if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise ValueError(f"config field 'layers_block_type' must be a non-empty list, got {raw!r}")
    bad = sorted({str(t) for t in items if t not in _NEMOTRON_BLOCKS})
    if bad:
        raise ValueError(
            f"nemotron_h: unknown layer block types {bad}; known: 'M' / 'mamba', '*' / "
            "'attention', '-' / 'mlp', 'E' / 'moe'"
        )
    return "".join(_NEMOTRON_BLOCKS[t] for t in items)
