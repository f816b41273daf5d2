"""Pins every model description's numbers (parameters, bytes) as they were before the model
configs became the one model description: the packaged presets and HF `config.json` dicts of
each architecture must give bit-identical `ModelSpec`s (values computed on the tree before)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from hycache.sim.costmodel import CostModel
from hycache.sim.model_spec import ModelSpec, model_spec_from_hf
from hycache.sim.presets import list_presets, load_gpu, load_model_spec
from tests.helpers import BAMBA_9B, NEMOTRON_MOE

GRANITE_MOE = {
    "model_type": "granitemoehybrid",
    "vocab_size": 96,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "layer_types": ["mamba", "attention", "mamba", "mamba"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "mamba_d_state": 8,
    "shared_intermediate_size": 40,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "intermediate_size": 24,
    "torch_dtype": "float32",
}
HF_DICTS: dict[str, dict[str, Any]] = {
    "hf:nemotron-moe": NEMOTRON_MOE,
    "hf:granite-moe": GRANITE_MOE,
    "hf:bamba-9b": BAMBA_9B,
}
FIELDS = (
    "total_params",
    "active_params",
    "derived_total",
    "derived_active",
    "body_active_params",
    "body_total_params",
    "moe_expert_params",
    "weight_bytes",
    "drafter_layer_params",
    "drafter_weight_bytes",
    "kv_bytes_per_token_per_layer",
    "kv_bytes_per_token",
    "ssm_state_bytes_per_layer",
    "ssm_state_bytes",
    "attention_block_bytes_64",
    "block_bytes_64",
)
PINNED: dict[str, tuple[int, ...]] = {
    "preset:bamba-9b": (
        9780235392,
        9780235392,
        9780235392,
        9780235392,
        8729562240,
        8729562240,
        0,
        19560470784,
        251670528,
        503341056,
        4096,
        12288,
        4244992,
        123104768,
        1048576,
        123104768,
    ),
    "preset:nemotron-h-8b": (
        8100852736,
        8100852736,
        8100852736,
        8100852736,
        7027110912,
        7027110912,
        0,
        16201705472,
        251670528,
        503341056,
        4096,
        16384,
        4255744,
        102137856,
        1310720,
        102137856,
    ),
    "preset:tiny": (
        4878688,
        4878688,
        4878688,
        4878688,
        4616544,
        4616544,
        0,
        9757376,
        721664,
        1443328,
        512,
        1024,
        135680,
        542720,
        98304,
        542720,
    ),
    "hf:nemotron-moe": (
        73560,
        45912,
        73560,
        45912,
        39768,
        67416,
        36864,
        147120,
        8288,
        16576,
        64,
        64,
        2624,
        5248,
        8192,
        8192,
    ),
    "hf:granite-moe": (
        84148,
        65716,
        84148,
        65716,
        59572,
        78004,
        36864,
        336592,
        9056,
        36224,
        128,
        128,
        3008,
        9024,
        16384,
        16384,
    ),
}
# the Gated DeltaNet presets, pinned when they were added (issue #31)
PINNED["preset:qwen3-next-80b-a3b"] = (
    79674292992, 3874831104, 79674292992, 3874831104, 3252501248, 79051963136, 77309411328,
    159348585984, 67115520, 134231040, 2048, 24576, 2146304, 77266944, 1703936, 77266944,
)  # fmt: skip
PINNED["preset:qwen3.5-35b-a3b"] = (
    34660528768, 3454907008, 34660528768, 3454907008, 2437788288, 33643410048, 32212254720,
    69321057536, 35664384, 71328768, 2048, 20480, 2146304, 64389120, 1441792, 64389120,
)  # fmt: skip
PINNED["hf:bamba-9b"] = PINNED["preset:bamba-9b"]  # its config.json: the same numbers
# sha256 of repr(spec): every field of the spec, names and descriptions included
REPR_SHA256 = {
    "preset:bamba-9b": "e09675568cff0417",
    "preset:nemotron-h-8b": "f35dac3a4f268667",
    "preset:tiny": "aa7ce7024bc8d08a",
    "hf:nemotron-moe": "6ccc62e451d1823c",
    "hf:granite-moe": "a215a5f4f01c1eb9",
    "hf:bamba-9b": "e069a28d4d0033ae",
    "preset:qwen3-next-80b-a3b": "06a9e9cc9f410d94",
    "preset:qwen3.5-35b-a3b": "9897cb139fde398e",
}


def _spec(key: str) -> ModelSpec:
    kind, name = key.split(":")
    return load_model_spec(name) if kind == "preset" else model_spec_from_hf(HF_DICTS[key], "x")


def _numbers(m: ModelSpec) -> tuple[int, ...]:
    cost = CostModel(m, load_gpu("h100"), speculative=True, num_speculative_tokens=3, block_size=64)
    values = {
        "total_params": m.total_params,
        "active_params": m.active_params,
        "derived_total": m.derived_params.total,
        "derived_active": m.derived_params.active,
        "body_active_params": m.body_active_params,
        "body_total_params": m.body_total_params,
        "moe_expert_params": m.moe_expert_params,
        "weight_bytes": m.weight_bytes,
        "drafter_layer_params": m.drafter_layer_params,
        "drafter_weight_bytes": m.drafter_weight_bytes,
        "kv_bytes_per_token_per_layer": m.kv_bytes_per_token_per_layer,
        "kv_bytes_per_token": m.kv_bytes_per_token,
        "ssm_state_bytes_per_layer": m.ssm_state_bytes_per_layer,
        "ssm_state_bytes": m.ssm_state_bytes,
        "attention_block_bytes_64": cost.attention_block_bytes(64),
        "block_bytes_64": cost.block_bytes(64),
    }
    return tuple(values[f] for f in FIELDS)


def test_every_packaged_preset_is_pinned() -> None:
    assert {f"preset:{n}" for n in list_presets()["models"]} <= set(PINNED)


@pytest.mark.parametrize("key", sorted(PINNED))
def test_model_spec_numbers_are_unchanged(key: str) -> None:
    spec = _spec(key)
    assert _numbers(spec) == PINNED[key]
    assert hashlib.sha256(repr(spec).encode()).hexdigest()[:16] == REPR_SHA256[key]
