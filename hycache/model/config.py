"""Bamba model configuration.

Owns `BambaConfig`, a frozen, validated view of a Hugging Face Bamba `config.json`. It accepts
both the transformers 5 layout (RoPE settings inside `rope_parameters`) and the older ones
(`rope_theta` / `partial_rotary_factor` at the top level, or a `rope_scaling` dict).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Bamba hard-codes a partial rotary factor of 0.5 when a config does not name one.
_DEFAULT_PARTIAL_ROTARY_FACTOR = 0.5
_DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class BambaConfig:
    """Hyper-parameters of a Bamba (hybrid Mamba2 + attention) decoder."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attn_layer_indices: tuple[int, ...]
    mamba_n_heads: int
    mamba_d_head: int
    mamba_n_groups: int
    mamba_d_state: int
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_chunk_size: int = 256
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = _DEFAULT_ROPE_THETA
    partial_rotary_factor: float = _DEFAULT_PARTIAL_ROTARY_FACTOR
    tie_word_embeddings: bool = False
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    max_position_embeddings: int = 262144
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "attn_layer_indices", tuple(sorted(self.attn_layer_indices)))
        object.__setattr__(self, "time_step_limit", tuple(float(x) for x in self.time_step_limit))
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def mamba_intermediate_size(self) -> int:
        """Width of the SSM input x (= heads * head_dim = expand * hidden)."""
        return self.mamba_expand * self.hidden_size

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
        """Number of leading head dims that are rotated by RoPE."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def mamba_layer_indices(self) -> tuple[int, ...]:
        attn = set(self.attn_layer_indices)
        return tuple(i for i in range(self.num_hidden_layers) if i not in attn)

    @property
    def num_attention_layers(self) -> int:
        return len(self.attn_layer_indices)

    @property
    def num_mamba_layers(self) -> int:
        return self.num_hidden_layers - len(self.attn_layer_indices)

    def is_attention_layer(self, layer: int) -> bool:
        return layer in self.attn_layer_indices

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        def need(cond: bool, field: str, msg: str) -> None:
            if not cond:
                raise ValueError(f"BambaConfig.{field}: {msg}")

        for name in (
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
            "mamba_expand",
            "mamba_chunk_size",
        ):
            value = getattr(self, name)
            ok = isinstance(value, int) and value > 0
            need(ok, name, f"must be a positive int, got {value!r}")
        need(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_key_value_heads",
            f"{self.num_key_value_heads} does not divide num_attention_heads "
            f"{self.num_attention_heads}",
        )
        need(
            all(0 <= i < self.num_hidden_layers for i in self.attn_layer_indices),
            "attn_layer_indices",
            f"{self.attn_layer_indices} out of range for {self.num_hidden_layers} layers",
        )
        need(
            len(set(self.attn_layer_indices)) == len(self.attn_layer_indices),
            "attn_layer_indices",
            f"duplicate entries in {self.attn_layer_indices}",
        )
        need(
            self.mamba_n_heads * self.mamba_d_head == self.mamba_intermediate_size,
            "mamba_d_head",
            f"mamba_n_heads * mamba_d_head = {self.mamba_n_heads * self.mamba_d_head} != "
            f"mamba_expand * hidden_size = {self.mamba_intermediate_size}",
        )
        need(
            self.mamba_n_heads % self.mamba_n_groups == 0,
            "mamba_n_groups",
            f"{self.mamba_n_groups} does not divide mamba_n_heads {self.mamba_n_heads}",
        )
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
    def from_hf_dict(cls, d: Mapping[str, Any]) -> BambaConfig:
        """Build from a Hugging Face `config.json` dict (transformers 4.x or 5.x layout)."""
        model_type = d.get("model_type")
        if model_type != "bamba":
            raise ValueError(f"config field model_type must be 'bamba', got {model_type!r}")

        def req(name: str) -> Any:
            if name not in d or d[name] is None:
                raise ValueError(f"config field {name!r} is missing")
            return d[name]

        hidden_size = int(req("hidden_size"))
        num_heads = int(req("num_attention_heads"))
        kv_heads = d.get("num_key_value_heads")
        kv_heads = num_heads if kv_heads is None else int(kv_heads)
        head_dim = d.get("head_dim")
        head_dim = hidden_size // num_heads if head_dim is None else int(head_dim)

        mamba_expand = int(d.get("mamba_expand", 2))
        mamba_n_heads = int(req("mamba_n_heads"))
        mamba_d_head = d.get("mamba_d_head", "auto")
        if mamba_d_head in (None, "auto"):
            mamba_d_head = mamba_expand * hidden_size // mamba_n_heads

        rope_theta, partial = _parse_rope(d)

        tsl = d.get("time_step_limit")
        if tsl is None:
            time_step_limit = (0.0, math.inf)
        elif isinstance(tsl, list | tuple) and len(tsl) == 2:
            time_step_limit = (
                _as_float(tsl[0], "time_step_limit"),
                _as_float(tsl[1], "time_step_limit"),
            )
        else:
            raise ValueError(
                f"config field 'time_step_limit' must be a [min, max] pair, got {tsl!r}"
            )
        attn = d.get("attn_layer_indices") or ()

        return cls(
            vocab_size=int(req("vocab_size")),
            hidden_size=hidden_size,
            intermediate_size=int(req("intermediate_size")),
            num_hidden_layers=int(req("num_hidden_layers")),
            num_attention_heads=num_heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            attn_layer_indices=tuple(int(i) for i in attn),
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
            time_step_limit=time_step_limit,
            max_position_embeddings=int(d.get("max_position_embeddings", 262144)),
            hidden_act=str(d.get("hidden_act", "silu")),
            attention_bias=bool(d.get("attention_bias", False)),
            mlp_bias=bool(d.get("mlp_bias", False)),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` dict in the transformers 5 layout (round-trips via from_hf_dict)."""
        d: dict[str, Any] = dataclasses.asdict(self)
        d.pop("rope_theta")
        d.pop("partial_rotary_factor")
        d["attn_layer_indices"] = list(self.attn_layer_indices)
        d["time_step_limit"] = list(self.time_step_limit)
        d["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": self.rope_theta,
            "partial_rotary_factor": self.partial_rotary_factor,
        }
        d["model_type"] = "bamba"
        d["architectures"] = ["BambaForCausalLM"]
        return d


def _as_float(value: Any, field: str) -> float:
    """A float from a JSON value; transformers writes infinities as {"__float__": "Infinity"}."""
    if isinstance(value, Mapping) and "__float__" in value:
        value = value["__float__"]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"config field {field!r}: {value!r} is not a number") from None


def _parse_rope(d: Mapping[str, Any]) -> tuple[float, float]:
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
    partial = _DEFAULT_PARTIAL_ROTARY_FACTOR if partial is None else float(partial)
    return theta, partial
