"""Hardware and model descriptions for the simulator, and the loaders for their JSON files.

This module owns :class:`GpuSpec` and :class:`ModelSpec` (frozen, validated), the derived
quantities the cost model needs (parameter counts, KV bytes per token, SSM state bytes, the
drafter's size), and the loaders :func:`load_gpu`, :func:`load_model_spec` and
:func:`list_presets`. Packaged presets live in ``hycache/sim/presets/{gpus,models}/*.json``;
a user may pass a path to their own file with the same fields instead of a preset name.

Validation is strict: a missing required field, an unknown field, a wrong type or a negative
value raises ``ValueError`` naming the field (dotted, e.g. ``attention.num_kv_heads``) and the
file it came from.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "AttentionSpec",
    "DrafterSpec",
    "GpuSpec",
    "LayerCounts",
    "MambaSpec",
    "MlpSpec",
    "ModelSpec",
    "MoeSpec",
    "ParamCounts",
    "gpu_from_dict",
    "list_presets",
    "load_gpu",
    "load_model_spec",
    "model_spec_from_dict",
]

_KINDS = ("gpus", "models")


# ---------------------------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: peak dense bf16 rate, HBM bandwidth and capacity.

    The efficiencies and the per-step overhead are optional defaults the cost model uses when
    its caller does not pass its own.
    """

    name: str
    peak_flops: float  # FLOP/s, dense bf16 tensor-core rate (no sparsity)
    hbm_bandwidth: float  # bytes/s
    memory_bytes: int  # total device memory, as the driver reports it
    compute_efficiency: float | None = None
    bandwidth_efficiency: float | None = None
    step_overhead_s: float | None = None
    description: str = ""
    source: str = ""
    # a calibrated device profile (`hycache calibrate`) also fits these and records the
    # model it was fitted on and its residuals (`calibration`: the rest of its file)
    draft_pass_overhead_s: float | None = None
    seq_overhead_s: float | None = None
    kv_bytes_factor: float | None = None
    phase_overlap: bool | None = None
    padded_decode_attention: bool | None = None
    # achieved / peak bandwidth of a block copy and of an SSM state copy (read, write, or a
    # checkpoint): one tensor copy each, near copy bandwidth; unset, `bandwidth_efficiency`
    copy_efficiency: float | None = None
    state_copy_efficiency: float | None = None
    fitted_on: str = ""
    calibration: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba2 mixer: ``num_heads * head_dim`` is the inner width (d_inner)."""

    num_heads: int
    head_dim: int
    d_state: int
    n_groups: int
    d_conv: int
    expand: int
    chunk_size: int = 256

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv1d: x, B and C."""
        return self.d_inner + 2 * self.n_groups * self.d_state


@dataclass(frozen=True)
class MlpSpec:
    """Dense feed-forward blocks. ``num_blocks`` counts every dense MLP in the stack, wherever
    it sits (Bamba: one per decoder layer; Nemotron-H: the MLP-only layers)."""

    intermediate_size: int
    gated: bool
    num_blocks: int


@dataclass(frozen=True)
class MoeSpec:
    """Mixture-of-experts blocks (optional)."""

    num_blocks: int
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_expert_intermediate_size: int = 0
    gated: bool = True


@dataclass(frozen=True)
class LayerCounts:
    """Layers by mixer kind. ``mlp_only`` and ``moe_only`` are layers without a mixer."""

    attention: int
    mamba: int
    mlp_only: int = 0
    moe_only: int = 0

    @property
    def total(self) -> int:
        return self.attention + self.mamba + self.mlp_only + self.moe_only


@dataclass(frozen=True)
class ParamCounts:
    total: int
    active: int


@dataclass(frozen=True)
class DrafterSpec:
    """EAGLE/MTP-style drafter: ``num_layers`` decoder layers (attention with the target's
    geometry + a dense MLP) plus an ``fc`` that fuses the target hidden state with the token
    embedding. It shares the target's embedding and LM head."""

    num_layers: int = 1
    intermediate_size: int | None = None  # None: the target's dense MLP width
    params: int | None = None  # None: derived


