"""The common hybrid geometry: `HybridConfig` and the HF fields every architecture shares.

Owns `HybridConfig`, the frozen, validated description every hybrid (Mamba2 + attention) model
shares - layer placement, attention and Mamba2 geometry, norms, RoPE - which the model, the
caches (`paged.py`), the engine's byte counts (`cache/layout.py`) and the simulator's
`ModelSpec.from_config` read; its value checks (`validate`, one `_need` per rule); and the
readers of the `config.json` fields the architectures share (`attention_shape`,
`mamba_head_dim`, `parse_rope`).
Each architecture's own fields and HF mapping is a subclass in its own file of this package.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hycache.model.configs.fields import check_hf_field_types, first, pair_to_json, required

_DEFAULT_ROPE_THETA = 10000.0


def conv_channels(d_inner: int, n_groups: int, d_state: int) -> int:
    """Channels of a Mamba2 layer's causal conv1d: x (`d_inner` wide), then B and C
    (`n_groups * d_state` each); the one formula for the model and the simulator's
    `MambaSpec`."""
    return d_inner + 2 * n_groups * d_state


@dataclass(frozen=True, kw_only=True)
class HybridConfig:
    """Hyper-parameters shared by every hybrid decoder hycache runs.

    Layer placement: `attn_layer_indices` hold attention mixers; `mamba_layers` hold Mamba2
    mixers (None: every other layer). Layers in neither are MLP-only blocks (Nemotron-H `-`).
    """

    model_type: ClassVar[str] = ""
    architecture: ClassVar[str] = ""
    # the recurrent mixer of the `mamba_*` layers: "mamba2", or "gdn" (Gated DeltaNet, whose
    # geometry maps onto the same fields: see configs/qwen3_next.py)
    recurrent_mixer: ClassVar[str] = "mamba2"
    # the drafter without `--draft-model`: True, the checkpoint's own MTP layer (`mtp.*`, run by
    # `hycache.model.mtp.MtpHead`; a random one for a preset); False, a random EAGLE head
    mtp_drafter: ClassVar[bool] = False

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
        """Channels that go through the causal conv (`conv_channels`)."""
        return conv_channels(self.mamba_intermediate_size, self.mamba_n_groups, self.mamba_d_state)

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
        check_hf_field_types(d)

    @classmethod
    def _hf_read_shape(
        cls, d: Mapping[str, Any], head_dim_keys: tuple[str, ...] = ("head_dim",)
    ) -> dict[str, Any]:
        """After `_check_model_type`, the fields every architecture reads under the same
        names: the vocabulary, the width and the attention shape (`attention_shape`)."""
        cls._check_model_type(d)
        req = required(d)
        hidden_size = int(req("hidden_size"))
        num_heads, kv_heads, head_dim = attention_shape(d, hidden_size, head_dim_keys)
        return {
            "vocab_size": int(req("vocab_size")),
            "hidden_size": hidden_size,
            "num_attention_heads": num_heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
        }

    @staticmethod
    def _hf_read_mamba(
        d: Mapping[str, Any], hidden_size: int, *, n_heads: int, d_state: int
    ) -> dict[str, Any]:
        """The `mamba_*` fields read back from the names `_hf_mamba` writes (Bamba's and
        Granite's; their defaults for the heads and the state size differ, so they are read
        by the caller)."""
        expand = int(d.get("mamba_expand", 2))
        return {
            "mamba_n_heads": n_heads,
            "mamba_d_head": mamba_head_dim(d, hidden_size, n_heads, expand),
            "mamba_n_groups": int(d.get("mamba_n_groups", 1)),
            "mamba_d_state": d_state,
            "mamba_d_conv": int(d.get("mamba_d_conv", 4)),
            "mamba_expand": expand,
            "mamba_chunk_size": int(d.get("mamba_chunk_size", 256)),
            "mamba_conv_bias": bool(d.get("mamba_conv_bias", True)),
            "mamba_proj_bias": bool(d.get("mamba_proj_bias", False)),
        }

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
            "time_step_limit": pair_to_json(self.time_step_limit),
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


def attention_shape(
    d: Mapping[str, Any], hidden_size: int, head_dim_keys: tuple[str, ...] = ("head_dim",)
) -> tuple[int, int, int]:
    """(num_attention_heads, num_key_value_heads, head_dim) with the usual defaults."""
    if d.get("num_attention_heads") is None:
        raise ValueError("config field 'num_attention_heads' is missing")
    num_heads = int(d["num_attention_heads"])
    kv_heads = d.get("num_key_value_heads")
    kv_heads = num_heads if kv_heads is None else int(kv_heads)
    head_dim = first(d, head_dim_keys, None)
    head_dim = hidden_size // num_heads if head_dim is None else int(head_dim)
    return num_heads, kv_heads, head_dim


def mamba_head_dim(d: Mapping[str, Any], hidden_size: int, n_heads: int, expand: int) -> int:
    """`mamba_d_head`, or for "auto" (or absent) the Mamba width expand * hidden_size split
    over the heads (Bamba's and Granite's layout)."""
    value = d.get("mamba_d_head", "auto")
    return expand * hidden_size // n_heads if value in (None, "auto") else int(value)


def parse_rope(d: Mapping[str, Any], *, default_partial: float) -> tuple[float, float]:
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
