"""Hardware and model presets for the simulator: :class:`GpuSpec` and the loaders of their files.

This module owns :class:`GpuSpec` (frozen, validated), the readers of the GPU and model preset
files, and the loaders :func:`load_gpu`, :func:`load_model_spec` and :func:`list_presets`.
Packaged presets live in ``hycache/sim/presets/{gpus,models}/*.json``; a user may pass a path
to their own file with the same fields instead of a preset name, or, for a model, a
checkpoint's ``config.json`` (read by the engine's parser: ``model_spec.model_spec_from_hf``).
:class:`~hycache.sim.model_spec.ModelSpec` itself is ``sim/model_spec.py``'s.

Validation is strict, by the one field validator (``hycache.model.configs.fields``): a
missing required field, an unknown field, a wrong type or a negative value raises
``ValueError`` naming the field (dotted, e.g. ``attention.num_kv_heads``) and the file it came
from.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from hycache.model.configs.fields import FieldReader
from hycache.sim.model_spec import (
    AttentionSpec,
    DrafterSpec,
    LayerCounts,
    MambaSpec,
    MlpSpec,
    ModelSpec,
    MoeSpec,
    ParamCounts,
    is_hf_config,
    model_spec_from_hf,
)
from hycache.sim.terms import TERM_NAMES, TERMS, CostTerms, Term, check_term

__all__ = [
    "PRESET_FIELDS",
    "GpuSpec",
    "gpu_from_dict",
    "list_presets",
    "load_gpu",
    "load_model_spec",
    "model_spec_from_dict",
]

_KINDS = ("gpus", "models")


# ---------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GpuSpec(CostTerms):
    """One accelerator: peak dense bf16 rate, HBM bandwidth and capacity.

    Its cost-model terms (:class:`~hycache.sim.terms.CostTerms`: efficiencies, overheads,
    factors) are optional defaults the cost model uses when its caller does not pass its
    own. A calibrated device profile (`hycache calibrate`) sets the fitted ones and records
    the model it was fitted on (`fitted_on`) and its residuals (`calibration`: the rest of
    its file).
    """

    name: str
    peak_flops: float  # FLOP/s, dense bf16 tensor-core rate (no sparsity)
    hbm_bandwidth: float  # bytes/s
    memory_bytes: int  # total device memory, as the driver reports it
    description: str = ""
    source: str = ""
    fitted_on: str = ""
    calibration: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


# a preset file's keys, in the order a profile writes them
PRESET_FIELDS: tuple[str, ...] = (
    "name", "description", "source", "peak_flops", "hbm_bandwidth", "memory_bytes", *TERM_NAMES,
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


def _term(r: FieldReader, t: Term) -> float | bool | None:
    """Term `t` of a preset file (absent or null: unset), checked against its range."""
    if r.data.get(t.name) is None:
        r.used.add(t.name)
        return None
    value: float | bool = (
        r.get_bool(t.name) if t.kind is bool
        else r.get_float(t.name, positive=t.bound != "nonnegative")
    )  # fmt: skip
    problem = check_term(t.name, value)
    if problem:
        raise r.fail(t.name, problem)
    return value


def _gpu_from_dict(data: Any, where: str) -> GpuSpec:
    r = FieldReader(data, where)
    spec = GpuSpec(
        name=r.get_str("name"),
        peak_flops=r.get_float("peak_flops"),
        hbm_bandwidth=r.get_float("hbm_bandwidth"),
        memory_bytes=r.get_int("memory_bytes", minimum=1),
        description=r.get_str("description", required=False),
        source=r.get_str("source", required=False),
        fitted_on=r.get_str("model", required=False),
        calibration=_calibration(r),
        **{t.name: _term(r, t) for t in TERMS},
    )
    r.finish()
    return spec


PROFILE_FIELDS = ("residuals", "held_out", "calibration")


def _calibration(r: FieldReader) -> dict[str, Any] | None:
    """A calibrated profile's `residuals` and `held_out` (lists of objects) and `calibration`
    (an object), kept as read; None for a plain preset."""
    out: dict[str, Any] = {}
    for key in PROFILE_FIELDS:
        v = r.get(key, required=False)
        if v is None:
            continue
        want = dict if key == "calibration" else list
        if not isinstance(v, want) or (want is list and not all(isinstance(x, dict) for x in v)):
            what = "an object" if want is dict else "a list of objects"
            raise r.fail(key, f"must be {what}")
        out[key] = v
    return out or None


S = TypeVar("S")


def _optional_section(r: FieldReader, key: str, read: Callable[[FieldReader], S]) -> S | None:
    """Section `key` of `r` as `read` builds and checks it (a field `read` does not ask for
    is an error), or None when it is absent or null."""
    sr = r.sub(key, required=False)
    if sr is None:
        return None
    out = read(sr)
    sr.finish()
    return out


def _section(r: FieldReader, key: str, read: Callable[[FieldReader], S]) -> S:
    """As `_optional_section`, for a section that must be there."""
    r.get(key, required=True)  # "is missing" when it is not
    out = _optional_section(r, key, read)
    assert out is not None
    return out


def _positive_ints(r: FieldReader, *keys: str) -> dict[str, int]:
    """The required positive integer fields `keys` of a section, read in that order."""
    return {k: r.get_int(k, minimum=1) for k in keys}


def _layers(lr: FieldReader) -> LayerCounts:
    return LayerCounts(
        attention=lr.get_int("attention"),
        mamba=lr.get_int("mamba"),
        mlp_only=lr.get_int("mlp_only", required=False) or 0,
        moe_only=lr.get_int("moe_only", required=False) or 0,
    )


def _attention(ar: FieldReader) -> AttentionSpec:
    attention = AttentionSpec(**_positive_ints(ar, "num_heads", "num_kv_heads", "head_dim"))
    if attention.num_heads % attention.num_kv_heads:
        raise ar.fail("num_kv_heads", "must divide attention.num_heads")
    return attention


def _mamba(mr: FieldReader) -> MambaSpec:
    mamba = MambaSpec(
        **_positive_ints(mr, "num_heads", "head_dim", "d_state", "n_groups", "d_conv", "expand"),
        chunk_size=mr.get_int("chunk_size", required=False, minimum=1) or 256,
    )
    if mamba.num_heads % mamba.n_groups:
        raise mr.fail("n_groups", "must divide mamba.num_heads")
    return mamba


def _mlp(pr: FieldReader) -> MlpSpec:
    return MlpSpec(
        intermediate_size=pr.get_int("intermediate_size", minimum=1),
        gated=pr.get_bool("gated"),
        num_blocks=pr.get_int("num_blocks"),
    )


def _moe(er: FieldReader) -> MoeSpec:
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
    return moe


def _drafter(dr: FieldReader) -> DrafterSpec:
    return DrafterSpec(
        num_layers=dr.get_int("num_layers", required=False, minimum=1) or 1,
        intermediate_size=dr.get_int("intermediate_size", required=False, minimum=1),
        params=dr.get_int("params", required=False),
    )


def _params(pc: FieldReader) -> ParamCounts:
    params = ParamCounts(
        total=pc.get_int("total", minimum=1), active=pc.get_int("active", minimum=1)
    )
    if params.active > params.total:
        raise pc.fail("active", "must not exceed params.total")
    return params


def _attention_indices(r: FieldReader, layers: LayerCounts) -> tuple[int, ...] | None:
    indices = r.get_int_list("attention_layer_indices", required=False)
    if indices is None:
        return None
    if len(indices) != layers.attention:
        raise r.fail(
            "attention_layer_indices",
            f"lists {len(indices)} layers but layers.attention is {layers.attention}",
        )
    num_layers = layers.total
    if any(i >= num_layers for i in indices):
        raise r.fail("attention_layer_indices", f"has an index >= num_layers ({num_layers})")
    return indices


def _model_from_dict(data: Any, where: str) -> ModelSpec:
    """A model preset file (counts, not a layer layout), one section reader after another."""
    r = FieldReader(data, where)
    name = r.get_str("name")
    hidden = r.get_int("hidden_size", minimum=1)
    vocab = r.get_int("vocab_size", minimum=1)
    num_layers = r.get_int("num_layers", minimum=1)
    layers = _section(r, "layers", _layers)
    if layers.total != num_layers:
        raise r.fail("layers", f"counts sum to {layers.total} but num_layers is {num_layers}")
    attention, mamba = _section(r, "attention", _attention), _section(r, "mamba", _mamba)
    mlp, moe = _section(r, "mlp", _mlp), _optional_section(r, "moe", _moe)
    drafter = _optional_section(r, "drafter", _drafter) or DrafterSpec()
    params = _optional_section(r, "params", _params)
    indices = _attention_indices(r, layers)
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
        # non-blocking, so a FIFO (or a device) is refused instead of waiting for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"{where}: cannot read file: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
            raise ValueError(f"{where}: not a regular file (a pipe, socket or folder)")
        try:
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
    a preset JSON, or a checkpoint's Hugging Face ``config.json``
    (``model_spec.model_spec_from_hf``)."""

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