@dataclass(frozen=True)
class ModelSpec:
    """A hybrid attention + Mamba2 model, in the quantities the cost model needs."""

    name: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    layers: LayerCounts
    attention: AttentionSpec
    mamba: MambaSpec
    mlp: MlpSpec
    dtype_bytes: int = 2
    state_dtype_bytes: int = 4
    tie_word_embeddings: bool = False
    moe: MoeSpec | None = None
    drafter: DrafterSpec = DrafterSpec()
    params: ParamCounts | None = None  # None: derived from the architecture
    attention_layer_indices: tuple[int, ...] | None = None
    description: str = ""
    source: str = ""

    # --- parameter counts (derived) ---------------------------------------------------------

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters read to produce logits (the embedding itself when tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def attention_layer_params(self) -> int:
        a, h = self.attention, self.hidden_size
        q = h * a.num_heads * a.head_dim
        kv = 2 * h * a.num_kv_heads * a.head_dim
        o = a.num_heads * a.head_dim * h
        return q + kv + o + h  # + pre-norm

    @property
    def mamba_layer_params(self) -> int:
        m, h = self.mamba, self.hidden_size
        in_proj = h * (2 * m.d_inner + 2 * m.n_groups * m.d_state + m.num_heads)
        conv = m.conv_dim * m.d_conv + m.conv_dim
        per_head = 3 * m.num_heads  # dt_bias, A_log, D
        gated_norm = m.d_inner
        out_proj = m.d_inner * h
        return in_proj + conv + per_head + gated_norm + out_proj + h  # + pre-norm

    def _mlp_params(self, intermediate: int, gated: bool) -> int:
        return (3 if gated else 2) * self.hidden_size * intermediate

    @property
    def mlp_block_params(self) -> int:
        return self._mlp_params(self.mlp.intermediate_size, self.mlp.gated) + self.hidden_size

    def _moe_block_params(self, active: bool) -> int:
        moe = self.moe
        if moe is None:
            return 0
        experts = moe.experts_per_token if active else moe.num_experts
        routed = experts * self._mlp_params(moe.expert_intermediate_size, moe.gated)
        shared = self._mlp_params(moe.shared_expert_intermediate_size, moe.gated)
        router = self.hidden_size * moe.num_experts
        return routed + shared + router + self.hidden_size

    def _derived_params(self, active: bool) -> int:
        body = (
            self.layers.attention * self.attention_layer_params
            + self.layers.mamba * self.mamba_layer_params
            + self.mlp.num_blocks * self.mlp_block_params
            + (self.moe.num_blocks * self._moe_block_params(active) if self.moe else 0)
            + self.hidden_size  # final norm
        )
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return body + self.embedding_params + head

    @property
    def derived_params(self) -> ParamCounts:
        return ParamCounts(total=self._derived_params(False), active=self._derived_params(True))

    @property
    def total_params(self) -> int:
        return self.params.total if self.params else self.derived_params.total

    @property
    def active_params(self) -> int:
        return self.params.active if self.params else self.derived_params.active

    @property
    def _embedding_and_head(self) -> int:
        return self.embedding_params + (0 if self.tie_word_embeddings else self.lm_head_params)

    @property
    def body_active_params(self) -> int:
        """Active parameters each token multiplies through, excluding embedding and LM head."""
        return max(self.active_params - self._embedding_and_head, 0)

    @property
    def body_total_params(self) -> int:
        return max(self.total_params - self._embedding_and_head, 0)

    @property
    def moe_expert_params(self) -> int:
        """Routed-expert parameters of the whole stack (0 for dense models)."""
        moe = self.moe
        if moe is None:
            return 0
        per = self._mlp_params(moe.expert_intermediate_size, moe.gated)
        return moe.num_blocks * moe.num_experts * per

    @property
    def weight_bytes(self) -> int:
        """Bytes of the target's weights resident on the GPU (embedding and head included)."""
        return self.total_params * self.dtype_bytes

    # --- drafter ----------------------------------------------------------------------------

    @property
    def drafter_layer_params(self) -> int:
        """Parameters of the drafter's own layers (not the shared embedding / LM head)."""
        if self.drafter.params is not None:
            return self.drafter.params
        inter = self.drafter.intermediate_size
        if inter is None:
            inter = self.mlp.intermediate_size
        h = self.hidden_size
        per_layer = self.attention_layer_params + self._mlp_params(inter, self.mlp.gated) + h
        fc = 2 * h * h
        return self.drafter.num_layers * per_layer + fc + h

    @property
    def drafter_weight_bytes(self) -> int:
        return self.drafter_layer_params * self.dtype_bytes

    # --- cache geometry ---------------------------------------------------------------------

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        a = self.attention
        return 2 * a.num_kv_heads * a.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across all of the target's attention layers."""
        return self.layers.attention * self.kv_bytes_per_token_per_layer

    @property
    def ssm_state_bytes_per_layer(self) -> int:
        """One Mamba layer's recurrent state: SSM state (state dtype) + conv window (dtype)."""
        m = self.mamba
        ssm = m.num_heads * m.head_dim * m.d_state * self.state_dtype_bytes
        conv = (m.d_conv - 1) * m.conv_dim * self.dtype_bytes
        return ssm + conv

    @property
    def ssm_state_bytes(self) -> int:
        """One request's state across all Mamba layers (one SSM "block")."""
        return self.layers.mamba * self.ssm_state_bytes_per_layer


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


class _Reader:
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

    def _err(self, key: str, msg: str) -> ValueError:
        return ValueError(f"{self.where}: field '{self._name(key)}' {msg}")

    def _get(self, key: str, required: bool) -> Any:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if required:
                raise self._err(key, "is missing")
            return None
        return self.data[key]

    def get_int(self, key: str, *, required: bool = True, minimum: int = 0) -> Any:
        v = self._get(key, required)
        if v is None:
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._err(key, f"must be an integer, got {v!r}")
        if v < 0:
            raise self._err(key, f"must not be negative, got {v}")
        if v < minimum:
            raise self._err(key, f"must be >= {minimum}, got {v}")
        return v

    def get_float(self, key: str, *, required: bool = True, positive: bool = True) -> Any:
        v = self._get(key, required)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self._err(key, f"must be a number, got {v!r}")
        if v < 0:
            raise self._err(key, f"must not be negative, got {v}")
        if positive and v == 0:
            raise self._err(key, "must be positive, got 0")
        return float(v)

    def get_bool(self, key: str, *, required: bool = True, default: bool = False) -> bool:
        v = self._get(key, required)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._err(key, f"must be true or false, got {v!r}")
        return v

    def get_str(self, key: str, *, required: bool = True) -> str:
        v = self._get(key, required)
        if v is None:
            return ""
        if not isinstance(v, str):
            raise self._err(key, f"must be a string, got {v!r}")
        return v

    def get_int_list(self, key: str, *, required: bool = True) -> tuple[int, ...] | None:
        v = self._get(key, required)
        if v is None:
            return None
        if not isinstance(v, list) or any(
            isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v
        ):
            raise self._err(key, f"must be a list of non-negative integers, got {v!r}")
        return tuple(v)

    def sub(self, key: str, *, required: bool = True) -> _Reader | None:
        v = self._get(key, required)
        if v is None:
            return None
        return _Reader(v, self.where, f"{self._name(key)}.")

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            names = ", ".join(f"'{self._name(k)}'" for k in unknown)
            raise ValueError(f"{self.where}: unknown field(s) {names}")

    def fail(self, key: str, msg: str) -> ValueError:
        return self._err(key, msg)


def _optional_fraction(r: _Reader, key: str) -> float | None:
    v: float | None = r.get_float(key, required=False)
    if v is not None and v > 1.0:
        raise r.fail(key, f"must be in (0, 1], got {v}")
    return v


def _optional_bool(r: _Reader, key: str) -> bool | None:
    if r.data.get(key) is None:
        r.used.add(key)
        return None
    return r.get_bool(key)


def _gpu_from_dict(data: Any, where: str) -> GpuSpec:
    r = _Reader(data, where)
    spec = GpuSpec(
        name=r.get_str("name"),
        peak_flops=r.get_float("peak_flops"),
        hbm_bandwidth=r.get_float("hbm_bandwidth"),
        memory_bytes=r.get_int("memory_bytes", minimum=1),
        compute_efficiency=_optional_fraction(r, "compute_efficiency"),
        bandwidth_efficiency=_optional_fraction(r, "bandwidth_efficiency"),
        step_overhead_s=r.get_float("step_overhead_s", required=False, positive=False),
        description=r.get_str("description", required=False),
        source=r.get_str("source", required=False),
        draft_pass_overhead_s=r.get_float("draft_pass_overhead_s", required=False, positive=False),
        seq_overhead_s=r.get_float("seq_overhead_s", required=False, positive=False),
        kv_bytes_factor=r.get_float("kv_bytes_factor", required=False),
        phase_overlap=_optional_bool(r, "phase_overlap"),
        padded_decode_attention=_optional_bool(r, "padded_decode_attention"),
        copy_efficiency=_optional_fraction(r, "copy_efficiency"),
        state_copy_efficiency=_optional_fraction(r, "state_copy_efficiency"),
        fitted_on=r.get_str("model", required=False),
        calibration=_calibration(r),
    )
    r.finish()
    return spec


PROFILE_FIELDS = ("residuals", "held_out", "calibration")


def _calibration(r: _Reader) -> dict[str, Any] | None:
    """A calibrated profile's `residuals` and `held_out` (lists of objects) and `calibration`
    (an object), kept as read; None for a plain preset."""
    out: dict[str, Any] = {}
    for key in PROFILE_FIELDS:
        v = r._get(key, required=False)
        if v is None:
            continue
        want = dict if key == "calibration" else list
        if not isinstance(v, want) or (want is list and not all(isinstance(x, dict) for x in v)):
            what = "an object" if want is dict else "a list of objects"
            raise r.fail(key, f"must be {what}")
        out[key] = v
    return out or None


def _model_from_dict(data: Any, where: str) -> ModelSpec:
    r = _Reader(data, where)
    name = r.get_str("name")
    hidden = r.get_int("hidden_size", minimum=1)
    vocab = r.get_int("vocab_size", minimum=1)
    num_layers = r.get_int("num_layers", minimum=1)

    lr = r.sub("layers")
    assert lr is not None
    layers = LayerCounts(
        attention=lr.get_int("attention"),
        mamba=lr.get_int("mamba"),
        mlp_only=lr.get_int("mlp_only", required=False) or 0,
        moe_only=lr.get_int("moe_only", required=False) or 0,
    )
    lr.finish()
    if layers.total != num_layers:
        raise r.fail(
            "layers",
            f"counts sum to {layers.total} but num_layers is {num_layers}",
        )

    ar = r.sub("attention")
    assert ar is not None
    attention = AttentionSpec(
        num_heads=ar.get_int("num_heads", minimum=1),
        num_kv_heads=ar.get_int("num_kv_heads", minimum=1),
        head_dim=ar.get_int("head_dim", minimum=1),
    )
    if attention.num_heads % attention.num_kv_heads:
        raise ar.fail("num_kv_heads", "must divide attention.num_heads")
    ar.finish()

    mr = r.sub("mamba")
    assert mr is not None
    mamba = MambaSpec(
        num_heads=mr.get_int("num_heads", minimum=1),
        head_dim=mr.get_int("head_dim", minimum=1),
        d_state=mr.get_int("d_state", minimum=1),
        n_groups=mr.get_int("n_groups", minimum=1),
        d_conv=mr.get_int("d_conv", minimum=1),
        expand=mr.get_int("expand", minimum=1),
        chunk_size=mr.get_int("chunk_size", required=False, minimum=1) or 256,
    )
    if mamba.num_heads % mamba.n_groups:
        raise mr.fail("n_groups", "must divide mamba.num_heads")
    mr.finish()

    pr = r.sub("mlp")
    assert pr is not None
    mlp = MlpSpec(
        intermediate_size=pr.get_int("intermediate_size", minimum=1),
        gated=pr.get_bool("gated"),
        num_blocks=pr.get_int("num_blocks"),
    )
    pr.finish()

    moe: MoeSpec | None = None
    er = r.sub("moe", required=False)
    if er is not None:
        moe = MoeSpec(
            num_blocks=er.get_int("num_blocks"),
            num_experts=er.get_int("num_experts", minimum=1),
            experts_per_token=er.get_int("experts_per_token", minimum=1),
            expert_intermediate_size=er.get_int("expert_intermediate_size", minimum=1),
            shared_expert_intermediate_size=(
                er.get_int("shared_expert_intermediate_size", required=False) or 0
            ),
            gated=er.get_bool("gated", required=False, default=True),
        )
        if moe.experts_per_token > moe.num_experts:
            raise er.fail("experts_per_token", "must not exceed moe.num_experts")
        er.finish()

    drafter = DrafterSpec()
    dr = r.sub("drafter", required=False)
    if dr is not None:
        drafter = DrafterSpec(
            num_layers=dr.get_int("num_layers", required=False, minimum=1) or 1,
            intermediate_size=dr.get_int("intermediate_size", required=False, minimum=1),
            params=dr.get_int("params", required=False),
        )
        dr.finish()

    params: ParamCounts | None = None
    pc = r.sub("params", required=False)
    if pc is not None:
        params = ParamCounts(
            total=pc.get_int("total", minimum=1), active=pc.get_int("active", minimum=1)
        )
        if params.active > params.total:
            raise pc.fail("active", "must not exceed params.total")
        pc.finish()

    indices = r.get_int_list("attention_layer_indices", required=False)
    if indices is not None:
        if len(indices) != layers.attention:
            raise r.fail(
                "attention_layer_indices",
                f"lists {len(indices)} layers but layers.attention is {layers.attention}",
            )
        if any(i >= num_layers for i in indices):
            raise r.fail("attention_layer_indices", f"has an index >= num_layers ({num_layers})")

    spec = ModelSpec(
        name=name,
        hidden_size=hidden,
        vocab_size=vocab,
        num_layers=num_layers,
        layers=layers,
        attention=attention,
        mamba=mamba,
        mlp=mlp,
        dtype_bytes=r.get_int("dtype_bytes", minimum=1),
        state_dtype_bytes=r.get_int("state_dtype_bytes", minimum=1),
        tie_word_embeddings=r.get_bool("tie_word_embeddings", required=False),
        moe=moe,
        drafter=drafter,
        params=params,
        attention_layer_indices=indices,
        description=r.get_str("description", required=False),
        source=r.get_str("source", required=False),
    )
    r.finish()
    return spec


# ---------------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------------


def _preset_dir(kind: str) -> Any:
    return resources.files("hycache.sim").joinpath("presets", kind)


def _preset_names(kind: str) -> list[str]:
    d = _preset_dir(kind)
    if not d.is_dir():
        return []
    return sorted(p.name[: -len(".json")] for p in d.iterdir() if p.name.endswith(".json"))


def list_presets() -> dict[str, list[str]]:
    """Names of the packaged presets: ``{"gpus": [...], "models": [...]}``."""
    return {kind: _preset_names(kind) for kind in _KINDS}


def _looks_like_path(name_or_path: str | Path) -> bool:
    if isinstance(name_or_path, Path):
        return True
    s = str(name_or_path)
    return s.endswith(".json") or "/" in s or "\\" in s or Path(s).is_file()


MAX_CONFIG_BYTES = 4 << 20  # a model's config.json is a few KiB
MAX_JSON_DEPTH = 32  # config files nest a few levels


def _json_depth(doc: Any) -> int:
    """How deeply `doc` nests (a scalar: 0), without recursion."""
    depth, level = 0, [(doc, 1)]
    while level:
        value, d = level.pop()
        if isinstance(value, dict | list):
            depth = max(depth, d)
            items = value.values() if isinstance(value, dict) else value
            level.extend((v, d + 1) for v in items)
    return depth


def read_config_file(path: Path) -> Any:
    """A JSON config file, parsed, read no further than `MAX_CONFIG_BYTES` (so `/dev/zero` or
    a huge file fails at once) and nested at most `MAX_JSON_DEPTH` deep; ValueError, on one
    line naming the file, otherwise."""
    where = str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{where}: cannot read file: {exc.strerror or exc}") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"{where}: over {MAX_CONFIG_BYTES >> 20} MiB; not a config file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not UTF-8 text") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: invalid JSON: {exc}") from exc
    except RecursionError:
        data = None  # nested beyond the parser's own limit
    if data is None or _json_depth(data) > MAX_JSON_DEPTH:
        raise ValueError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return data


