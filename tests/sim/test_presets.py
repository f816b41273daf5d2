"""Presets: packaged numbers, user files, and the error messages for bad files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hycache.sim.presets import (
    gpu_from_dict,
    list_presets,
    load_gpu,
    load_model_spec,
    model_spec_from_dict,
)

MODEL_DIR = Path(__file__).resolve().parents[2] / "hycache" / "sim" / "presets" / "models"


def bamba_dict() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((MODEL_DIR / "bamba-9b.json").read_text())
    return data


def test_list_presets() -> None:
    p = list_presets()
    assert {"h100", "h200", "b200"} <= set(p["gpus"])
    assert {"bamba-9b", "nemotron-h-8b", "tiny"} <= set(p["models"])
    assert {"qwen3-next-80b-a3b", "qwen3.5-35b-a3b"} <= set(p["models"])


def test_gpu_numbers() -> None:
    h100, h200, b200 = load_gpu("h100"), load_gpu("h200"), load_gpu("b200")
    assert h100.peak_flops == h200.peak_flops == 989e12
    assert (h100.hbm_bandwidth, h200.hbm_bandwidth, b200.hbm_bandwidth) == (3.35e12, 4.8e12, 8e12)
    assert b200.peak_flops == 2.25e15
    assert 79 * 2**30 < h100.memory_bytes < 81 * 2**30
    assert 140 * 2**30 < h200.memory_bytes < 142 * 2**30
    assert 178 * 2**30 < b200.memory_bytes < 193 * 2**30
    assert load_gpu("H200") == h200  # names are case-insensitive


def test_bamba_matches_its_published_config() -> None:
    m = load_model_spec("bamba-9b")
    assert (m.num_layers, m.hidden_size, m.vocab_size) == (32, 4096, 128256)
    assert (m.layers.attention, m.layers.mamba) == (3, 29)
    assert m.attention_layer_indices == (9, 18, 27)
    assert (m.attention.num_heads, m.attention.num_kv_heads, m.attention.head_dim) == (32, 8, 128)
    mb = m.mamba
    assert (mb.num_heads, mb.head_dim, mb.d_state, mb.n_groups, mb.d_conv) == (128, 64, 128, 1, 4)
    assert mb.d_inner == mb.expand * m.hidden_size
    assert (m.mlp.intermediate_size, m.mlp.gated, m.mlp.num_blocks) == (14336, True, 32)
    # "9.78B" in the Transformers Bamba docs; the architecture sums to the same.
    assert m.derived_params.total == pytest.approx(9.78e9, rel=0.002)
    assert m.total_params == m.derived_params.total


def test_nemotron_h_matches_its_published_config() -> None:
    m = load_model_spec("nemotron-h-8b")
    assert (m.num_layers, m.hidden_size, m.vocab_size) == (52, 4096, 131072)
    assert (m.layers.attention, m.layers.mamba, m.layers.mlp_only) == (4, 24, 24)
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    assert m.attention_layer_indices == tuple(i for i, c in enumerate(pattern) if c == "*")
    assert (m.mamba.num_heads, m.mamba.head_dim, m.mamba.n_groups) == (128, 64, 8)
    assert (m.mlp.intermediate_size, m.mlp.gated, m.mlp.num_blocks) == (21504, False, 24)
    assert m.derived_params.total == pytest.approx(8.1e9, rel=0.01)
    assert m.total_params == m.derived_params.total


def test_tiny_mirrors_the_engine_model() -> None:
    """The `tiny` preset describes hycache's own tiny model: same geometry, same parameter
    count as the PyTorch module, and the same drafter size as its EAGLE head."""
    pytest.importorskip("torch")
    from hycache.model.bamba import BambaForCausalLM
    from hycache.model.configs.presets import preset_config
    from hycache.model.eagle import EagleHead

    cfg = preset_config("tiny")
    m = load_model_spec("tiny")
    assert (m.vocab_size, m.hidden_size, m.num_layers) == (
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_hidden_layers,
    )
    assert m.attention_layer_indices == tuple(cfg.attn_layer_indices)
    assert (m.attention.num_heads, m.attention.num_kv_heads, m.attention.head_dim) == (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    )
    mb = m.mamba
    assert (mb.num_heads, mb.head_dim, mb.d_state, mb.n_groups, mb.d_conv, mb.chunk_size) == (
        cfg.mamba_n_heads,
        cfg.mamba_d_head,
        cfg.mamba_d_state,
        cfg.mamba_n_groups,
        cfg.mamba_d_conv,
        cfg.mamba_chunk_size,
    )
    assert m.mlp.intermediate_size == cfg.intermediate_size
    assert m.tie_word_embeddings == cfg.tie_word_embeddings
    target = BambaForCausalLM(cfg)
    assert m.total_params == sum(p.numel() for p in target.parameters())
    drafter = EagleHead(cfg)
    assert m.drafter_layer_params == sum(p.numel() for p in drafter.parameters())


def test_drafter_is_one_decoder_layer() -> None:
    m = load_model_spec("bamba-9b")
    h = m.hidden_size
    expected = m.attention_layer_params + 3 * h * 14336 + h + 2 * h * h + h
    assert m.drafter_layer_params == expected
    assert m.drafter_layer_params < m.total_params / 30


def test_user_file_loads_like_the_preset(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(bamba_dict()))
    assert load_model_spec(path) == load_model_spec("bamba-9b")
    assert load_model_spec(str(path)) == load_model_spec("bamba-9b")
    gpu = tmp_path / "gpu.json"
    gpu.write_text(
        json.dumps({"name": "x", "peak_flops": 1e15, "hbm_bandwidth": 2e12, "memory_bytes": 10**11})
    )
    g = load_gpu(gpu)
    assert (g.peak_flops, g.compute_efficiency) == (1e15, None)


def test_unknown_preset_lists_the_available_ones() -> None:
    with pytest.raises(ValueError, match="unknown model preset 'llama'") as e:
        load_model_spec("llama")
    assert "bamba-9b" in str(e.value) and "tiny" in str(e.value)
    with pytest.raises(ValueError, match="h100, h200") as e:
        load_gpu("a100")


def write(tmp_path: Path, data: Any, name: str = "m.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize(
    ("mutate", "field", "what"),
    [
        (lambda d: d.pop("hidden_size"), "hidden_size", "is missing"),
        (lambda d: d["attention"].pop("head_dim"), "attention.head_dim", "is missing"),
        (lambda d: d.update(colour="blue"), "colour", "unknown"),
        (lambda d: d["mamba"].update(dt_rank=1), "mamba.dt_rank", "unknown"),
        (lambda d: d.update(vocab_size=-5), "vocab_size", "must not be negative"),
        (lambda d: d["attention"].update(num_kv_heads=-8), "attention.num_kv_heads", "negative"),
        (lambda d: d.update(hidden_size="4096"), "hidden_size", "must be an integer"),
        (lambda d: d["mlp"].update(gated="yes"), "mlp.gated", "true or false"),
        (lambda d: d["layers"].update(mamba=28), "layers", "sum to 31"),
        (lambda d: d["attention"].update(num_kv_heads=7), "attention.num_kv_heads", "divide"),
        (lambda d: d.update(attention_layer_indices=[1, 2]), "attention_layer_indices", "lists 2"),
        (lambda d: d["params"].update(active=10**11), "params.active", "must not exceed"),
        (lambda d: d.update(mamba=[1]), "mamba", "JSON object"),
    ],
)
def test_bad_model_file_names_the_field_and_file(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], Any], field: str, what: str
) -> None:
    data = bamba_dict()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(ValueError) as e:
        load_model_spec(path)
    msg = str(e.value)
    assert str(path) in msg
    assert f"'{field}'" in msg
    assert what in msg


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "g", "hbm_bandwidth": 1e12, "memory_bytes": 1}, "peak_flops"),
        ({"name": "g", "peak_flops": -1.0, "hbm_bandwidth": 1e12, "memory_bytes": 1}, "peak_flops"),
        (
            {"name": "g", "peak_flops": 1.0, "hbm_bandwidth": 1e12, "memory_bytes": 1, "tdp": 700},
            "tdp",
        ),
        (
            {
                "name": "g",
                "peak_flops": 1.0,
                "hbm_bandwidth": 1e12,
                "memory_bytes": 1,
                "compute_efficiency": 1.5,
            },
            "compute_efficiency",
        ),
    ],
)
def test_bad_gpu_file_names_the_field_and_file(
    tmp_path: Path, data: dict[str, Any], field: str
) -> None:
    path = write(tmp_path, data, "g.json")
    with pytest.raises(ValueError, match=f"{path}.*'{field}'"):
        load_gpu(path)


def test_unreadable_or_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        load_gpu(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=f"{bad}: invalid JSON"):
        load_model_spec(bad)
    top = write(tmp_path, [1, 2], "list.json")
    with pytest.raises(ValueError, match="top level"):
        load_gpu(top)


def test_from_dict_helpers() -> None:
    assert model_spec_from_dict(bamba_dict()) == load_model_spec("bamba-9b")
    with pytest.raises(ValueError, match="<dict>: field 'name' is missing"):
        gpu_from_dict({})
