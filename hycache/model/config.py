"""Model configurations: the common hybrid geometry and each architecture's HF mapping.

Owns `HybridConfig`, the frozen, validated description every hybrid (Mamba2 + attention) model
shares - layer placement, attention and Mamba2 geometry, norms, RoPE - which the model, the
caches (`paged.py`) and the engine's byte counts read; and one subclass per architecture that
maps a Hugging Face `config.json` onto it (`from_hf_dict`) and back (`to_hf_dict`):

    BambaConfig          model_type "bamba"
    NemotronHConfig      model_type "nemotron_h"       (per-layer pattern of M / * / - / E blocks)
    GraniteHybridConfig  model_type "granitemoehybrid" (MoE or dense MLPs, multipliers)

`config_from_hf_dict` dispatches on `model_type` and names the supported ones otherwise.
Both the transformers 5 layouts (RoPE settings inside `rope_parameters`, `layers_block_type`)
and the older ones (`rope_theta` at the top level, `hybrid_override_pattern`) are accepted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

_DEFAULT_ROPE_THETA = 10000.0
_INF_JSON = {"__float__": "Infinity"}  # how transformers writes float("inf") in config.json


@dataclass(frozen=True, kw_only=True)
class HybridConfig:
    """Hyper-parameters shared by every hybrid decoder hycache runs.

    Layer placement: `attn_layer_indices` hold attention mixers; `mamba_layers` hold Mamba2
    mixers (None: every other layer). Layers in neither are MLP-only blocks (Nemotron-H `-`).
    """

    model_type: ClassVar[str] = ""
    architecture: ClassVar[str] = ""

    vocab_size: int
    hidden_size: int
    intermediate_size: int  # width of the dense MLP (Granite: the shared MLP)
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attn_layer_indices: tuple[int, ...]
    mamba_layers: tuple[int, ...] | None = None
    mamba_n_heads: int
    mamba_d_head: int
    mamba_n_groups: int
    mamba_d_state: int
    mamba_d_conv: int = 4
    mamba_expand: int | None = 2  # None: the Mamba width is not tied to hidden_size
    mamba_chunk_size: int = 256
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    rms_norm_eps: float = 1e-5
    use_rope: bool = True
    rope_theta: float = _DEFAULT_ROPE_THETA
    partial_rotary_factor: float = 1.0
    attention_scale: float | None = None  # None: head_dim ** -0.5
    tie_word_embeddings: bool = False
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    max_position_embeddings: int = 262144
    hidden_act: str = "silu"  # the Mamba conv activation (and Bamba's / Granite's MLP gate)
    attention_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "attn_layer_indices", tuple(sorted(self.attn_layer_indices)))
        if self.mamba_layers is not None:
            object.__setattr__(self, "mamba_layers", tuple(sorted(self.mamba_layers)))
        object.__setattr__(self, "time_step_limit", tuple(float(x) for x in self.time_step_limit))
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def mamba_intermediate_size(self) -> int:
        """Width of the SSM input x (= heads * head_dim)."""
        return self.mamba_n_heads * self.mamba_d_head

    @property
    def mamba_conv_dim(self) -> int:
        """Channels that go through the causal conv: x, B and C."""
        return self.mamba_intermediate_size + 2 * self.mamba_n_groups * self.mamba_d_state

    @property
    def mamba_in_proj_size(self) -> int:
        """Output width of the Mamba in-projection: gate z, xBC, dt."""
        return self.mamba_intermediate_size + self.mamba_conv_dim + self.mamba_n_heads

    @property
    def rotary_dim(self) -> int:
        """Number of leading head dims that are rotated by RoPE (0 without RoPE)."""
        return int(self.head_dim * self.partial_rotary_factor) if self.use_rope else 0

    @property
    def mamba_layer_indices(self) -> tuple[int, ...]:
        if self.mamba_layers is not None:
            return self.mamba_layers
        attn = set(self.attn_layer_indices)
        return tuple(i for i in range(self.num_hidden_layers) if i not in attn)

    @property
    def num_attention_layers(self) -> int:
        return len(self.attn_layer_indices)

    @property
    def num_mamba_layers(self) -> int:
        return len(self.mamba_layer_indices)

    def is_attention_layer(self, layer: int) -> bool:
        return layer in self.attn_layer_indices

    def is_mamba_layer(self, layer: int) -> bool:
        return layer in self.mamba_layer_indices

    # ------------------------------------------------------------------ validation
    def _need(self, cond: bool, field: str, msg: str) -> None:
        if not cond:
            raise ValueError(f"{type(self).__name__}.{field}: {msg}")

    def _need_positive_ints(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            ok = isinstance(value, int) and value > 0
            self._need(ok, name, f"must be a positive int, got {value!r}")

    def validate(self) -> None:
        need = self._need
        self._need_positive_ints(
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "mamba_n_heads",
            "mamba_d_head",
            "mamba_n_groups",
            "mamba_d_state",
            "mamba_d_conv",
            "mamba_chunk_size",
        )
        need(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_key_value_heads",
            f"{self.num_key_value_heads} does not divide num_attention_heads "
            f"{self.num_attention_heads}",
        )
        for name, idx in (
            ("attn_layer_indices", self.attn_layer_indices),
            ("mamba_layers", self.mamba_layers or ()),
        ):
            need(
                all(0 <= i < self.num_hidden_layers for i in idx),
                name,
                f"{idx} out of range for {self.num_hidden_layers} layers",
            )
            need(len(set(idx)) == len(idx), name, f"duplicate entries in {idx}")
        both = set(self.attn_layer_indices) & set(self.mamba_layers or ())
        need(not both, "mamba_layers", f"layers {sorted(both)} are also attention layers")
        if self.mamba_expand is not None:
            need(
                self.mamba_intermediate_size == self.mamba_expand * self.hidden_size,
                "mamba_d_head",
                f"mamba_n_heads * mamba_d_head = {self.mamba_intermediate_size} != "
                f"mamba_expand * hidden_size = {self.mamba_expand * self.hidden_size}",
            )
        need(
            self.mamba_n_heads % self.mamba_n_groups == 0,
            "mamba_n_groups",
            f"{self.mamba_n_groups} does not divide mamba_n_heads {self.mamba_n_heads}",
        )
        if self.use_rope:
            need(
                0.0 < self.partial_rotary_factor <= 1.0,
                "partial_rotary_factor",
                f"must be in (0, 1], got {self.partial_rotary_factor}",
            )
            need(
                self.rotary_dim % 2 == 0 and self.rotary_dim > 0,
                "partial_rotary_factor",
                f"head_dim * partial_rotary_factor = {self.rotary_dim} must be a positive even int",
            )
            need(self.rope_theta > 0, "rope_theta", f"must be positive, got {self.rope_theta}")
        if self.attention_scale is not None:
            need(self.attention_scale > 0, "attention_scale", "must be positive")
        need(
            self.hidden_act == "silu",
            "hidden_act",
            f"only 'silu' is supported, got {self.hidden_act!r}",
        )
        need(len(self.time_step_limit) == 2, "time_step_limit", "must be a (min, max) pair")
        need(
            self.time_step_limit[0] <= self.time_step_limit[1],
            "time_step_limit",
            f"min > max in {self.time_step_limit}",
        )
        need(self.rms_norm_eps > 0, "rms_norm_eps", "must be positive")

    # ------------------------------------------------------------------ (de)serialisation
    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> HybridConfig:
        """Build from a Hugging Face `config.json` dict of this architecture."""
        raise NotImplementedError

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` dict in the transformers 5 layout (round-trips via from_hf_dict)."""
        raise NotImplementedError

    @classmethod
    def _check_model_type(cls, d: Mapping[str, Any]) -> None:
        model_type = d.get("model_type")
        if model_type != cls.model_type:
            raise ValueError(
                f"config field model_type must be {cls.model_type!r}, got {model_type!r}"
            )
        _check_field_types(d)

    def _hf_common(self) -> dict[str, Any]:
        """Fields every architecture writes under the same name."""
        return {
            "model_type": self.model_type,
            "architectures": [self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "time_step_limit": _pair_to_json(self.time_step_limit),
        }

    def _hf_mamba(self) -> dict[str, Any]:
        """The `mamba_*` fields under the names Bamba and Granite share (Nemotron-H renames
        them)."""
        return {
            "mamba_n_heads": self.mamba_n_heads,
            "mamba_d_head": self.mamba_d_head,
            "mamba_n_groups": self.mamba_n_groups,
            "mamba_d_state": self.mamba_d_state,
            "mamba_d_conv": self.mamba_d_conv,
            "mamba_expand": self.mamba_expand,
            "mamba_chunk_size": self.mamba_chunk_size,
            "mamba_conv_bias": self.mamba_conv_bias,
            "mamba_proj_bias": self.mamba_proj_bias,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": self.hidden_act,
        }


# ---------------------------------------------------------------------------------- Bamba
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
        req = _required(d)
        hidden_size = int(req("hidden_size"))
        num_heads, kv_heads, head_dim = _attention_shape(d, hidden_size)
        mamba_expand = int(d.get("mamba_expand", 2))
        mamba_n_heads = int(req("mamba_n_heads"))
        mamba_d_head = d.get("mamba_d_head", "auto")
        if mamba_d_head in (None, "auto"):
            mamba_d_head = mamba_expand * hidden_size // mamba_n_heads
        rope_theta, partial = _parse_rope(d, default_partial=0.5)
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
            mamba_d_head=int(mamba_d_head),
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
            time_step_limit=_parse_pair(d.get("time_step_limit"), "time_step_limit"),
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


# ---------------------------------------------------------------------------------- Nemotron-H
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
        cls._check_model_type(d)
        req = _required(d)
        pattern = _nemotron_pattern(d)
        latent = d.get("moe_latent_size")
        hidden_size = int(req("hidden_size"))
        num_heads, kv_heads, head_dim = _attention_shape(
            d, hidden_size, head_dim_keys=("head_dim", "attention_head_dim")
        )
        mamba_act = str(d.get("mamba_hidden_act", "silu"))
        # transformers' mixer clamps dt to (time_step_min, inf); `time_step_limit` is unused.
        dt_min = float(_first(d, ("time_step_min", "mamba_dt_min"), 0.001))
        return cls(
            vocab_size=int(req("vocab_size")),
            hidden_size=hidden_size,
            intermediate_size=int(req("intermediate_size")),
            num_hidden_layers=len(pattern),
            num_attention_heads=num_heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            attn_layer_indices=tuple(i for i, c in enumerate(pattern) if c == "*"),
            mamba_layers=tuple(i for i, c in enumerate(pattern) if c == "M"),
            mamba_n_heads=int(req("mamba_num_heads")),
            mamba_d_head=int(req("mamba_head_dim")),
            mamba_n_groups=int(_first(d, ("n_groups", "mamba_n_groups"), 8)),
            mamba_d_state=int(req("ssm_state_size")),
            mamba_d_conv=int(_first(d, ("conv_kernel", "mamba_d_conv"), 4)),
            mamba_expand=None,
            mamba_chunk_size=int(_first(d, ("chunk_size", "mamba_chunk_size"), 128)),
            mamba_conv_bias=bool(_first(d, ("use_conv_bias", "mamba_conv_bias"), True)),
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
            n_routed_experts=int(_first(d, ("n_routed_experts", "num_local_experts"), 8)),
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
    raw = _first(d, ("layers_block_type", "layer_types", "hybrid_override_pattern"), None)
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


# ---------------------------------------------------------------------------------- Granite
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
        cls._check_model_type(d)
        req = _required(d)
        hidden_size = int(req("hidden_size"))
        num_heads, kv_heads, head_dim = _attention_shape(d, hidden_size)
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
        rope_theta, _ = _parse_rope(d, default_partial=1.0)
        mamba_expand = int(d.get("mamba_expand", 2))
        mamba_n_heads = int(d.get("mamba_n_heads", 128))
        mamba_d_head = d.get("mamba_d_head", "auto")
        if mamba_d_head in (None, "auto"):
            mamba_d_head = mamba_expand * hidden_size // mamba_n_heads
        experts = int(d.get("num_local_experts") or 0)
        return cls(
            vocab_size=int(req("vocab_size")),
            hidden_size=hidden_size,
            intermediate_size=int(d.get("shared_intermediate_size", 1024)),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            attn_layer_indices=tuple(
                i for i, t in enumerate(layer_types) if _GRANITE_LAYERS[t] == "attention"
            ),
            mamba_n_heads=mamba_n_heads,
            mamba_d_head=int(mamba_d_head),
            mamba_n_groups=int(d.get("mamba_n_groups", 1)),
            mamba_d_state=int(d.get("mamba_d_state", 256)),
            mamba_d_conv=int(d.get("mamba_d_conv", 4)),
            mamba_expand=mamba_expand,
            mamba_chunk_size=int(d.get("mamba_chunk_size", 256)),
            mamba_conv_bias=bool(d.get("mamba_conv_bias", True)),
            mamba_proj_bias=bool(d.get("mamba_proj_bias", False)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            use_rope=pos == "rope",
            rope_theta=rope_theta,
            partial_rotary_factor=1.0,
            # Granite scales attention scores by attention_multiplier, not head_dim ** -0.5.
            attention_scale=float(d.get("attention_multiplier", 1.0)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            time_step_limit=_parse_pair(d.get("time_step_limit"), "time_step_limit"),
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


# ---------------------------------------------------------------------------------- dispatch
CONFIG_CLASSES: dict[str, type[HybridConfig]] = {
    c.model_type: c for c in (BambaConfig, NemotronHConfig, GraniteHybridConfig)
}


def config_from_hf_dict(d: Mapping[str, Any]) -> HybridConfig:
    """The config of whichever supported architecture `d["model_type"]` names."""
    model_type = d.get("model_type")
    cls = CONFIG_CLASSES.get(model_type) if isinstance(model_type, str) else None
    if cls is None:
        raise ValueError(
            f"config field model_type {model_type!r} is not supported; hycache runs the "
            f"Mamba2 + attention hybrids {', '.join(sorted(CONFIG_CLASSES))}"
        )
    return cls.from_hf_dict(d)


# ---------------------------------------------------------------------------------- helpers
# the JSON types of the config.json fields the parsers read (absent or null: the default)
_INT_FIELDS = frozenset(
    {
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "attention_head_dim",
        "mamba_expand", "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state",
        "mamba_d_conv", "mamba_chunk_size", "max_position_embeddings", "mamba_num_heads",
        "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel", "chunk_size",
        "n_routed_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
        "moe_shared_expert_intermediate_size", "moe_latent_size", "n_group", "topk_group",
        "shared_intermediate_size",
    }
)  # fmt: skip
_FLOAT_FIELDS = frozenset(
    {
        "rms_norm_eps", "layer_norm_epsilon", "rope_theta", "partial_rotary_factor",
        "time_step_min", "mamba_dt_min", "routed_scaling_factor", "attention_multiplier",
        "embedding_multiplier", "residual_multiplier", "logits_scaling",
    }
)  # fmt: skip
_BOOL_FIELDS = frozenset(
    {
        "mamba_conv_bias", "mamba_proj_bias", "tie_word_embeddings", "attention_bias",
        "mlp_bias", "use_conv_bias", "use_bias", "norm_topk_prob",
    }
)  # fmt: skip
_AUTO = {"mamba_d_head": "auto"}  # a string some fields may hold instead of a number


def _check_field_types(d: Mapping[str, Any]) -> None:
    """Refuse a config field of the wrong JSON type, naming it: integers must be integers (not
    booleans, not floats such as 256.0 or 256.5, not strings such as "512"), numbers must be
    numbers (not booleans or strings), booleans booleans."""
    for name, value in d.items():
        if value is None or _AUTO.get(name) == value:
            continue
        if name in _INT_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"config field {name!r} must be an integer, got {value!r}")
        if name in _FLOAT_FIELDS and (
            isinstance(value, bool) or not isinstance(value, int | float)
        ):
            raise ValueError(f"config field {name!r} must be a number, got {value!r}")
        if name in _BOOL_FIELDS and not isinstance(value, bool):
            raise ValueError(f"config field {name!r} must be true or false, got {value!r}")
    indices = d.get("attn_layer_indices")
    if indices is not None and (
        not isinstance(indices, list)
        or any(isinstance(i, bool) or not isinstance(i, int) for i in indices)
    ):
        raise ValueError(f"config field 'attn_layer_indices' must list integers, got {indices!r}")


def _required(d: Mapping[str, Any]) -> Any:
    def req(name: str) -> Any:
        if name not in d or d[name] is None:
            raise ValueError(f"config field {name!r} is missing")
        return d[name]

    return req


def _first(d: Mapping[str, Any], names: tuple[str, ...], default: Any) -> Any:
    """The value of the first of `names` present (and not null) in d, else `default`."""
    for name in names:
        if d.get(name) is not None:
            return d[name]
    return default


def _attention_shape(
    d: Mapping[str, Any], hidden_size: int, head_dim_keys: tuple[str, ...] = ("head_dim",)
) -> tuple[int, int, int]:
    """(num_attention_heads, num_key_value_heads, head_dim) with the usual defaults."""
    if d.get("num_attention_heads") is None:
        raise ValueError("config field 'num_attention_heads' is missing")
    num_heads = int(d["num_attention_heads"])
    kv_heads = d.get("num_key_value_heads")
    kv_heads = num_heads if kv_heads is None else int(kv_heads)
    head_dim = _first(d, head_dim_keys, None)
    head_dim = hidden_size // num_heads if head_dim is None else int(head_dim)
    return num_heads, kv_heads, head_dim


def _as_float(value: Any, field: str) -> float:
    """A float from a JSON value; transformers writes infinities as {"__float__": "Infinity"}."""
    if isinstance(value, Mapping) and "__float__" in value:
        value = value["__float__"]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"config field {field!r}: {value!r} is not a number") from None


def _parse_pair(value: Any, field: str) -> tuple[float, float]:
    if value is None:
        return (0.0, math.inf)
    if isinstance(value, list | tuple) and len(value) == 2:
        return (_as_float(value[0], field), _as_float(value[1], field))
    raise ValueError(f"config field {field!r} must be a [min, max] pair, got {value!r}")


def _pair_to_json(pair: tuple[float, float]) -> list[Any]:
    return [_INF_JSON if math.isinf(x) and x > 0 else x for x in pair]


def _parse_rope(d: Mapping[str, Any], *, default_partial: float) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from any of the layouts transformers has used."""
    theta = d.get("rope_theta")
    partial = d.get("partial_rotary_factor")
    for key in ("rope_scaling", "rope_parameters"):  # later entries win
        params = d.get(key)
        if not params:
            continue
        if not isinstance(params, Mapping):
            raise ValueError(f"config field {key!r} must be a dict, got {type(params).__name__}")
        if "rope_theta" not in params and "full_attention" in params:
            params = params["full_attention"]  # per-layer-type layout
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(
                f"config field {key}.rope_type {rope_type!r} is not supported (only 'default')"
            )
        theta = params.get("rope_theta", theta)
        partial = params.get("partial_rotary_factor", partial)
    theta = _DEFAULT_ROPE_THETA if theta is None else float(theta)
    partial = default_partial if partial is None else float(partial)
    return theta, partial


__all__ = [
    "CONFIG_CLASSES",
    "BambaConfig",
    "GraniteHybridConfig",
    "HybridConfig",
    "NemotronHConfig",
    "config_from_hf_dict",
]