def _load(kind: str, name_or_path: str | Path, build: Callable[[Any, str], Any]) -> Any:
    if _looks_like_path(name_or_path):
        path = Path(name_or_path)
        return build(read_config_file(path), str(path))
    name = str(name_or_path).lower()
    names = _preset_names(kind)
    if name not in names:
        label = "GPU" if kind == "gpus" else "model"
        raise ValueError(
            f"unknown {label} preset {name_or_path!r}; available: {', '.join(names)}"
            " (or pass a path to a JSON file)"
        )
    res = _preset_dir(kind).joinpath(f"{name}.json")
    where = f"preset {kind}/{name}.json"
    text = res.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: invalid JSON: {exc}") from exc
    return build(data, where)


def load_gpu(name_or_path: str | Path) -> GpuSpec:
    """A packaged GPU preset by name (``h100``, ``h200``, ``b200``...) or a JSON file path."""
    spec: GpuSpec = _load("gpus", name_or_path, _gpu_from_dict)
    return spec


def load_model_spec(name_or_path: str | Path) -> ModelSpec:
    """A packaged model preset by name (``bamba-9b``, ``nemotron-h-8b``, ``tiny``...) or a path:
    a preset JSON, or a checkpoint's Hugging Face ``config.json`` (see ``hf_presets``)."""
    from hycache.sim.hf_presets import is_hf_config, model_spec_from_hf

    def build(data: Any, where: str) -> ModelSpec:
        if is_hf_config(data):
            default = Path(str(name_or_path)).stem if _looks_like_path(name_or_path) else None
            name = str(data.get("name") or default or name_or_path)
            return model_spec_from_hf(data, name, where)
        return _model_from_dict(data, where)

    spec: ModelSpec = _load("models", name_or_path, build)
    return spec


def gpu_from_dict(data: Mapping[str, Any], where: str = "<dict>") -> GpuSpec:
    """Build a :class:`GpuSpec` from an already-parsed mapping (same rules as the files)."""
    return _gpu_from_dict(dict(data), where)


def model_spec_from_dict(data: Mapping[str, Any], where: str = "<dict>") -> ModelSpec:
    """Build a :class:`ModelSpec` from an already-parsed mapping (same rules as the files)."""
    return _model_from_dict(dict(data), where)
