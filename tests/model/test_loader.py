"""Checkpoint loading: HF directories (single / sharded, float32 / bf16 / fp16), strict
tensor checking, config parsing, tokenizer, and the `tiny` preset."""

from __future__ import annotations

import json
import math
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from hycache.model.bamba import BambaForCausalLM
from hycache.model.configs.bamba import BambaConfig
from hycache.model.configs.presets import preset_config
from hycache.model.loader import load_model, save_model

from .utils import full_hidden, small_config

transformers = pytest.importorskip("transformers")

HF_KW: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "attn_layer_indices": [1],
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "mamba_n_groups": 2,
    "mamba_d_state": 8,
    "mamba_chunk_size": 8,
}
TOKENS = [5, 9, 2, 33, 17, 8, 60, 1, 4, 4, 12]


def _save_hf(path: Path, dtype: torch.dtype = torch.float32, **save_kw: Any) -> Any:
    torch.manual_seed(0)
    hf = transformers.BambaForCausalLM(transformers.BambaConfig(**HF_KW)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.to(dtype).save_pretrained(path, **save_kw)
    return hf


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hf")
    _save_hf(path)
    return path


@pytest.fixture(scope="module")
def reference_logits(hf_dir: Path) -> torch.Tensor:
    model, _, _ = load_model(str(hf_dir))
    return model.compute_logits(full_hidden(model, TOKENS))


def _copy_with_tensors(src: Path, dst: Path, edit: Any) -> Path:
    """Copy a single-file checkpoint, passing its tensors through `edit(dict)`."""
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def _logits(path: Path, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    model, _, _ = load_model(str(path), dtype=dtype)
    return model.compute_logits(full_hidden(model, TOKENS))


# ------------------------------------------------------------------------------ errors
def test_missing_tensor(hf_dir: Path, tmp_path: Path) -> None:
    bad = _copy_with_tensors(hf_dir, tmp_path / "c", lambda t: t.pop("model.layers.2.mamba.A_log"))
    with pytest.raises(ValueError, match=r"missing tensors.*model\.layers\.2\.mamba\.A_log"):
        load_model(str(bad))


def test_unexpected_tensor(hf_dir: Path, tmp_path: Path) -> None:
    def add(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.0.mamba.extra_weight"] = torch.zeros(3)

    bad = _copy_with_tensors(hf_dir, tmp_path / "c", add)
    with pytest.raises(ValueError, match=r"unexpected tensors.*extra_weight"):
        load_model(str(bad))


def test_shape_mismatch(hf_dir: Path, tmp_path: Path) -> None:
    def reshape(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(8, 32)

    bad = _copy_with_tensors(hf_dir, tmp_path / "c", reshape)
    with pytest.raises(ValueError, match=r"shape mismatch.*self_attn\.k_proj\.weight.*\(8, 32\)"):
        load_model(str(bad))


def test_wrong_model_type(hf_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "c"
    shutil.copytree(hf_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "llama"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="model_type"):
        load_model(str(bad))


@pytest.mark.parametrize("model_type", ["falcon_h1", "llama", None])
def test_unsupported_model_type_names_it_and_the_supported_ones(
    hf_dir: Path, tmp_path: Path, model_type: str | None
) -> None:
    bad = tmp_path / "c"
    shutil.copytree(hf_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = model_type
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as err:
        load_model(str(bad))
    msg = str(err.value)
    assert repr(model_type) in msg and "not supported" in msg
    supported = ("bamba", "granitemoehybrid", "nemotron_h", "qwen3_next", "qwen3_5", "qwen3_5_moe")
    assert all(name in msg for name in supported)


def test_missing_config_and_weights(hf_dir: Path, tmp_path: Path) -> None:
    no_cfg = tmp_path / "a"
    no_cfg.mkdir()
    shutil.copy(hf_dir / "model.safetensors", no_cfg / "model.safetensors")
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(str(no_cfg))
    no_weights = tmp_path / "b"
    no_weights.mkdir()
    shutil.copy(hf_dir / "config.json", no_weights / "config.json")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(str(no_weights))
    with pytest.raises(FileNotFoundError, match="neither"):
        load_model(str(tmp_path / "does-not-exist"))


def test_missing_config_field(hf_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "c"
    shutil.copytree(hf_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["mamba_d_state"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="mamba_d_state"):
        load_model(str(bad))


# ------------------------------------------------------------------------------ formats
def test_sharded_with_and_without_index(tmp_path: Path, reference_logits: torch.Tensor) -> None:
    path = tmp_path / "sharded"
    _save_hf(path, max_shard_size="20KB")
    shards = sorted(path.glob("*.safetensors"))
    assert len(shards) > 1 and (path / "model.safetensors.index.json").is_file()
    torch.testing.assert_close(_logits(path), reference_logits, rtol=0, atol=0)
    (path / "model.safetensors.index.json").unlink()
    torch.testing.assert_close(_logits(path), reference_logits, rtol=0, atol=0)


def test_index_naming_absent_shard(tmp_path: Path) -> None:
    path = tmp_path / "sharded"
    _save_hf(path, max_shard_size="20KB")
    sorted(path.glob("*.safetensors"))[-1].unlink()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(str(path))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoint(tmp_path: Path, dtype: torch.dtype) -> None:
    hf = _save_hf(tmp_path, dtype)
    assert next(iter(load_file(str(tmp_path / "model.safetensors")).values())).dtype == dtype
    model, _, _ = load_model(str(tmp_path))  # cast to float32
    assert model.dtype == torch.float32
    want = hf.state_dict()["model.layers.0.mamba.in_proj.weight"].float()
    got = model.state_dict()["model.layers.0.mamba.in_proj.weight"]
    assert torch.equal(got, want)
    half, _, _ = load_model(str(tmp_path), dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    logits = half.compute_logits(full_hidden(half, TOKENS))
    assert torch.isfinite(logits).all()


def test_tied_checkpoint_ignores_stored_head(tmp_path: Path) -> None:
    cfg = small_config(tie_word_embeddings=True)
    model = BambaForCausalLM.random(cfg, seed=4)
    save_model(model, tmp_path / "m")
    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert "lm_head.weight" not in tensors
    tensors["lm_head.weight"] = torch.zeros(cfg.vocab_size, cfg.hidden_size)
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    loaded, _, _ = load_model(str(tmp_path / "m"))
    assert loaded.lm_head is None
    ref = model.compute_logits(full_hidden(model, TOKENS))
    torch.testing.assert_close(
        loaded.compute_logits(full_hidden(loaded, TOKENS)), ref, rtol=0, atol=0
    )


@pytest.mark.parametrize("shard", [None, 7])
def test_save_model_round_trip(tmp_path: Path, shard: int | None) -> None:
    model = BambaForCausalLM.random(small_config(), seed=5)
    save_model(model, tmp_path, max_shard_tensors=shard)
    loaded, config, _ = load_model(str(tmp_path))
    assert config == model.config
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_tokenizer_json_is_loaded(hf_dir: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = tmp_path / "with-tok"
    shutil.copytree(hf_dir, path)
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    _, _, loaded = load_model(str(path))
    assert loaded is not None
    assert loaded.encode("hello world").ids == [1, 2]


# ------------------------------------------------------------------------------ config
def test_config_from_transformers_dict_roundtrip() -> None:
    hf_cfg = transformers.BambaConfig(**HF_KW)
    cfg = BambaConfig.from_hf_dict(hf_cfg.to_dict())
    assert cfg.head_dim == 32 // 4
    assert cfg.rotary_dim == 4 and cfg.partial_rotary_factor == 0.5
    assert cfg.rope_theta == 10000.0
    assert cfg.attn_layer_indices == (1,) and cfg.mamba_layer_indices == (0, 2)
    assert cfg.time_step_limit == (0.0, math.inf)
    assert BambaConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


def test_config_legacy_rope_layouts() -> None:
    base = transformers.BambaConfig(**HF_KW).to_dict()
    del base["rope_parameters"]
    legacy = {**base, "rope_theta": 500.0, "partial_rotary_factor": 1.0}
    cfg = BambaConfig.from_hf_dict(legacy)
    assert (cfg.rope_theta, cfg.partial_rotary_factor) == (500.0, 1.0)
    scaling = {**base, "rope_scaling": {"rope_type": "default", "rope_theta": 7.0}}
    assert BambaConfig.from_hf_dict(scaling).rope_theta == 7.0
    assert BambaConfig.from_hf_dict(base).partial_rotary_factor == 0.5  # Bamba's default
    with pytest.raises(ValueError, match="rope_type"):
        BambaConfig.from_hf_dict({**base, "rope_parameters": {"rope_type": "yarn"}})


def test_config_derived_and_invalid_fields() -> None:
    d = transformers.BambaConfig(**HF_KW).to_dict()
    cfg = BambaConfig.from_hf_dict(
        {
            **d,
            "mamba_d_head": "auto",
            "head_dim": 16,
            "time_step_limit": [0.0, {"__float__": "Infinity"}],
        }
    )
    assert cfg.mamba_d_head == 16 and cfg.head_dim == 16
    assert cfg.time_step_limit[1] == math.inf
    with pytest.raises(ValueError, match="model_type"):
        BambaConfig.from_hf_dict({**d, "model_type": "mamba2"})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        BambaConfig.from_hf_dict({**d, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="attn_layer_indices"):
        BambaConfig.from_hf_dict({**d, "attn_layer_indices": [7]})


# ------------------------------------------------------------------------------ presets
def test_tiny_preset_is_deterministic() -> None:
    a, cfg, tok = load_model("tiny")
    b, _, _ = load_model("tiny")
    assert tok is None and cfg == preset_config("tiny")
    assert cfg.vocab_size == 512 and cfg.hidden_size == 256
    assert 1 <= len(cfg.attn_layer_indices) <= 2
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    c, _, _ = load_model("tiny", dtype=torch.float64)
    assert c.dtype == torch.float64
    assert torch.equal(
        c.state_dict()["model.embed_tokens.weight"].float(),
        a.state_dict()["model.embed_tokens.weight"],
    )


@pytest.mark.parametrize("escape", ["../outside.safetensors", "/etc/passwd"])
def test_index_entries_may_not_leave_the_checkpoint(tmp_path: Path, escape: str) -> None:
    import json

    path = tmp_path / "sharded"
    _save_hf(path, max_shard_size="20KB")
    index = path / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    first = next(iter(doc["weight_map"]))
    doc["weight_map"][first] = escape
    index.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="outside the checkpoint"):
        load_model(str(path))


@pytest.mark.parametrize("damage", ["config-list", "garbage-weights", "garbage-tokenizer"])
def test_a_damaged_checkpoint_is_a_one_line_error_naming_the_file(
    tmp_path: Path, damage: str
) -> None:
    """These used to escape as tracebacks (AttributeError, SafetensorError, Exception)."""
    from hycache.model.bamba import BambaForCausalLM

    save_model(BambaForCausalLM.random(preset_config("tiny"), seed=0), tmp_path)
    name = {"config-list": "config.json", "garbage-weights": "model.safetensors"}.get(
        damage, "tokenizer.json"
    )
    (tmp_path / name).write_text("[1, 2]" if damage == "config-list" else "{garbage")
    with pytest.raises(ValueError, match=re.escape(name)):
        load_model(str(tmp_path))


def test_a_garbage_draft_model_is_a_one_line_error(tmp_path: Path) -> None:
    from hycache.model.eagle import EagleHead

    bad = tmp_path / "draft.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match=r"draft\.safetensors"):
        EagleHead.load(bad, preset_config("tiny"))
