"""Loading hybrid models: Hugging Face checkpoint directories and built-in presets.

Owns `load_model` (directory with `config.json` + `*.safetensors`, single or sharded, with or
without `model.safetensors.index.json`; optional `tokenizer.json`), the architecture registry
(`MODEL_CLASSES`: `model_type` -> model class; anything else is refused naming the supported
ones), `save_model` (the inverse, used by tests and tools), building the built-in presets
(`configs/presets.py`) with their seeded random weights. Reading a checkpoint's files and
checking a state dict are `hycache.model.weights`'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from hycache.model.bamba import BambaForCausalLM
from hycache.model.configs import config_from_hf_dict
from hycache.model.configs.base import HybridConfig
from hycache.model.configs.presets import PRESET_SEEDS, PRESETS, preset_config
from hycache.model.granite_hybrid import GraniteHybridForCausalLM
from hycache.model.hybrid import HybridForCausalLM
from hycache.model.nemotron_h import NemotronHForCausalLM
from hycache.model.qwen3_next import (
    Qwen3NextForCausalLM,
    Qwen35ForCausalLM,
    Qwen35MoeForCausalLM,
)
from hycache.model.weights import load_checked, read_checkpoint, read_json_object

try:  # optional at import time; listed in the project dependencies
    from tokenizers import Tokenizer
except ImportError:  # pragma: no cover
    Tokenizer = None  # type: ignore[assignment,misc]

MODEL_CLASSES: dict[str, type[HybridForCausalLM]] = {
    cls.config_class.model_type: cls
    for cls in (
        BambaForCausalLM,
        NemotronHForCausalLM,
        GraniteHybridForCausalLM,
        Qwen3NextForCausalLM,
        Qwen35ForCausalLM,
        Qwen35MoeForCausalLM,
    )
}


# ---------------------------------------------------------------------------------- API
def load_config(path: str | Path) -> HybridConfig:
    """Read and validate `config.json` in a checkpoint directory (any supported model_type)."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} not found")
    return config_from_hf_dict(read_json_object(cfg_path))


def model_class(config: HybridConfig) -> type[HybridForCausalLM]:
    """The model class of `config`'s architecture."""
    return MODEL_CLASSES[config.model_type]


def load_model(
    path_or_preset: str,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[HybridForCausalLM, HybridConfig, Any | None]:
    """Load a hybrid model: (model, config, tokenizers.Tokenizer or None).

    `path_or_preset` is a preset name (`tiny`: random weights from a fixed seed, built in
    memory) or a directory holding `config.json` (a model_type of `MODEL_CLASSES`, or a
    multimodal "qwen3_5" / "qwen3_5_moe" checkpoint, whose text part is loaded) and
    `*.safetensors` (float32 / bfloat16 / float16 tensors, cast to `dtype`).
    """
    if path_or_preset in PRESETS and not Path(path_or_preset).is_dir():
        config = preset_config(path_or_preset)
        model = model_class(config).random(config, PRESET_SEEDS[path_or_preset], dtype, device)
        return model, config, None

    path = Path(path_or_preset)
    if not path.is_dir():
        raise FileNotFoundError(
            f"{path_or_preset!r} is neither a checkpoint directory nor a preset ({sorted(PRESETS)})"
        )
    config = load_config(path)
    cls = model_class(config)
    tensors = read_checkpoint(path)
    tensors = _rename_tensors(cls, tensors)

    model = cls.empty(config, dtype, device)
    optional: frozenset[str] = frozenset()
    if config.tie_word_embeddings:
        # A tied checkpoint may still carry a copy of the head; it is ignored.
        optional = frozenset({"lm_head.weight"})
        tensors.pop("lm_head.weight", None)
    load_checked(model, tensors, what=f"checkpoint {path}", optional=optional)

    tokenizer = None
    tok_path = path / "tokenizer.json"
    if tok_path.is_file():
        if Tokenizer is None:  # pragma: no cover
            raise ImportError("tokenizer.json found but the `tokenizers` package is missing")
        try:
            tokenizer = Tokenizer.from_file(str(tok_path))
        except Exception as exc:  # the tokenizers library raises a bare Exception
            raise ValueError(f"{tok_path}: not a readable tokenizer ({exc})") from None
    return model, config, tokenizer


def _rename_tensors(
    cls: type[HybridForCausalLM], tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Checkpoint tensors under the model's own names; unused ones (derived buffers such as
    `rotary_emb.inv_freq`, MTP heads) dropped."""
    out: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        name = cls.checkpoint_key(key)
        if name is None:
            continue
        if name in out:
            raise ValueError(f"tensor {key!r} duplicates another tensor's name {name!r}")
        out[name] = t
    return out


def save_model(
    model: HybridForCausalLM,
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    max_shard_tensors: int | None = None,
    write_index: bool = True,
) -> None:
    """Write `config.json` and safetensors (optionally sharded) that `load_model` reads back.

    Args:
        dtype: cast tensors to this dtype on disk (default: keep the model's).
        max_shard_tensors: when set, at most this many tensors per shard file.
        write_index: with sharding, also write `model.safetensors.index.json`.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2))
    state = {
        k: (v if dtype is None else v.to(dtype)).detach().cpu().contiguous()
        for k, v in model.state_dict().items()
    }
    if max_shard_tensors is None:
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    keys = list(state)
    shards = [keys[i : i + max_shard_tensors] for i in range(0, len(keys), max_shard_tensors)]
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: state[k] for k in shard}, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    if write_index:
        index = {"metadata": {}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
