"""The one validator of model description files: JSON field types and the readers built on it.

Owns the type rules every config file obeys (`type_problem`: an integer is an int but not a
bool, a number an int or float but not a bool, ...) and the two ways of reading a file that
apply them, each naming the offending field:

    check_hf_field_types   a Hugging Face `config.json`: every field the architecture parsers
                           read has its JSON type checked up front ("config field 'x' ...")
    FieldReader            a hycache preset (the simulator's GPU and model files): fields read
                           one by one against a table, unknown fields refused, nested objects
                           named dotted ("preset.json: field 'attention.head_dim' ...")

and the small helpers the architecture parsers share (`required`, `first`, `parse_pair`).
Value rules of a parsed model (ranges, divisibility) are `HybridConfig.validate`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

INF_JSON = {"__float__": "Infinity"}  # how transformers writes float("inf") in config.json

_TYPE_NAMES = {
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "str": "a string",
}


def type_problem(kind: str, value: Any) -> str | None:
    """What is wrong with `value` as a JSON `kind` ("int", "number", "bool", "str"), or None."""
    if kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind == "bool":
        ok = isinstance(value, bool)
    else:
        ok = isinstance(value, str)
    return None if ok else f"must be {_TYPE_NAMES[kind]}, got {value!r}"


# ---------------------------------------------------------------------------- HF config.json
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
        "shared_intermediate_size", "linear_num_key_heads", "linear_num_value_heads",
        "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts",
        "shared_expert_intermediate_size", "decoder_sparse_step",
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
_HF_KINDS = (("int", _INT_FIELDS), ("number", _FLOAT_FIELDS), ("bool", _BOOL_FIELDS))
_AUTO = {"mamba_d_head": "auto"}  # a string some fields may hold instead of a number


def check_hf_field_types(d: Mapping[str, Any]) -> None:
    """Refuse a config field of the wrong JSON type, naming it: integers must be integers (not
    booleans, not floats such as 256.0 or 256.5, not strings such as "512"), numbers must be
    numbers (not booleans or strings), booleans booleans."""
    for name, value in d.items():
        if value is None or _AUTO.get(name) == value:
            continue
        for kind, names in _HF_KINDS:
            problem = type_problem(kind, value) if name in names else None
            if problem:
                raise ValueError(f"config field {name!r} {problem}")
    indices = d.get("attn_layer_indices")
    if indices is not None and (
        not isinstance(indices, list) or any(type_problem("int", i) for i in indices)
    ):
        raise ValueError(f"config field 'attn_layer_indices' must list integers, got {indices!r}")


def required(d: Mapping[str, Any]) -> Any:
    """`req(name)`: the value of field `name` of d, refused naming it when absent or null."""

    def req(name: str) -> Any:
        if name not in d or d[name] is None:
            raise ValueError(f"config field {name!r} is missing")
        return d[name]

    return req


def first(d: Mapping[str, Any], names: tuple[str, ...], default: Any) -> Any:
    """The value of the first of `names` present (and not null) in d, else `default`."""
    for name in names:
        if d.get(name) is not None:
            return d[name]
    return default


def _as_float(value: Any, field: str) -> float:
    """A float from a JSON value; transformers writes infinities as {"__float__": "Infinity"}."""
    if isinstance(value, Mapping) and "__float__" in value:
        value = value["__float__"]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"config field {field!r}: {value!r} is not a number") from None


def parse_pair(value: Any, field: str) -> tuple[float, float]:
    """A [min, max] pair of numbers (absent: (0, inf))."""
    if value is None:
        return (0.0, math.inf)
    if isinstance(value, list | tuple) and len(value) == 2:
        return (_as_float(value[0], field), _as_float(value[1], field))
    raise ValueError(f"config field {field!r} must be a [min, max] pair, got {value!r}")


def pair_to_json(pair: tuple[float, float]) -> list[Any]:
    """The inverse of `parse_pair`, infinities written as transformers writes them."""
    return [INF_JSON if math.isinf(x) and x > 0 else x for x in pair]


# ---------------------------------------------------------------------------- hycache presets
class FieldReader:
    """Reads one JSON object against a field table, naming the file and field in errors."""

    def __init__(self, data: Any, where: str, prefix: str = "") -> None:
        self.where = where
        self.prefix = prefix
        if not isinstance(data, dict):
            what = f"field '{prefix[:-1]}'" if prefix else "top level"
            raise ValueError(f"{where}: {what} must be a JSON object")
        self.data: dict[str, Any] = data
        self.used: set[str] = set()

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def fail(self, key: str, msg: str) -> ValueError:
        return ValueError(f"{self.where}: field '{self._name(key)}' {msg}")

    def get(self, key: str, required: bool) -> Any:
        """The raw value of `key` (None when absent or null), refused when required."""
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if required:
                raise self.fail(key, "is missing")
            return None
        return self.data[key]

    def _typed(self, key: str, kind: str, required: bool) -> Any:
        v = self.get(key, required)
        problem = None if v is None else type_problem(kind, v)
        if problem:
            raise self.fail(key, problem)
        return v

    def get_int(self, key: str, *, required: bool = True, minimum: int = 0) -> Any:
        v = self.get(key, required)
        if v is None:
            return None
        problem = type_problem("int", v)  # 256.0 too: integers are written as integers
        if problem:
            raise self.fail(key, problem)
        if v < 0:
            raise self.fail(key, f"must not be negative, got {v}")
        if v < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {v}")
        return v

    def get_float(self, key: str, *, required: bool = True, positive: bool = True) -> Any:
        v = self.get(key, required)
        if v is None:
            return None
        if type_problem("number", v) or not math.isfinite(v):
            raise self.fail(key, f"must be a number, got {v!r}")
        if v < 0:
            raise self.fail(key, f"must not be negative, got {v}")
        if positive and v == 0:
            raise self.fail(key, "must be positive, got 0")
        return float(v)

    def get_bool(self, key: str, *, required: bool = True, default: bool = False) -> bool:
        v = self._typed(key, "bool", required)
        return default if v is None else bool(v)

    def get_str(self, key: str, *, required: bool = True) -> str:
        v = self._typed(key, "str", required)
        return "" if v is None else str(v)

    def get_int_list(self, key: str, *, required: bool = True) -> tuple[int, ...] | None:
        v = self.get(key, required)
        if v is None:
            return None
        if not isinstance(v, list) or any(type_problem("int", x) or x < 0 for x in v):
            raise self.fail(key, f"must be a list of non-negative integers, got {v!r}")
        return tuple(v)

    def sub(self, key: str, *, required: bool = True) -> FieldReader | None:
        v = self.get(key, required)
        if v is None:
            return None
        return FieldReader(v, self.where, f"{self._name(key)}.")

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            names = ", ".join(f"'{self._name(k)}'" for k in unknown)
            raise ValueError(f"{self.where}: unknown field(s) {names}")
